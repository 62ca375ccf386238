"""The due transaction: a wake's work for one agent (docs/architecture.md#the-due-transaction).

Every step is a named method. The log stays the authority: followups are written before
the fenced dispatch append, so a crash can only leave an entry without a dispatch (the
host drops it) or a dispatch without an entry (re-projection re-adds it).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Final

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import Pair
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.coordination.phase import Release
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, Session
from dsh_schedule.shared.core.fold import FoldState, occurrence_at
from dsh_schedule.shared.core.framing import FramingError, batch_frame, one_shot_frame
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.ledger import LedgerCache
from dsh_schedule.shared.core.records import DispatchChange, encode_change
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.reproject import reproject

log = logging.getLogger(__name__)

MAX_ROUNDS: Final = 64
FENCE_RETRIES: Final = 4
CRASH_ENV: Final = "DSH_SCHEDULE_CRASH_AT"


_paused_once = False


def crash_point(name: str) -> None:
    """Test-only: SIGKILL this process at the named point (docs/architecture.md#testing).

    ``pause-<point>`` stops the process there once (SIGSTOP) instead, so a test can let
    its lock and phase expire and then resume it.
    """
    global _paused_once
    hook = os.environ.get(CRASH_ENV)
    if hook == name:
        log.warning("crash hook %s: killing the worker", name)
        os.kill(os.getpid(), signal.SIGKILL)
    elif hook == f"pause-{name}" and not _paused_once:
        _paused_once = True
        log.warning("crash hook %s: pausing the worker", hook)
        os.kill(os.getpid(), signal.SIGSTOP)


class Stop(Exception):
    """End this wake quietly; everything stays active for a later one."""


class DueOwner:
    """Performs due transactions for agents whose sessions live in ``store``."""

    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        *,
        clock: Callable[[], int],
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._coord = coordination
        self._clock = clock
        self._sleep = sleep
        self._ledgers = LedgerCache()

    def wake(self, agent: str, target_ms: int | None) -> None:
        """Handle one wake: stale and duplicate wakes find nothing due and return."""
        settings = self._coord.settings
        if not self._coord.leases.is_live(agent, now_ms=self._clock()):
            log.debug("wake for %s: not live", agent)
            return
        if target_ms is not None:
            early_ms = target_ms - self._clock()
            if 0 < early_ms < settings.early_sleep_s * 1000:
                # rq-scheduler keeps whole-second scores: sleep out a short difference.
                self._sleep(early_ms / 1000)
        try:
            with self._coord.locks.hold(agent, wait_s=settings.wake_lock_wait_s):
                settled = self._rounds(agent)
                if settled is not None:
                    self._coord.rearm(agent, settled, self._clock())
        except LockUnavailable:
            log.debug("wake for %s: lock busy, the holder re-arms", agent)
        except Stop:
            pass

    def wake_batch(self, agents: Sequence[str]) -> None:
        """Immediate wakes for many agents (a rebuild's batch), each decided under its own
        lock after its own preflight, exactly as ``wake``; the liveness checks and the
        final re-arms go to Redis together, and every lock is held until its agent is
        armed."""
        settings = self._coord.settings
        live = self._coord.leases.live_among(agents, now_ms=self._clock())
        settled: list[tuple[str, FoldState]] = []
        with ExitStack() as held:
            for agent in live:
                try:
                    held.enter_context(
                        self._coord.locks.hold(agent, wait_s=settings.wake_lock_wait_s)
                    )
                    state = self._rounds(agent)
                except LockUnavailable:
                    log.debug("wake for %s: lock busy, the holder re-arms", agent)
                    continue
                except Stop:
                    continue
                except Exception:
                    log.exception("wake for %s failed", agent)
                    continue
                if state is not None:
                    settled.append((agent, state))
            self._coord.rearm_many(settled, self._clock())

    def _rounds(self, agent: str) -> FoldState | None:
        """Dispatch until nothing is due; the settled fold to arm from, or None when the
        wake stopped (waiting for the idle phase, or a dispatch it could not make)."""
        for _ in range(MAX_ROUNDS):
            session, state = self._preflight(agent)
            self._reproject(agent, session)
            decision = due_decision(state, self._clock())
            if isinstance(decision, Wait):
                return state
            if not self._dispatch_in_phase(agent):
                return None
            self._barrier(agent)
        log.warning("wake for %s: still due after %d rounds", agent, MAX_ROUNDS)
        return None

    def _preflight(self, agent: str) -> tuple[Session, FoldState]:
        try:
            self._store.flush(agent)
            return self._store.load(agent)
        except PersistenceError as exc:
            log.warning("due preflight for %s failed: %s", agent, exc.reason)
        except ScheduleLogError as exc:
            log.error("corrupt schedule log for %s, arming nothing: %s", agent, exc)
        raise Stop

    def _reproject(self, agent: str, session: Session) -> None:
        try:
            added = reproject(self._coord.followups, agent, session, self._ledgers)
        except ScheduleLogError as exc:
            log.error("cannot re-project followups for %s: %s", agent, exc)
            raise Stop from None
        if added:
            log.info("re-projected %d lost followup(s) for %s", added, agent)

    def _dispatch_in_phase(self, agent: str) -> bool:
        """Claim maintenance, dispatch once, release. False when the wake must stop."""
        settings = self._coord.settings
        token = uuid.uuid4().hex
        if not self._coord.phase.claim_maintenance(agent, token, settings.maintenance_ttl_s):
            log.debug("agent %s busy: idle waiter registered", agent)
            return False
        try:
            if not self._coord.leases.is_live(agent, now_ms=self._clock()):
                return False
            return self._dispatch(agent)
        finally:
            if self._coord.phase.release(agent, "maintenance", token) is Release.WAITER_WOKEN:
                self._coord.trigger(agent)

    def _dispatch(self, agent: str) -> bool:
        for attempt in range(FENCE_RETRIES):
            try:
                if attempt:
                    # A conflicting writer's suffix must be confirmed before we decide.
                    self._store.flush(agent)
                session, state = self._store.load(agent)
            except (PersistenceError, ScheduleLogError) as exc:
                log.warning("re-fold for %s failed: %s", agent, exc)
                return False
            now = self._clock()
            decision = due_decision(state, now)
            if isinstance(decision, Wait):
                return True
            try:
                text, pairs, changes = _render(decision)
            except FramingError:
                log.exception("framing failed for %s; nothing written", agent)
                return False
            crash_point("before-followup")
            self._coord.followups.add(agent, text, pairs)
            crash_point("after-followup")
            events = [
                NewEvent(type=SCHEDULE_CHANGE, time=now, data=encode_change(c)) for c in changes
            ]
            try:
                self._store.append(agent, events, expected_seq=len(session.events))
            except FenceConflict:
                log.info("fence conflict for %s: re-deciding", agent)
                continue
            except (PersistenceError, ScheduleLogError) as exc:
                # The followup may already be read; with no dispatch the host drops it.
                log.error("dispatch append for %s abandoned: %s", agent, exc)
                return False
            crash_point("after-append")
            return True
        return False

    def _barrier(self, agent: str) -> None:
        try:
            self._store.flush(agent)
        except PersistenceError as exc:
            log.warning("dispatch barrier for %s failed: %s", agent, exc.reason)
            raise Stop from None


def _render(
    decision: DispatchOne | DispatchBatch,
) -> tuple[str, list[Pair], list[DispatchChange]]:
    if isinstance(decision, DispatchOne):
        record = decision.record
        text = one_shot_frame(record.id, record.scheduledAt, record.prompt)
        pair = Pair(scheduleId=record.id, occurrenceAt=record.scheduledAt)
        return text, [pair], [DispatchChange(id=record.id)]
    accepted = format_instant(decision.accepted_ms)
    items = [
        (r.id, format_instant(occurrence_at(r, decision.accepted_ms)), r.prompt)
        for r in decision.records
    ]
    text = batch_frame(items)
    pairs = [Pair(scheduleId=i, occurrenceAt=o) for i, o, _ in items]
    return text, pairs, [DispatchChange(id=r.id, acceptedAt=accepted) for r in decision.records]

