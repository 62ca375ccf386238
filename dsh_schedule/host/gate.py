"""The followup delivery gate, which a ``HostBridge`` holds
(docs/architecture.md#hosts-followups-and-rebuild).

An entry is delivered into the session only when the log holds a dispatch for each of its
reminders and no delivered message covers them, else dropped; either way it is
acknowledged once the log that decided it is durable, so each dispatch is delivered
exactly once (docs/decisions.md#a-delivery-is-acknowledged-once-durable). A round that a
Redis outage interrupts after it delivered answers with what it delivered
(docs/architecture.md#outages). With metrics on, each decision is counted, and a
delivered message's lateness observed at the stage ``session``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Final

import msgspec
import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.clock import LIVE_SLACK_MS
from dsh_schedule.shared.coordination.followups import READ_COUNT, FollowupEntry, Pair, StreamRead
from dsh_schedule.shared.coordination.outage import is_outage
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, disk_outage_errno
from dsh_schedule.shared.core.events import TURN_START, USER_MESSAGE, Event, NewEvent
from dsh_schedule.shared.core.ledger import ledger_of, reminder_source
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import LogTransactions, Read

log = logging.getLogger(__name__)

# A delivery that failed on anything but an outage (a line past the log's bound, a corrupt
# log, a bug) waits ``followup_stale_s`` before its next try, doubling with each failure in
# a row up to this; only the first failure in a row is logged. Its stream is not read
# meanwhile (a followup can be tens of MiB).
DELIVERY_RETRY_MAX_S: Final = 300.0


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """A followup delivered into the session as the user/message of a new turn."""

    text: str
    pairs: tuple[Pair, ...]
    turn: int
    events: tuple[Event, ...]


class DeliveryRound(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``deliver_many`` did, agent by agent.

    ``delivered``: the agents given a followup now (at most one each); ``again``: the
    agents that decided entries (delivered or dropped) and may have more; ``empty``:
    nothing for this consumer to read now (another consumer may hold an entry: look at
    them alone); ``busy``: their lock was held, or Redis failed before their turn came;
    ``failed``: their delivery failed (logged once; their entries stay unacknowledged),
    now or before, and they wait out a backoff (``DELIVERY_RETRY_MAX_S``);
    ``unwritable``: the disk under their session could not take the write or flush
    (full, read-only: ``disk_outage_errno``), by agent: nothing delivered, not logged
    (the host says it once), their entries stay."""

    delivered: dict[str, Delivery]
    again: tuple[str, ...]
    empty: tuple[str, ...]
    busy: tuple[str, ...]
    failed: tuple[str, ...]
    unwritable: dict[str, PersistenceError] = msgspec.field(default_factory=dict)


class _FailedDeliveries:
    """The agents whose last delivery failed, and until when each waits; thread-safe."""

    def __init__(self, clock: Clock, first_s: float) -> None:
        self._clock = clock
        self._first_ms = max(int(first_s * 1000), 1)
        self._lock = threading.Lock()
        self._failed: dict[str, tuple[int, int]] = {}  # agent: (failures in a row, until)

    def waiting(self, agent: str) -> bool:
        """Whether the agent is still waiting out its backoff."""
        with self._lock:
            failed = self._failed.get(agent)
        return failed is not None and self._clock() < failed[1]

    def failed(self, agent: str) -> int:
        """Count one more failure in a row and start its backoff; returns the count."""
        with self._lock:
            failures = self._failed.get(agent, (0, 0))[0] + 1
            delay_ms = min(self._first_ms * 2 ** min(failures - 1, 32),
                           int(DELIVERY_RETRY_MAX_S * 1000))
            self._failed[agent] = (failures, self._clock() + delay_ms)
        return failures

    def ended(self, agent: str) -> None:
        """The agent's delivery went through (or its entry was dropped)."""
        with self._lock:
            failed = self._failed.pop(agent, None)
        if failed is not None:
            log.info("delivery for %s went through after %d failed tries", agent, failed[0])


def _log_failure(agent: str, failures: int) -> None:
    """One line for a run of failed deliveries: the first, with its traceback."""
    if failures == 1:
        with log_context(agent=agent):
            log.exception("delivering followups for %s failed; retried with backoff", agent)
    else:
        log.debug("delivering followups for %s failed again (%d in a row)", agent, failures)


class _Decided:
    """What a ``deliver_many`` round decided so far."""

    def __init__(self) -> None:
        self.delivered: dict[str, Delivery] = {}
        # (agent, entry id) to acknowledge, in order: a delivery's entry is its agent's last
        self.entries: list[tuple[str, str]] = []
        self.again: list[str] = []
        self.busy: list[str] = []
        self.failed: list[str] = []
        self.unwritable: dict[str, PersistenceError] = {}
        self.looked: list[str] = []  # the agents whose entries were looked at, locked
        self.outage: redis.RedisError | None = None  # what interrupted the round


class DeliveryGate:
    """Delivers one host consumer's followups into their sessions; ``HostBridge`` offers
    ``has_followup``, ``deliver_next`` and ``deliver_many`` through it."""

    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        settings: Settings,
        *,
        clock: Clock,
        consumer: str,
    ) -> None:
        self._coord = coordination
        self._settings = settings
        self._clock = clock
        self._consumer = consumer
        self._failures = _FailedDeliveries(clock, settings.followup_stale_s)
        self._tx = LogTransactions(store, coordination, clock)

    def has_followup(self, agent: str) -> bool:
        """Whether this host can take one of the agent's followups now (``_entries``).
        Needs no turn: a host asks before claiming one, so an entry another host still
        holds costs it no turn. An agent whose delivery failed has none until its backoff
        ends."""
        return not self._failures.waiting(agent) and bool(self._entries(agent, count=1))

    def _entries(self, agent: str, *, count: int = READ_COUNT) -> list[FollowupEntry]:
        """The agent's entries this consumer read and has not acknowledged, else new ones
        (read now), else ones another consumer left unacknowledged for
        ``followup_stale_s`` (taken over now)."""
        followups = self._coord.followups
        return followups.read(agent, self._consumer, count=count) or followups.claim_stale(
            agent, self._consumer, min_idle_ms=self._coord.followup_stale_ms)

    def deliver_next(self, agent: str) -> Delivery | None:
        """Deliver the next deliverable followup, dropping the others; hold the turn phase.

        Appends ``turn/start`` and the reminder ``user/message`` of a new turn; the host
        runs that turn and appends the rest of it. None once nothing this host can take
        is left (entries it dropped do not hide later ones), or while a failed delivery
        waits out its backoff; a failure (other than an outage) starts that backoff and is
        raised.
        """
        if self._failures.waiting(agent):
            return None
        followups = self._coord.followups
        while entries := self._entries(agent):
            for entry in entries:
                try:
                    with self._tx.hold(agent, wait_s=self._settings.tool_lock_wait_s):
                        delivery, unconfirmed = self._gate_held(agent, entry, own_flushes=True)
                except Exception as exc:
                    if not is_outage(exc) and not (
                            isinstance(exc, PersistenceError) and disk_outage_errno(exc)):
                        self._failures.failed(agent)  # the caller logs it
                    raise
                self._failures.ended(agent)
                if unconfirmed is not None:
                    # The turn runs; the entry waits, unacknowledged, for its next gate
                    # after a backoff (the store is failing now).
                    _unconfirmed(agent, unconfirmed)
                    self._failures.failed(agent)
                    return delivery
                try:
                    followups.done([(agent, entry.entry_id)])
                except redis.RedisError as exc:
                    if delivery is None or not is_outage(exc):
                        raise
                    # Delivered: the turn must run. The next read's gate drops the entry.
                    log.info("followup %s for %s delivered, not acknowledged (%s)",
                             entry.entry_id, agent, type(exc).__name__)
                if delivery is not None:
                    return delivery
        return None

    def deliver_many(self, agents: Sequence[str]) -> DeliveryRound:
        """``deliver_next`` for many agents whose turns the caller holds, at most one
        delivery each, the round trips shared: streams read, free locks taken, first
        appends written (where the store can), barriers flushed and entries acknowledged
        together, each entry still gated under its agent's lock and fenced at its log's
        length; an agent whose lock was busy is then served alone, waiting for its lock
        (``LogTransactions.each_held``). Call again with ``again`` until it is empty."""
        waiting = [agent for agent in agents if self._failures.waiting(agent)]
        agents = [agent for agent in agents if agent not in waiting]
        reads = self._coord.followups.read_streams(agents, self._consumer)
        read = {agent: found.entries for agent, found in reads.items()}
        with_entries = [agent for agent, entries in read.items() if entries]
        decided = _Decided()
        decided.failed.extend(waiting)  # a failed delivery waiting out its backoff
        try:
            decided.busy = self._tx.each_held(
                with_entries, lambda held: self._decide_held(held, reads, decided),
                wait_s=self._settings.tool_lock_wait_s)
        except redis.RedisError as exc:  # an outage (``_decide`` raises no other)
            decided.outage = exc
            decided.busy = [agent for agent in with_entries if agent not in decided.looked]
        try:
            self._coord.followups.done(decided.entries)
        except redis.RedisError as exc:
            if not is_outage(exc):
                raise
            decided.outage = decided.outage or exc
        if decided.outage is not None and not decided.delivered:
            raise decided.outage  # nothing delivered: nothing to answer but the outage
        return DeliveryRound(
            delivered=decided.delivered, again=tuple(decided.again),
            empty=tuple(agent for agent, entries in read.items() if not entries),
            busy=tuple(decided.busy), failed=tuple(decided.failed),
            unwritable=decided.unwritable,
        )

    def _decide_held(self, agents: list[str], reads: dict[str, StreamRead],
                     decided: _Decided) -> None:
        """Gate the entries of ``agents``, whose locks the caller holds, with the round's
        flushes together: the preflights first (``LogTransactions.flush``), so
        each gate's own flush finds nothing left to do, and the deliveries' barriers after."""
        decided.looked.extend(agents)
        unflushed = self._tx.flush(agents)
        # The logs read together, each its gate's first read (its fence checks it); one
        # that could not be read is read again by its gate.
        logs = self._tx.load([agent for agent in agents if agent not in unflushed])
        ready: list[tuple[str, Read, tuple[NewEvent, ...]]] = []
        for agent in agents:
            first = logs.get(agent)
            if agent in unflushed and disk_outage_errno(unflushed[agent]):
                decided.unwritable[agent] = unflushed[agent]
            elif agent in unflushed:
                log.warning("delivery preflight for %s failed: %s", agent,
                            unflushed[agent].reason)
                decided.failed.append(agent)
            elif isinstance(first, Read) and deliverable(reads[agent].entries[0], first):
                # A first entry to deliver (a burst's): its append joins the round's one
                # write, and its gate takes what that write did.
                ready.append((agent, first, delivery_events(reads[agent].entries[0], first,
                                                            self._clock())))
            else:
                self._decide(agent, reads[agent], decided,
                             first if isinstance(first, Read) else None)
        appended = self._tx.append(ready)
        for agent, first, _events in ready:
            self._decide(agent, reads[agent], decided, first, written=appended[agent])
        delivered = [agent for agent in agents if agent in decided.delivered]
        for agent, exc in self._tx.flush(delivered).items():
            _unconfirmed(agent, exc)
            # The turn runs; the entry that delivered it (the agent's last decided) stays
            # unacknowledged for its next gate, after a backoff (the store is failing now).
            last = max(i for i, (held, _) in enumerate(decided.entries) if held == agent)
            del decided.entries[last]
            if agent in decided.again:
                decided.again.remove(agent)
            self._failures.failed(agent)
            decided.failed.append(agent)

    def _decide(self, agent: str, read: StreamRead, decided: _Decided,
                first: Read | None, *, written: tuple[Event, ...] | Exception | None = None
                ) -> None:
        """Gate the entries ``read`` found, in order, until one is delivered, noting what
        was decided; the caller holds the agent's lock and flushes before and after.
        ``first``, ``written``: for the first entry, as ``_gate_held`` takes them."""
        left = len(read.entries)
        try:
            for entry in read.entries:
                # No barrier is run without own_flushes: the caller runs the round's.
                delivery, _ = self._gate_held(agent, entry, own_flushes=False, first=first,
                                              written=written)
                first, written = None, None  # the next entry's gate reads the log itself
                self._failures.ended(agent)
                decided.entries.append((agent, entry.entry_id))
                left -= 1
                if delivery is not None:
                    decided.delivered[agent] = delivery
                    break
        except Exception as exc:
            if is_outage(exc):
                raise
            if isinstance(exc, PersistenceError) and disk_outage_errno(exc):
                decided.unwritable[agent] = exc  # the host says it once, for every agent
                return
            _log_failure(agent, self._failures.failed(agent))
            decided.failed.append(agent)
            return
        if left or not read.drained:
            # More entries may wait. A stream the read emptied needs no second look: an
            # entry added since is announced on the ready stream again.
            decided.again.append(agent)

    def _gate_held(
        self, agent: str, entry: FollowupEntry, *, own_flushes: bool,
        first: Read | None = None, written: tuple[Event, ...] | Exception | None = None,
    ) -> tuple[Delivery | None, PersistenceError | None]:
        """The gate for one entry, the agent's lock held: the entry appended as the
        user/message of a new turn if the log says it is due for delivery (None: dropped),
        and the failure of its barrier flush (None: durable, or none run). ``own_flushes``:
        flush before deciding, and run the barrier in the append's own write
        (``append_durably``); without it the caller does both, for many agents at once.
        ``written``: what the caller's append of the delivery, fenced at ``first`` (the
        log as it read it), did (the events, or what it raised; a fence conflict
        re-decides)."""

        def decide(read: Read) -> tuple[NewEvent, ...] | None:
            if not deliverable(entry, read):
                log.info("dropping followup %s for %s", entry.entry_id, agent)
                return None
            return delivery_events(entry, read, self._clock())

        schedule_ids = ",".join(pair.scheduleId for pair in entry.pairs)
        with log_context(agent=agent, schedule_id=schedule_ids):
            if first is None or written is None or isinstance(written, FenceConflict):
                # A caller that flushes has flushed already; a retry (or a write of the
                # caller's that met another writer) flushes anew, to confirm that
                # writer's suffix.
                conflicted = written is not None
                result = self._tx.fenced(
                    agent, decide, what=f"delivery for {agent}",
                    flush=lambda n: own_flushes or conflicted or n > 0,
                    first=None if conflicted else first, durably=own_flushes)
            elif isinstance(written, Exception):
                raise written
            else:
                result = first, written, None
            if result is not None:
                log.info("delivered followup %s for %s", entry.entry_id, agent)
        delivery = None if result is None else Delivery(
            text=entry.text, pairs=entry.pairs, turn=result[0].length, events=result[1])
        recorder = metrics.get()
        if recorder.enabled:
            if delivery is None:
                recorder.delivery("dropped")
            else:
                recorder.delivery("delivered")
                occurrences = [pair.occurrenceAt for pair in entry.pairs]
                appended_ms = delivery.events[-1].time if delivery.events else self._clock()
                recorder.session_lateness(metrics.lateness_s(appended_ms, occurrences))
        return delivery, None if result is None else result[2]


def _unconfirmed(agent: str, exc: PersistenceError) -> None:
    """Say that a delivery's barrier flush failed: its turn runs, but the store may still
    lose the message (a database that crashed before writing it)."""
    log.warning("delivery barrier for %s failed (the followup stays unacknowledged until "
                "a later gate finds the message durable): %s", agent, exc.reason)


def deliverable(entry: FollowupEntry, read: Read) -> bool:
    """Whether the log holds a dispatch for each of the entry's reminders and no delivered
    message covers them. Not so: no dispatch covers it (an abandoned attempt), it is
    already delivered, or it is not the complete batch the log recorded."""
    return ledger_of(read.session).deliverable(entry.pairs)


def delivery_events(entry: FollowupEntry, read: Read, now: int) -> tuple[NewEvent, ...]:
    """The ``turn/start`` and reminder ``user/message`` of the new turn that delivers
    ``entry``, appended at the end of ``read``: stamped ``now``, or the log's last time when
    that is later (the worker that wrote the dispatch read Redis's clock up to a round trip
    nearer to it than this host), lifted by ``LIVE_SLACK_MS`` at most."""
    events = read.session.events
    if events:
        now = max(now, min(events[-1].time, now + LIVE_SLACK_MS))
    return (
        NewEvent(type=TURN_START, time=now, data={"turn": read.length}),
        NewEvent(type=USER_MESSAGE, time=now, data={
            "content": [{"type": "text", "text": entry.text}],
            "source": reminder_source(entry.pairs),
        }),
    )
