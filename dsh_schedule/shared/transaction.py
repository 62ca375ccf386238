"""The log transaction, written once (docs/architecture.md#management-tools).

Every write to a session log is the same fenced transaction, for one session or a batch:
take the agents' locks, flush and load each log (the preflight), let a *decider* say what
to append, append it fenced at the length the decision read, flush again (the barrier),
re-arm from the latest confirmed fold. A fence conflict is normal, not an error: the
session is flushed, loaded and decided again (``FENCE_ATTEMPTS`` attempts in all). A
re-arm that cannot reach Redis after a durable write is owed (``OwedRearms``) and repaid
once Redis answers (docs/architecture.md#owed-re-arms).

The tools (``host/tools.py``), the due owner (``worker/due.py``) and the delivery gate
(``host/gate.py``) are deciders run here; what differs between them is what they decide
and what they answer, never how the log is written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import msgspec
import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import HeldLock
from dsh_schedule.shared.core.errors import (
    FenceConflict,
    PersistenceError,
    ScheduleError,
)
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.events import Event, NewEvent, Session
from dsh_schedule.shared.core.fold import FoldState, fold_events
from dsh_schedule.shared.logging_setup import add_log_context, log_context
from dsh_schedule.shared.store import many
from dsh_schedule.shared.store.codec import number_events
from dsh_schedule.shared.store.port import SessionStore, append_durably

log = logging.getLogger(__name__)

FENCE_ATTEMPTS: Final = 4

T = TypeVar("T")
R = TypeVar("R")


# -- fencing -------------------------------------------------------------------------------


class FenceRetriesExhausted(ScheduleError):
    """Every attempt of a fenced transaction met a conflicting writer."""

    def __init__(self, what: str, attempts: int) -> None:
        self.what = what
        self.attempts = attempts
        super().__init__(f"{what}: the log kept moving under {attempts} attempts")


def retry_fenced(what: str, attempt: Callable[[int], T], *, attempts: int = FENCE_ATTEMPTS) -> T:
    """Run ``attempt(n)`` for n = 0, 1, … until it returns without ``FenceConflict``.

    Each attempt must re-read and re-decide from scratch: the decision is recomputed, so
    a conflict can never slip a stale decision in.
    """
    for n in range(attempts):
        try:
            return attempt(n)
        except FenceConflict as conflict:
            log.info("%s: fence conflict (%s), re-deciding", what, conflict)
    raise FenceRetriesExhausted(what, attempts)


# -- owed re-arms --------------------------------------------------------------------------


class OwedRearms:
    """The agents one process owes a re-arm, each from a moment on (at once, unless it
    was owed for later: a worker's retry with backoff); thread-safe.

    Remembered in memory by the process that made the durable write; if it dies first,
    what it owed goes with it, and the agent's next lease wakes it instead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[str, int] = {}  # agent: owed from this epoch ms on (0: at once)

    def owe(self, agents: Iterable[str], *, from_ms: int = 0) -> None:
        """Owe each agent a wake from ``from_ms`` on; one owed sooner keeps its moment."""
        with self._lock:
            for agent in agents:
                self._owed[agent] = min(self._owed.get(agent, from_ms), from_ms)

    def owed(self) -> list[str]:
        with self._lock:
            return list(self._owed)

    def repay(self, waker: Coordination, *, now_ms: int | None = None, quietly: bool = False
              ) -> list[str]:
        """Enqueue a wake for every agent owed one (by ``now_ms``, when given; nothing is
        sent when none is); those agents are owed nothing more. A Redis failure keeps
        them owed, and is raised unless ``quietly`` (then left for the next try)."""
        with self._lock:
            agents = [agent for agent, at in self._owed.items()
                      if now_ms is None or at <= now_ms]
        if not agents:
            return []
        try:
            waker.trigger(agents)
        except redis.RedisError:
            if quietly:
                return []
            raise
        with self._lock:
            for agent in agents:
                at = self._owed.get(agent)
                if at is not None and (now_ms is None or at <= now_ms):
                    del self._owed[agent]  # not owed again for later meanwhile
        log.info("woke %d agent(s) whose re-arm had failed", len(agents))
        return agents


# -- what moves through a transaction ------------------------------------------------------


class Read(msgspec.Struct, frozen=True):
    """A session's log as one attempt read it, and its fold."""

    session: Session
    state: FoldState

    @property
    def length(self) -> int:
        """The fence: the log's length this read saw."""
        return len(self.session.events)


@dataclass(frozen=True)
class Decision(Generic[T]):
    """What a decider wants written (``events``; none: nothing to write) and what it
    answers once they are confirmed (``then``, given the fold after them).
    ``subject``: the schedule the write is about, carried by a failed barrier."""

    events: tuple[NewEvent, ...]
    then: Callable[[FoldState], T]
    subject: str | None = None


class PersistenceUncertain(ScheduleError):
    """A flush or write failed: the decision's write may or may not be durable.
    ``subject`` is set once the write was made and only its barrier failed."""

    def __init__(self, subject: str | None = None) -> None:
        super().__init__("the session log could not confirm the write")
        self.subject = subject


def _only(results: dict[str, R | Exception], agent: str) -> R:
    """The agent's result of a batch of one, or what failed for it, raised."""
    result = results[agent]
    if isinstance(result, Exception):
        raise result
    return result


# -- the engine ----------------------------------------------------------------------------


def either_outcome(read: Read, events: Sequence[NewEvent], now_ms: int) -> FoldState:
    """What to re-arm from when an append's outcome is unknown (a reply lost after the
    write, a failed barrier): of the fold without the events and the fold with them, the
    one whose wake comes first. The wake re-reads the log, so it is early at worst; armed
    from the fold without them, a create that did land would never be woken for
    (docs/architecture.md#outages)."""
    try:
        landed = fold_events(read.state, number_events(events, read.length))
    except ScheduleError:
        return read.state

    def wake_ms(state: FoldState) -> float:
        at = next_wake_ms(state, now_ms)
        return float("inf") if at is None else at

    return min((read.state, landed), key=wake_ms)


class LogTransactions:
    """The fenced transactions on the session logs of ``store``, coordinated by ``coord``.

    ``watch`` is told each re-arm's fold (a host's watchdog keeps the agent's next due
    moment); ``owed`` holds the re-arms Redis failed."""

    def __init__(
        self, store: SessionStore, coord: Coordination, clock: Clock, *,
        owed: OwedRearms | None = None,
        watch: Callable[[str, FoldState], None] | None = None,
    ) -> None:
        self._store = store
        self._coord = coord
        self._clock = clock
        self._watch = watch
        self.owed = OwedRearms() if owed is None else owed

    # locks

    @contextmanager
    def hold(self, agent: str, *, wait_s: float) -> Iterator[HeldLock]:
        """The agent's lock for the block (``LockUnavailable`` after ``wait_s``)."""
        with self._coord.locks.hold(agent, wait_s=wait_s) as held:
            yield held

    def each_held(
        self, agents: Sequence[str], work: Callable[[list[str]], R], *, wait_s: float,
        released: Callable[[R], None] | None = None,
    ) -> list[str]:
        """``work`` on the agents with their locks held: the free ones together, then
        each busy one alone (``AgentLocks.each_held``); returns those still busy."""
        return self._coord.locks.each_held(agents, work, wait_s=wait_s, released=released)

    # preflight, append, barrier

    def flush(self, agents: Sequence[str]) -> dict[str, PersistenceError]:
        """Flush the agents' logs together (the preflight before a read, the barrier after
        a write); the failures, by agent. A failed preflight stops its agent: a flush that
        succeeds after a failed one does not prove the earlier bytes durable."""
        return many.flush(self._store, agents)

    def preflight(self, agents: Sequence[str]) -> dict[str, Read | Exception]:
        """Flush the agents' logs together, then load each: its ``Read``, or what failed
        (the flush's or the load's ``PersistenceError``, a ``ScheduleLogError``, any
        other error of that agent alone). ``redis.RedisError`` is raised."""
        unflushed = self.flush(agents)
        reads: dict[str, Read | Exception] = dict(unflushed)
        reads.update(self.load([agent for agent in agents if agent not in unflushed]))
        return {agent: reads[agent] for agent in agents}

    def load(self, agents: Sequence[str]) -> dict[str, Read | Exception]:
        """Each agent's log as this process sees it, unflushed, in one round trip where
        the store can (``many.load``): its ``Read``, or what its load raised."""
        return {agent: Read(*loaded) if isinstance(loaded, tuple) else loaded
                for agent, loaded in many.load(self._store, agents).items()}

    def append(self, items: Sequence[tuple[str, Read, Sequence[NewEvent]]]
               ) -> dict[str, tuple[Event, ...] | Exception]:
        """Append each agent's (distinct) events fenced at the length its read saw, in
        one round trip where the store can (``many.append``): the events
        appended, or what the append raised (``FenceConflict`` when another writer came
        between)."""
        return many.append(self._store, [(agent, list(events), read.length)
                                        for agent, read, events in items])

    def fenced(
        self, agent: str, decide: Callable[[Read], Sequence[NewEvent] | None], *,
        what: str, flush: Callable[[int], bool], first: Read | None = None,
        durably: bool = False,
    ) -> tuple[Read, tuple[Event, ...], PersistenceError | None] | None:
        """Read, decide, append fenced, with the retry: the read the append was fenced at,
        the events appended and the barrier's failure (None: durable, or no barrier);
        None when the decision writes nothing. ``flush(n)``: whether attempt ``n``
        flushes before it reads (a retry does, to confirm the conflicting writer's
        suffix). ``first``: the first attempt's read, when the caller has one (read with
        others under their locks: the fence checks it). ``durably``: the append and that
        agent's barrier are one write where the store can (``port.append_durably``);
        without it the caller runs the barrier."""

        def attempt(n: int) -> tuple[Read, tuple[Event, ...], PersistenceError | None] | None:
            if flush(n):
                self._store.flush(agent)
            read = first if n == 0 and first is not None else _only(self.load([agent]), agent)
            events = decide(read)
            if events is None:
                return None
            if durably:
                return read, *append_durably(self._store, agent, list(events), read.length)
            return read, _only(self.append([(agent, read, events)]), agent), None

        return retry_fenced(what, attempt)

    # the whole transaction on one agent

    def transact(
        self, agent: str, decide: Callable[[Read, int], Decision[T]], *, what: str,
        wait_s: float,
    ) -> T:
        """One agent's transaction: its lock, then (each fence conflict starting again)
        the preflight, ``decide(read, now)``, the fenced append of its events and the
        barrier, and last the re-arm from the latest confirmed fold (none when its wake
        was armed before the write), the lock released in the re-arm's own write. A failed flush or write is ``PersistenceUncertain``.
        Once the decision has answered, nothing that fails while finishing (the re-arm,
        the lock's release) changes the answer (docs/architecture.md#outages)."""
        # The latest confirmed fold, what the re-arm uses, and the target armed for it
        # before the write (``_arm_ahead``; None: none).
        latest: list[tuple[FoldState, int | None]] = []

        def attempt(_n: int) -> T:
            # A block of its own: the schedule id it adds to the log context ends with
            # the attempt, whether or not the caller opened a block (a gate may not have).
            with log_context():
                return self._decide_and_append(agent, decide, latest)

        with self.hold(agent, wait_s=wait_s) as held:
            try:
                return retry_fenced(what, attempt)
            finally:
                if latest:
                    self.rearm(agent, *latest[-1], release=held)

    def _decide_and_append(
        self, agent: str, decide: Callable[[Read, int], Decision[T]],
        latest: list[tuple[FoldState, int | None]],
    ) -> T:
        try:
            self._store.flush(agent)
            read = _only(self.load([agent]), agent)
        except PersistenceError as exc:
            log.warning("preflight failed for %s: %s", agent, exc.reason)
            raise PersistenceUncertain() from None
        latest.append((read.state, None))
        now_ms = self._clock()
        decision = decide(read, now_ms)
        if not decision.events:
            return decision.then(read.state)
        if decision.subject is not None:
            add_log_context(schedule_id=decision.subject)
        armed_ms = self._arm_ahead(agent, read, decision.events, now_ms)
        try:  # the append and the barrier, one write where the store can
            appended, unconfirmed = append_durably(self._store, agent, list(decision.events),
                                                   read.length)
        except PersistenceError as exc:
            log.warning("append failed for %s: %s", agent, exc.reason)
            latest.append((either_outcome(read, decision.events, now_ms), None))
            raise PersistenceUncertain() from None
        if unconfirmed is not None:
            log.warning("barrier failed for %s: %s", agent, unconfirmed.reason)
            latest.append((either_outcome(read, decision.events, now_ms), None))
            raise PersistenceUncertain(decision.subject) from None
        after = fold_events(read.state, appended)
        latest.append((after, armed_ms))
        return decision.then(after)

    # re-arm

    def _arm_ahead(self, agent: str, read: Read, events: Sequence[NewEvent],
                   now_ms: int) -> int | None:
        """Before a write that can make the agent's wake earlier (a create, an update),
        arm the wake it may need: the earlier of the folds without and with the events
        (``either_outcome``). A re-arm that fails after the append, or a process that
        dies owing it (a one-shot ``call``), then leaves that wake in place; a write that
        fails leaves a wake that finds nothing, one read. ``redis.RedisError`` is raised:
        nothing is written then (docs/architecture.md#owed-re-arms). The target armed,
        or None when no wake was (nothing earlier; the agent not live; its lock gone):
        the re-arm after the write then runs."""
        ahead = either_outcome(read, events, now_ms)
        if ahead is read.state:
            return None
        [armed] = self._coord.rearm([(agent, ahead)], now_ms)
        return None if armed is None else next_wake_ms(ahead, now_ms)

    def rearm(self, agent: str, state: FoldState, armed_ms: int | None = None, *,
              release: HeldLock) -> None:
        """Re-arm from ``state``, releasing the lock in the re-arm's own write, unless the
        wake is already at its target (``armed_ms``, armed before the write: ``hold``
        releases the lock); a failure is logged, never raised, and the re-arm is owed."""
        if self._watch is not None:
            self._watch(agent, state)
        now_ms = self._clock()
        if armed_ms is not None and next_wake_ms(state, now_ms) == armed_ms:
            return
        try:
            self._coord.rearm([(agent, state)], now_ms, release=release)
        except redis.RedisError as exc:
            metrics.get().redis_error()
            self.owed.owe([agent])
            log.warning("re-arm for %s failed (%s); it is woken once Redis answers",
                        agent, type(exc).__name__)
        except Exception:
            self.owed.owe([agent])
            log.exception("re-arm for %s failed; it is woken again", agent)

    def repay_owed(self, *, quietly: bool = False, now_ms: int | None = None) -> list[str]:
        """Wake every agent owed a re-arm (by ``now_ms``, when given): nothing is sent
        when none is. ``redis.RedisError`` keeps them owed, and is raised unless
        ``quietly``."""
        return self.owed.repay(self._coord, now_ms=now_ms, quietly=quietly)
