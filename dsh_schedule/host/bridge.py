"""The host bridge (docs/architecture.md#hosts-followups-and-rebuild): leases, agent phase for
turns, the followup delivery gate.

A host keeps a lease per installed root agent, marks its turns in the agent phase, and
consumes the agent's followup stream. An entry is delivered into the session only when
the log holds a dispatch for each of its reminders and no delivered message covers them;
otherwise it is dropped. Either way it is acknowledged and deleted, so delivery into the
session is exactly once per dispatch, whatever Redis or a crashed worker did.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import msgspec
import redis

from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import FollowupEntry, Pair
from dsh_schedule.shared.coordination.phase import Release
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import TURN_START, USER_MESSAGE, Event, NewEvent
from dsh_schedule.shared.core.ledger import LedgerCache, reminder_source
from dsh_schedule.shared.fencing import retry_fenced
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)

STALE_ENTRY_MS: Final = 30_000


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """A followup delivered into the session as the user/message of a new turn."""

    text: str
    pairs: tuple[Pair, ...]
    turn: int
    events: tuple[Event, ...]


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
    ) -> None:
        self._store = store
        self._coord = coordination
        self._settings = settings
        self._clock = clock
        self.consumer = consumer or f"host-{uuid.uuid4().hex[:12]}"
        self._ledgers = LedgerCache()

    # -- leases ---------------------------------------------------------------------

    def install(self, agent: str) -> bool:
        """Hold a lease for the agent; a new lease enqueues an immediate wake."""
        settings = self._settings
        new = self._coord.leases.grant(
            agent, settings.queue, now_ms=self._clock(), ttl_s=settings.lease_ttl_s
        )
        if new:
            self._coord.trigger(agent)
        return new

    def renew(self, agents: Sequence[str]) -> list[str]:
        """Renew leases; returns the agents whose lease Redis had lost (each re-woken)."""
        return [agent for agent in agents if self.install(agent)]

    def dispose(self, agent: str) -> None:
        """Forget the agent in Redis; its log keeps every record (no delete on teardown)."""
        self._coord.forget_agent(agent, lock_wait_s=self._settings.tool_lock_wait_s)
        self._ledgers.forget(agent)

    # -- turns ----------------------------------------------------------------------

    @contextmanager
    def turn(self, agent: str, *, wait_s: float = 60.0) -> Iterator[str]:
        """Hold the agent's turn phase; waking input stays parked behind maintenance."""
        settings = self._settings
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while not self._coord.phase.claim_turn(agent, token, settings.turn_ttl_s):
            if time.monotonic() > deadline:
                raise TurnBusy(agent)
            time.sleep(0.02)
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(agent, token, stop), daemon=True, name="turn-heartbeat"
        )
        beat.start()
        try:
            yield token
        finally:
            stop.set()
            beat.join()
            self._end_turn(agent, token)

    def _heartbeat(self, agent: str, token: str, stop: threading.Event) -> None:
        settings = self._settings
        while not stop.wait(settings.turn_renew_s):
            try:
                renewed = self._coord.phase.renew(agent, "turn", token, settings.turn_ttl_s)
            except redis.RedisError as exc:
                # Keep beating: the turn goes on, and Redis may be back before the TTL.
                log.warning("turn phase of %s not renewed (%s)", agent, type(exc).__name__)
                continue
            if not renewed:
                log.warning("turn phase of %s was lost", agent)
                return

    def _end_turn(self, agent: str, token: str) -> None:
        woken = self._coord.phase.release(agent, "turn", token) is Release.WAITER_WOKEN
        try:
            _session, state = self._store.load(agent)
            active = bool(state.active)
        except (PersistenceError, ScheduleLogError):
            active = False
        if woken or active:
            self._coord.trigger(agent)

    # -- the delivery gate ----------------------------------------------------------

    def deliver_next(self, agent: str) -> Delivery | None:
        """Deliver the next deliverable followup, dropping the others; hold the turn phase.

        Appends ``turn/start`` and the reminder ``user/message`` of a new turn; the host
        runs that turn and appends the rest of it.
        """
        followups = self._coord.followups
        entries = followups.read(agent, self.consumer)
        if not entries:
            entries = followups.claim_stale(agent, self.consumer, min_idle_ms=STALE_ENTRY_MS)
        for entry in entries:
            delivery = self._gate(agent, entry)
            followups.done(agent, entry.entry_id)
            if delivery is not None:
                return delivery
        return None

    def _gate(self, agent: str, entry: FollowupEntry) -> Delivery | None:
        with self._coord.locks.hold(agent, wait_s=self._settings.tool_lock_wait_s):
            return retry_fenced(f"delivery for {agent}", lambda _n: self._deliver(agent, entry))

    def _deliver(self, agent: str, entry: FollowupEntry) -> Delivery | None:
        """Append the entry as the user/message of a new turn if the log says it is due
        for delivery; None when it is to be dropped. ``FenceConflict`` re-decides."""
        self._store.flush(agent)
        session, _state = self._store.load(agent)
        ledger = self._ledgers.ledger(agent, session)
        if not ledger.deliverable(entry.pairs):
            # No dispatch covers it (an abandoned attempt), it is already delivered, or it
            # is not the complete batch the log recorded.
            log.info("dropping followup %s for %s", entry.entry_id, agent)
            return None
        turn = len(session.events)
        now = self._clock()
        events = [
            NewEvent(type=TURN_START, time=now, data={"turn": turn}),
            NewEvent(type=USER_MESSAGE, time=now, data={
                "content": [{"type": "text", "text": entry.text}],
                "source": reminder_source(entry.pairs),
            }),
        ]
        appended = self._store.append(agent, events, expected_seq=turn)
        try:
            self._store.flush(agent)
        except PersistenceError as exc:
            # The message is appended: the turn must run. The next preflight confirms
            # its durability.
            log.warning("delivery barrier for %s failed: %s", agent, exc.reason)
        return Delivery(text=entry.text, pairs=entry.pairs, turn=turn, events=appended)
