"""The due transaction: a wake's work (docs/architecture.md#the-due-transaction), performed
for a batch of wakes at once (docs/architecture.md#batched-due-transactions); a single wake
is a batch of one.

Every step is a named method that fills in the ``WakeOutcome`` of each agent it stops and
hands the others on to the next step; each agent is decided, fenced and flushed on its
own, while the batch shares its round trips to Redis. This module finds who is due and
settles the rest; ``dispatch`` dispatches for those found due. The log stays the authority:
followups are written before the fenced dispatch append, so a crash can only leave an
entry without a dispatch (the host drops it) or a dispatch without an entry
(re-projection re-adds it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.core.due import Wait, due_decision
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Session
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.ledger import LedgerCache
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.flushing import flush_each
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.dispatch import Dispatcher
from dsh_schedule.worker.outcome import WakeOutcome as WakeOutcome
from dsh_schedule.worker.reproject import reproject_many

log = logging.getLogger(__name__)

MAX_ROUNDS: Final = 64


class DueOwner:
    """Performs due transactions for agents whose sessions live in ``store``."""

    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        settings: Settings,
        *,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._coord = coordination
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._ledgers = LedgerCache()
        self._dispatcher = Dispatcher(store, coordination, settings, clock=clock)

    def wake(self, agent: str, target_ms: int | None) -> WakeOutcome:
        """Handle one wake (a batch of one): stale and duplicate wakes find nothing due
        and return.

        Lines logged meanwhile carry the agent; the wake's outcome and duration are
        recorded in the metrics (docs/architecture.md#operations)."""
        with log_context(agent=agent):
            return self.wake_many([(agent, target_ms)])[agent]

    def _sleep_out_skew(self, agent: str, target_ms: int) -> None:
        """Sleep out a scheduled wake that arrives less than ``early_sleep_s`` before its
        target by this worker's clock; one further away goes on, finds nothing due and
        re-arms.

        The mover hands a wake on only once its exact target has come on the scheduler's
        clock (docs/architecture.md#wake-projection), so while the clocks agree this never
        sleeps. It is there for clock skew between the scheduler's machine and this one:
        without it, an early wake would re-arm a target the mover already counts as due
        and come back on every mover pass until the clocks agree. It is never what keeps a
        dispatch from being early: the due decision re-reads the clock under the lock.
        """
        early_ms = target_ms - self._clock()
        if 0 < early_ms < self._settings.early_sleep_s * 1000:
            log.debug("wake for %s arrived %d ms early by this clock: sleeping it out",
                      agent, early_ms)
            self._sleep(early_ms / 1000)

    def wake_batch(self, agents: Sequence[str]) -> dict[str, WakeOutcome]:
        """Immediate wakes for many agents (a rebuild's batch): ``wake_many`` with no
        targets."""
        return self.wake_many([(agent, None) for agent in agents])

    def wake_many(
        self, wakes: Sequence[tuple[str, int | None]]
    ) -> dict[str, WakeOutcome]:
        """Many wakes as one batched due transaction
        (docs/architecture.md#batched-due-transactions).

        Each agent is decided exactly as ``wake`` decides it, under its own lock and
        phase, after its own preflight, with its own fenced append and barrier; what the
        batch shares are the round trips to Redis (liveness, locks, phase claims and
        releases, followup writes, re-arms: one pipelined call each, whatever the batch's
        size). An agent whose lock is busy is then woken alone, waiting for its lock as
        ``wake`` does. The first wake of an agent named twice counts.
        """
        targets: dict[str, int | None] = {}
        for agent, target_ms in wakes:
            targets.setdefault(agent, target_ms)
        recorder = metrics.get()
        started = time.perf_counter()
        try:
            outcomes = self._wake_many(targets)
        except redis.RedisError as exc:
            # The records stay active; a new lease or the reconcile pass wakes them.
            recorder.redis_error()
            log.warning("wake batch of %d: Redis unavailable (%s)", len(targets),
                        type(exc).__name__)
            outcomes = dict.fromkeys(targets, WakeOutcome.REDIS_UNAVAILABLE)
        elapsed = time.perf_counter() - started
        for outcome in outcomes.values():
            recorder.due_transaction(elapsed)  # each agent's transaction took the batch's
            recorder.wake(outcome.value)
        return {agent: outcomes[agent] for agent in targets}

    def _wake_many(self, targets: dict[str, int | None]) -> dict[str, WakeOutcome]:
        live = set(self._coord.leases.live_among(list(targets), now_ms=self._clock()))
        outcomes = {agent: WakeOutcome.NOT_LIVE for agent in targets if agent not in live}
        for agent in outcomes:
            log.debug("wake for %s: not live", agent)
        order = [agent for agent in targets if agent in live]
        timed = [(target, agent) for agent in order if (target := targets[agent]) is not None]
        if timed:
            latest, agent = max(timed)
            self._sleep_out_skew(agent, latest)
        with self._coord.locks.hold_many(order) as held:
            busy = [agent for agent in order if agent not in held]
            settled, dispatched = self._rounds_many(
                [agent for agent in order if agent in held], outcomes)
            self._coord.rearm_many(settled, self._clock())
        self._announce(dispatched)
        for agent in busy:  # its lock is busy: wait for it, then decide it alone
            with log_context(agent=agent):
                try:
                    with self._coord.locks.hold(agent, wait_s=self._settings.wake_lock_wait_s):
                        settled, dispatched = self._rounds_many([agent], outcomes)
                        self._coord.rearm_many(settled, self._clock())
                    self._announce(dispatched)
                except LockUnavailable:
                    log.debug("wake for %s: lock busy, the holder re-arms", agent)
                    outcomes[agent] = WakeOutcome.LOCK_BUSY
        return outcomes

    def _announce(self, agents: Sequence[str]) -> None:
        """Announce to their hosts the agents with followups to deliver, now that the
        transaction has let them go: a host told earlier would find the agent still held
        and come back a second later. A lost announcement costs time, never a reminder:
        the entry waits in its stream, the agent's next wake announces it again (it has
        an undelivered dispatch), and so does a re-arm once the entry is stale."""
        try:
            self._coord.followups.announce_many(agents)
        except redis.RedisError as exc:
            metrics.get().redis_error()
            log.warning("%d dispatched agent(s) not announced (%s); their followups wait "
                        "in their streams", len(agents), type(exc).__name__)

    def _rounds_many(
        self, agents: Sequence[str], outcomes: dict[str, WakeOutcome]
    ) -> tuple[list[tuple[str, FoldState]], list[str]]:
        """Dispatch until nothing is due, for many agents at once, a round at a time: each
        round checks every agent still pending and dispatches, together, for those that
        are due. An agent that has just dispatched and passed its barrier is checked on
        this worker's own view of its log (``_after_dispatch``). Fills in ``outcomes``;
        returns the settled folds to arm from, and the agents to announce once let go
        (``_to_announce``)."""
        settled: list[tuple[str, FoldState]] = []
        pending: list[str] = list(agents)
        dispatched: list[str] = []
        announce: list[str] = []  # the agents a host is to be told of, once let go
        for _ in range(MAX_ROUNDS):
            announce.extend(dispatched)
            if not pending and not dispatched:
                return settled, self._to_announce(agents, announce, outcomes)
            due: list[str] = []
            checked = self._check_many(pending, announce)
            checked.update(self._after_dispatch(dispatched, announce))
            for agent, found in checked.items():
                if found is None:
                    due.append(agent)
                elif isinstance(found, WakeOutcome):
                    outcomes[agent] = found
                else:
                    settled.append((agent, found))
                    outcomes[agent] = WakeOutcome.SETTLED
            pending, dispatched = self._dispatcher.dispatch_many(due, outcomes)
        announce.extend(dispatched)
        for agent in [*pending, *dispatched]:
            log.warning("wake for %s: still due after %d rounds", agent, MAX_ROUNDS)
            outcomes[agent] = WakeOutcome.STILL_DUE
        return settled, self._to_announce(agents, announce, outcomes)

    @staticmethod
    def _to_announce(agents: Sequence[str], found: list[str],
                     outcomes: dict[str, WakeOutcome]) -> list[str]:
        """The agents whose followups a host is to learn of: ``found`` (those that
        dispatched or were found with an undelivered dispatch), and those whose dispatch
        is appended but whose barrier failed (the host's own flush confirms it before
        delivering); each once."""
        failed = [agent for agent in agents
                  if outcomes.get(agent) is WakeOutcome.BARRIER_FAILED]
        return list(dict.fromkeys([*found, *failed]))

    def _after_dispatch(
        self, agents: Sequence[str], announce: list[str]
    ) -> dict[str, FoldState | WakeOutcome | None]:
        """The check after a dispatch whose barrier flush just succeeded, the agent's lock
        still held: its fold as this worker now reads it (None when a dispatch is due
        again). No second preflight flush and no re-projection: the barrier confirmed
        this worker's bytes, the followups were written just before them, and only
        ``schedule/change`` records, appended under the lock this worker holds, change
        the decision. An agent whose log cannot be read now gets the full check."""
        checked: dict[str, FoldState | WakeOutcome | None] = {}
        unread: list[str] = []
        for agent in agents:
            try:
                _session, state = self._store.load(agent)
            except (PersistenceError, ScheduleLogError):
                unread.append(agent)
                continue
            due = not isinstance(due_decision(state, self._clock()), Wait)
            checked[agent] = None if due else state
        checked.update(self._check_many(unread, announce))
        return checked

    def _check_many(
        self, agents: Sequence[str], announce: list[str]
    ) -> dict[str, FoldState | WakeOutcome | None]:
        """Preflight, re-project and decide for each agent: its settled fold when nothing
        is due, the outcome that stops its wake, or None when a dispatch is due now. The
        flushes run together, and the re-projections are read and written together.
        Agents with an undelivered dispatch go on ``announce``."""
        checked: dict[str, FoldState | WakeOutcome | None] = {}
        if not agents:
            return checked
        loaded: list[tuple[str, Session, FoldState]] = []
        # The preflights' flushes, together. A failed one stops its agent: a flush that
        # succeeds after a failed one does not prove the earlier bytes durable.
        unflushed = flush_each(self._store, agents)
        for agent in agents:
            with log_context(agent=agent):
                try:
                    found = self._preflight(agent, unflushed.get(agent))
                    if not isinstance(found, WakeOutcome):
                        self._ledgers.ledger(agent, found[0])  # a corrupt one stops here
                except ScheduleLogError as exc:
                    log.error("cannot re-project followups for %s: %s", agent, exc)
                    found = WakeOutcome.CORRUPT_LOG
                except redis.RedisError:
                    raise  # every other agent of the batch needs Redis too
                except Exception:
                    log.exception("wake for %s failed", agent)  # spares the rest
                    found = WakeOutcome.FAILED
            if isinstance(found, WakeOutcome):
                checked[agent] = found
            else:
                loaded.append((agent, *found))
        added, undelivered = reproject_many(
            self._coord.followups, [(agent, session) for agent, session, _ in loaded],
            self._ledgers)
        announce.extend(undelivered)
        now = self._clock()
        for agent, _session, state in loaded:
            if added[agent]:
                metrics.get().delivery("reprojected", added[agent])
                log.info("re-projected %d lost followup(s) for %s", added[agent], agent)
            checked[agent] = state if isinstance(due_decision(state, now), Wait) else None
        return checked

    def _preflight(
        self, agent: str, flush_failure: PersistenceError | None
    ) -> tuple[Session, FoldState] | WakeOutcome:
        """The fold of the flushed log (``flush_failure``: how its flush failed)."""
        try:
            if flush_failure is not None:
                raise flush_failure
            return self._store.load(agent)
        except PersistenceError as exc:
            log.warning("due preflight for %s failed: %s", agent, exc.reason)
            return WakeOutcome.PREFLIGHT_FAILED
        except ScheduleLogError as exc:
            log.error("corrupt schedule log for %s, arming nothing: %s", agent, exc)
            return WakeOutcome.CORRUPT_LOG
