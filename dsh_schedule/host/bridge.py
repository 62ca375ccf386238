"""The host bridge (docs/architecture.md#hosts-followups-and-rebuild): leases, agent phase for
turns, the ready stream, and the followup delivery gate (``gate.DeliveryGate``).

A host keeps a lease per installed root agent, marks its turns in the agent phase, and
consumes the agent's followup stream through the gate, which delivers each dispatch into
the session exactly once.

Which agents to look at is pushed, not polled: ``ready(timeout_s)`` is one blocking read of
the ready stream of the host's queue, on which every followup entry announces its agent in
the same step as it is written. The bridge keeps its place in that stream in memory, names
only agents it serves, and adds the agents it has its own reason to look at: each agent
once when it is installed, every agent whose lease was new at a renewal (Redis lost it, so
it may have lost announcements too), and agents the host asked to look at ``later``. An
announcement the bridge never sees (it was trimmed, the host holding it died, Redis lost
it) leaves its entry in the agent's stream; once that entry is older than
``followup_stale_s`` the scheduler's reconcile pass wakes the agent, and its re-arm
announces it again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from dsh_schedule.host.gate import Delivery, DeliveryGate, DeliveryRound
from dsh_schedule.host.watchdog import Watchdog
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import READY_START
from dsh_schedule.shared.coordination.generation import GenerationMarker
from dsh_schedule.shared.coordination.leases import (
    DIGEST_MODULUS,
    INSTALL_BATCH,
    agent_digest,
)
from dsh_schedule.shared.coordination.outage import Outage, is_outage
from dsh_schedule.shared.coordination.phase import Release
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store import many
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import OwedRearms

log = logging.getLogger(__name__)


class TurnBusy(Exception):
    """The agent's phase could not be claimed for a turn in time."""


class HostBridge:
    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        settings: Settings,
        *,
        clock: Clock,
        consumer: str | None = None,
        owed: OwedRearms | None = None,
    ) -> None:
        self._store = store
        # The wakes a new lease needs that could not be enqueued (shared with the tools).
        self.owed = OwedRearms() if owed is None else owed
        self._coord = coordination
        self._settings = settings
        self._clock = clock
        self.consumer = consumer or f"host-{uuid.uuid4().hex[:12]}"
        self._gate = DeliveryGate(store, coordination, settings, clock=clock,
                                  consumer=self.consumer)
        self._state = threading.Lock()
        self._served: dict[str, None] = {}  # insertion-ordered
        self._digest = 0  # the sum of every served agent's agent_digest, modulo 2^48
        self._generation = GenerationMarker(coordination.client, coordination.keys)
        # The next due moment of each served agent; lost keys repaired once one is overdue.
        self.watchdog = Watchdog(store, clock=clock, repair_after_s=settings.repair_after_s,
                                 misplaced=self.misplaced, repair=self.repair)
        self._due: dict[str, int] = {}  # agent -> clock ms from which ``ready`` names it
        # The same as (ms, order asked, agent), earliest first; an entry ``_due`` no longer
        # holds at that ms is stale and skipped, so ``ready`` never walks the agents that
        # are not due.
        self._due_order: list[tuple[int, int, str]] = []
        self._asked = itertools.count()
        self._cursor: str | None = None  # the last id read from the ready stream
        self._deferred: list[str] | None = None  # wakes ``installing`` holds back
        # Whether this bridge has written its host's lease yet: before that, a renewal
        # that finds no valid lease is the first one, not a lease that expired.
        self._held = False
        # A blocking read must end well within the client's socket timeout, if it has one.
        socket_timeout = coordination.client.connection_pool.connection_kwargs.get(
            "socket_timeout"
        )
        self._longest_block_s = (
            float(socket_timeout) / 2 if isinstance(socket_timeout, int | float) else None
        )

    @property
    def queue(self) -> str:
        """The queue this host's leases name: the ready stream it reads."""
        return self._settings.queue

    # -- leases ---------------------------------------------------------------------

    @property
    def host(self) -> str:
        """This host's name in the hosts ZSET: its consumer name."""
        return self.consumer

    def serves(self, agent: str) -> bool:
        """Whether this host serves the agent now."""
        with self._state:
            return agent in self._served

    @property
    def served(self) -> list[str]:
        """The agents this host serves, in the order they were installed."""
        with self._state:
            return list(self._served)

    def install(self, agent: str) -> bool:
        """Serve the agent from this host (moving it from a host that served it); a new
        lease enqueues an immediate wake. ``ready`` names the agent once afterwards,
        whatever its stream holds. Within ``installing`` the install itself waits
        for the end of the block (and False is returned)."""
        with self._state:
            if agent not in self._served:
                self._served[agent] = None
                self._digest = (self._digest + agent_digest(agent)) % DIGEST_MODULUS
            deferred = self._deferred
            if deferred is not None:
                deferred.append(agent)
        self.later([agent], 0.0)
        if deferred is not None:
            return False
        settings = self._settings
        new = bool(self._coord.leases.install(
            self.host, [agent], settings.queue, now_ms=self._clock(),
            ttl_s=settings.lease_ttl_s))
        self._held = True
        if new:
            self.watchdog.watch([agent], self._clock())
            self._wake([agent])
        return new

    @contextmanager
    def installing(self) -> Iterator[None]:
        """Within the block, ``install`` only notes its agents; they are installed together
        when it ends (one script call per few thousand agents) and the wakes of the new
        leases enqueued in ``wake_batch`` jobs (a host opening thousands of agents at its
        start sends tens of commands, not several per agent), even when the block
        fails."""
        with self._state:
            if self._deferred is not None:
                raise RuntimeError("installing is not reentrant")
            self._deferred = []
        try:
            yield
        finally:
            with self._state:
                noted, self._deferred = self._deferred, None
            if noted:
                try:
                    self._install_again(list(dict.fromkeys(noted)))
                except redis.RedisError as exc:
                    if not is_outage(exc):
                        raise
                    # An outage, not a crash: the lease is not held, so the next renewal
                    # installs every agent served (docs/architecture.md#outages).
                    log.warning("installing %d agent(s) failed (%s); the lease's renewal "
                                "installs them once Redis answers", len(noted),
                                type(exc).__name__)

    def renew(self) -> list[str]:
        """Renew this host's lease: one command, whatever the number of agents it serves
        (docs/architecture.md#leases). When the lease had expired (the reconcile pass may
        have retired its agents), every agent is installed again; when the served set
        holds fewer agents than this host serves, the missing ones are (an agent another
        host took over meanwhile is served here no more); when the digest of the entries
        naming this host differs from its own (an entry lost), every agent's entries are
        looked at and written again. Returns the agents whose lease was new: they are
        woken together and named by ``ready`` once more."""
        renewal = self._coord.leases.renew_host(
            self.host, now_ms=self._clock(), ttl_s=self._settings.lease_ttl_s)
        with self._state:
            serving, digest = len(self._served), self._digest
        first, self._held = not self._held, True
        if renewal.was_valid and renewal.digest != digest:
            served = self.served
            log.warning("the lease entries of host %s differ from the %d agent(s) it "
                        "serves; writing them again", self.host, len(served))
            new = self._install_again(self._not_moved(served))
            self._coord.leases.reset_digest(self.host, self.digest)
            return new
        if renewal.was_valid and renewal.served >= serving:
            return []  # the usual renewal: nothing walked or copied, however many agents
        served = self.served
        if renewal.was_valid:
            served = self._missing(served)
        elif first:
            log.debug("host %s takes its lease for %d agent(s)", self.host, len(served))
        else:
            log.warning("the lease of host %s had expired; installing its %d agent(s) "
                        "again", self.host, len(served))
        return self._install_again(served)

    @property
    def digest(self) -> int:
        """The digest of the agents this host serves (their ``agent_digest`` summed): the
        host digest in Redis matches while no entry of theirs was lost."""
        with self._state:
            return self._digest

    def check_generation(self) -> list[str]:
        """Check the generation marker (one command): when Redis lost its data since the
        last check, install every served agent again at once, which wakes them all
        (docs/architecture.md#the-generation-marker). Returns the agents woken."""
        if not self._generation.lost_data():
            return []
        served = self.served
        log.warning("Redis lost its data (the generation marker changed); installing "
                    "%d agent(s) again", len(served))
        return self._install_again(served)

    def _install_again(self, agents: list[str]) -> list[str]:
        settings = self._settings
        new = self._coord.leases.install(
            self.host, agents, settings.queue, now_ms=self._clock(),
            ttl_s=settings.lease_ttl_s)
        self._held = True
        if new:
            self.watchdog.watch(new, self._clock())
            self._wake(new)
            self._resync(new)
        return new

    def repair(self, agents: list[str]) -> None:
        """Repair what Redis lost of agents whose reminders are overdue (the watchdog's
        finding): their lease entries written again, each woken (the wake re-arms its
        reminders and re-projects its followups from its log) and looked at again. An
        agent this host no longer serves (a tool call in flight when it was let go noted
        it again) is forgotten, never installed again."""
        with self._state:
            unserved = [a for a in agents if a not in self._served]
        if unserved:
            self.watchdog.forget(unserved)
            gone = set(unserved)
            agents = [a for a in agents if a not in gone]
            if not agents:
                return
        lost = self._lost_keys(agents)
        log.warning("%d agent(s) overdue by %g s or more, or with lease entries not naming "
                    "this host (%s); missing: %s; repairing", len(agents),
                    self._settings.repair_after_s, _named(agents),
                    ", ".join(f"{kind} {n}" for kind, n in lost.items()) or "nothing")
        agents = self._not_moved(agents)
        new = set(self._install_again(agents))
        # An entry deleted by hand left its share in the digest, which the install added
        # again: the digest is set from what this host serves, as after a renewal's repair.
        self._coord.leases.reset_digest(self.host, self.digest)
        rest = [a for a in agents if a not in new]
        if rest:
            self._wake(rest)
            self._resync(rest)

    def misplaced(self, agents: list[str]) -> list[str]:
        """The agents of ``agents`` whose lease entries do not name this host and its
        queue (one round trip)."""
        client, keys = self._coord.client, self._coord.keys
        with client.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.agent_host(), agents)
            pipe.hmget(keys.lease_queue(), agents)
            hosts, queues = pipe.execute()
        return [a for a, h, q in zip(agents, hosts, queues, strict=True)
                if not (_names(h, self.host) and _names(q, self.queue))]

    def _lost_keys(self, agents: list[str]) -> dict[str, int]:
        """How many of ``agents`` miss each kind of key of their projection (three round
        trips, on the repair's path only): what the repair's log line says it found."""
        client, keys = self._coord.client, self._coord.keys
        hosts: list[Any] = client.hmget(keys.agent_host(), agents)
        queues: list[Any] = client.hmget(keys.lease_queue(), agents)
        projections = self._coord.projections(agents)
        lost = {
            "agent-host entry": sum(h is None for h in hosts),
            "lease-queue entry": sum(q is None for q in queues),
            "no wake held": sum(not p.wake_held for p in projections),
            "followup stream empty": sum(p.oldest_followup_ms is None for p in projections),
        }
        return {kind: n for kind, n in lost.items() if n}

    def _wake(self, agents: list[str]) -> None:
        """Enqueue the wakes new leases need; when Redis fails after the lease was
        written, they are owed (``OwedRearms``: retried once Redis answers) and the
        failure raised."""
        try:
            self._coord.wakes.trigger({self._settings.queue: agents})
        except redis.RedisError:
            self.owed.owe(agents)
            raise

    def _missing(self, agents: list[str]) -> list[str]:
        """The agents missing from this host's served set that no other live host serves;
        those another host serves now are served here no more."""
        leases = self._coord.leases
        missing: list[str] = []
        for start in range(0, len(agents), INSTALL_BATCH):
            batch = agents[start : start + INSTALL_BATCH]
            missing.extend(a for a, here in zip(batch, leases.served_here(self.host, batch),
                                                strict=True) if not here)
        return self._not_moved(missing)

    def _not_moved(self, agents: list[str]) -> list[str]:
        """The agents of ``agents`` that no other live host serves; those another host
        serves now are served here no more (one round trip per ``INSTALL_BATCH``)."""
        leases = self._coord.leases
        hosts: list[str | None] = []
        for start in range(0, len(agents), INSTALL_BATCH):
            hosts.extend(leases.hosts_of(agents[start : start + INSTALL_BATCH],
                                         now_ms=self._clock()))
        moved = [a for a, host in zip(agents, hosts, strict=True)
                 if host is not None and host != self.host]
        if moved:
            log.info("%d agent(s) are served by another host now: %s", len(moved),
                     _named(moved))
            self._stop_serving(moved)
        gone = set(moved)
        return [a for a in agents if a not in gone]

    def _stop_serving(self, agents: Sequence[str]) -> None:
        with self._state:
            for agent in agents:
                self._unserve(agent)

    def _unserve(self, agent: str) -> None:
        """Serve the agent no more (hold ``_state``)."""
        if agent in self._served:
            del self._served[agent]
            self._digest = (self._digest - agent_digest(agent)) % DIGEST_MODULUS
        self._due.pop(agent, None)
        self.watchdog.forget([agent])

    def dispose(self, agents: Sequence[str]) -> list[str]:
        """Forget the agents in Redis, in a few round trips whatever their number (the
        caller bounds the batch); their logs keep every record (no delete on teardown).
        Returns the agents whose lock stayed busy: nothing else of theirs was forgotten
        in Redis, and they move to a host lease that has already expired, so the
        reconcile pass retires them."""
        with self._state:
            for agent in agents:
                self._unserve(agent)
        park = self._park if self._settings.wake_unloaded else None
        left = self._coord.forget_agents(agents, lock_wait_s=self._settings.tool_lock_wait_s,
                                         park=park)
        if left:
            self._coord.leases.install(f"{self.host}:disposed", left, self.queue,
                                       now_ms=self._clock() - 1, ttl_s=0)
        return left

    def _park(self, agents: Sequence[str]) -> None:
        """Give each agent being disposed of (its lock held) the timer of an unloaded
        session (``Settings.wake_unloaded``): its next wake from its fold, now while a
        dispatch of it is undelivered; from its wake when its log cannot be read."""
        now = self._clock()
        moments: dict[str, int | None] = {}
        unread: list[str] = []
        for agent in agents:
            try:
                session, state = self._store.load(agent)
            except (PersistenceError, ScheduleLogError):
                unread.append(agent)
                continue
            pending = session.ledger is not None and bool(session.ledger.pending)
            moments[agent] = now if pending else next_wake_ms(state, now)
        self._coord.unloaded.park(self.queue, moments)
        self._coord.unloaded.park_wakes(unread)

    # -- which agents to look at ------------------------------------------------------

    def ready(self, timeout_s: float) -> list[str]:
        """The served agents that may have a followup to deliver, each once: those
        announced on the ready stream since the last call, and those whose own check has
        come (installed, re-leased, or asked for ``later``).

        One ``XREAD`` of the queue's ready stream, blocking up to ``timeout_s`` (no longer
        than until the next own check, or than half the client's socket timeout; not at
        all when a check is due now, or for ``timeout_s <= 0``). Nothing else is sent to
        Redis, however many agents are served. An agent named here is not named again
        for the same announcement: the host looks at it now, or asks for it ``later``.
        """
        cursor = self._cursor_now()
        now = self._clock()
        with self._state:
            due = self._take_due(now)
            upcoming = self._due_order[0][0] if self._due_order else None
        wait_s = 0.0 if due else max(timeout_s, 0.0)
        if upcoming is not None:
            wait_s = min(wait_s, max(upcoming - now, 0) / 1000)
        if self._longest_block_s is not None:
            wait_s = min(wait_s, self._longest_block_s)
        try:
            found = self._coord.followups.read_ready(
                self.queue, cursor, block_ms=int(wait_s * 1000) or None
            )
        except redis.RedisError:
            self.later(due, 0.0)  # still to be looked at once Redis answers
            raise
        with self._state:
            if self._cursor == cursor:  # not reset meanwhile by a renewal that found losses
                self._cursor = found.cursor
            announced = [agent for agent in found.agents if agent in self._served]
        return list(dict.fromkeys([*due, *announced]))

    def later(self, agents: Iterable[str], delay_s: float) -> None:
        """Have ``ready`` name these served agents again ``delay_s`` from now (a delivery
        that could not run now: the agent's turn or lock was busy, or its stream still
        holds entries another consumer read)."""
        at = self._clock() + int(delay_s * 1000)
        with self._state:
            for agent in agents:
                if agent in self._served:
                    if at < self._due.get(agent, at + 1):
                        self._due[agent] = at
                        heapq.heappush(self._due_order, (at, next(self._asked), agent))

    def _take_due(self, now: int) -> list[str]:
        """Forget and return the agents due by ``now``, and leave the earliest entry
        still wanted first. Holds ``_state``. O(log n) per entry taken or skipped."""
        order, due = self._due_order, []
        while order and (order[0][0] <= now or self._due.get(order[0][2]) != order[0][0]):
            at, _asked, agent = heapq.heappop(order)
            if self._due.get(agent) == at:
                del self._due[agent]
                due.append(agent)
        return due

    def recheck_all(self) -> None:
        """Have ``ready`` name every served agent once more, at once (after a Redis outage:
        announcements made while this host could not read may be gone)."""
        with self._state:
            served = list(self._served)
        self._resync(served)

    def _resync(self, agents: Sequence[str]) -> None:
        """Look at ``agents`` again, and read the ready stream from its start when it is
        behind the place this host had reached (Redis lost it and began it anew)."""
        self.later(agents, 0.0)
        newest = self._coord.followups.ready_cursor(self.queue)
        with self._state:
            if self._cursor is not None and _stream_id(newest) < _stream_id(self._cursor):
                log.info("the ready stream of %s was lost; reading it from its start",
                         self.queue)
                self._cursor = READY_START

    def _cursor_now(self) -> str:
        """Where to read the ready stream from; the first time, its newest announcement
        (every agent is named once at install, so nothing before it is missed)."""
        with self._state:
            cursor = self._cursor
        if cursor is None:
            cursor = self._coord.followups.ready_cursor(self.queue)
            with self._state:
                if self._cursor is None:
                    self._cursor = cursor
                cursor = self._cursor
        return cursor

    # -- turns ----------------------------------------------------------------------

    @contextmanager
    def turn(self, agent: str, *, wait_s: float = 60.0) -> Iterator[str]:
        """Hold the agent's turn phase; waking input stays parked behind maintenance. When
        the turn ends, ``ready`` names the agent (a followup may have waited for it)."""
        settings = self._settings
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while not self._coord.phase.claim_turn(agent, token, settings.turn_ttl_s):
            if time.monotonic() > deadline:
                raise TurnBusy(agent)
            time.sleep(0.02)
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=([agent], token, stop),
                                daemon=True, name="turn-heartbeat")
        beat.start()
        try:
            yield token
        finally:
            stop.set()
            beat.join()
            try:
                self._end_turns([agent], token)
            finally:
                self.later([agent], 0.0)

    @contextmanager
    def turns(self, agents: Sequence[str]) -> Iterator[list[str]]:
        """``turn`` for many agents, without waiting: yields the agents whose turn phase
        was free and is held now (the others are left out: the caller asks for them
        ``later``). One round trip claims them, one renews them all in the background,
        one releases them; the end of the turns wakes those agents ``turn`` would wake."""
        settings = self._settings
        token = uuid.uuid4().hex
        agents = list(dict.fromkeys(agents))
        claimed = self._coord.phase.claim(agents, "turn", token, settings.turn_ttl_s) \
            if agents else []
        held = [agent for agent, ok in zip(agents, claimed, strict=True) if ok]
        if not held:
            yield []
            return
        stop = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(held, token, stop),
                                daemon=True, name="turns-heartbeat")
        beat.start()
        try:
            yield held
        finally:
            stop.set()
            beat.join()
            self._end_turns(held, token)

    def _heartbeat(self, agents: list[str], token: str, stop: threading.Event) -> None:
        """Renew the turn phases of ``agents`` until ``stop``; an agent whose phase was lost
        is renewed no more, and the beat ends when none is left. Through a Redis outage
        (``is_outage``) it keeps beating, with one line when the renewals start to fail
        and one when they succeed again: the turns go on, and Redis may be back before
        the TTL. Any other Redis error ends the beat (logged); the phase then expires."""
        settings = self._settings
        outage = Outage(log, f"turn heartbeat of {_named(agents)}")
        while agents and not stop.wait(settings.turn_renew_s):
            try:
                renewed = self._coord.phase.renew(agents, "turn", token,
                                                       settings.turn_ttl_s)
            except redis.RedisError as exc:
                if not is_outage(exc):
                    log.exception("turn heartbeat of %s stopped", _named(agents))
                    return
                outage.failed(exc)
                continue
            outage.succeeded()
            lost = [agent for agent, ok in zip(agents, renewed, strict=True) if not ok]
            if lost:
                log.warning("turn phase of %s was lost", ", ".join(lost))
                gone = set(lost)
                agents = [agent for agent in agents if agent not in gone]

    def _end_turns(self, agents: list[str], token: str) -> None:
        """Release the agents' turns and wake each whose due wake waited for it, or
        whose log holds reminders: the release takes the waiter, so a wake Redis fails
        to send is owed (``OwedRearms``) before the failure is raised, as is one whose
        log read failed unexpectedly (that error raised once the others are woken)."""
        released = self._coord.phase.release(agents, "turn", token)
        wake = []
        unexpected: Exception | None = None
        # The logs read together (one round trip where the store can).
        logs = many.load(self._store, agents)
        for agent, release in zip(agents, released, strict=True):
            loaded = logs[agent]
            if isinstance(loaded, Exception) and not isinstance(
                    loaded, PersistenceError | ScheduleLogError):
                unexpected = unexpected or loaded
                wake.append(agent)  # its wake reads the log again
                continue
            active = not isinstance(loaded, Exception) and bool(loaded[1].active)
            if release is Release.WAITER_WOKEN or active:
                wake.append(agent)
        if wake:
            try:
                self._coord.trigger(wake)
            except redis.RedisError:
                self.owed.owe(wake)
                raise
        if unexpected is not None:
            raise unexpected

    # -- the delivery gate (``gate.DeliveryGate``) ------------------------------------

    def has_followup(self, agent: str) -> bool:
        """Whether this host can take one of the agent's followups now (a turn is not
        needed to ask): ``DeliveryGate.has_followup``."""
        return self._gate.has_followup(agent)

    def deliver_next(self, agent: str) -> Delivery | None:
        """Deliver the agent's next deliverable followup as the user/message of a new turn,
        dropping the others; hold the turn phase. ``DeliveryGate.deliver_next``."""
        return self._gate.deliver_next(agent)

    def deliver_many(self, agents: Sequence[str]) -> DeliveryRound:
        """``deliver_next`` for many agents whose turns the caller holds, at most one
        delivery each, the round trips shared: ``DeliveryGate.deliver_many``."""
        return self._gate.deliver_many(agents)


def _named(agents: Sequence[str]) -> str:
    shown = ", ".join(agents[:3])
    return shown + (f" and {len(agents) - 3} more" if len(agents) > 3 else "")


def _names(value: object, text: str) -> bool:
    """Whether a Redis reply (bytes, or str on a decoding client) is ``text``."""
    return (value.decode() if isinstance(value, bytes) else value) == text


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _dash, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
