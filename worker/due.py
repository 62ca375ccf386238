"""The due transaction: a wake's work for one agent (docs/architecture.md#the-due-transaction).

Every step is a named method whose result is either what the next step needs or the
``WakeOutcome`` that ends the wake. The log stays the authority: followups are written
before the fenced dispatch append, so a crash can only leave an entry without a dispatch
(the host drops it) or a dispatch without an entry (re-projection re-adds it).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from enum import Enum
from typing import Final

import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.coordination.phase import Release
from dsh_schedule.shared.core.dispatch import plan_dispatch
from dsh_schedule.shared.core.due import DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, Session
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.framing import FramingError
from dsh_schedule.shared.core.ledger import LedgerCache
from dsh_schedule.shared.core.records import encode_change
from dsh_schedule.shared.fencing import FenceRetriesExhausted, retry_fenced
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.reproject import reproject

log = logging.getLogger(__name__)

MAX_ROUNDS: Final = 64
CRASH_ENV: Final = "DSH_SCHEDULE_CRASH_AT"


class WakeOutcome(Enum):
    """How a wake ended. Only ``SETTLED`` re-arms; every other outcome leaves the records
    active for a later wake (the phase release, a management call, a new lease or the
    reconcile pass)."""

    SETTLED = "settled"
    NOT_LIVE = "not-live"
    LOCK_BUSY = "lock-busy"
    WAITING_FOR_IDLE = "waiting-for-idle"
    PREFLIGHT_FAILED = "preflight-failed"
    CORRUPT_LOG = "corrupt-log"
    DISPATCH_ABANDONED = "dispatch-abandoned"
    BARRIER_FAILED = "barrier-failed"
    STILL_DUE = "still-due"
    REDIS_UNAVAILABLE = "redis-unavailable"
    FAILED = "failed"


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

    def wake(self, agent: str, target_ms: int | None) -> WakeOutcome:
        """Handle one wake: stale and duplicate wakes find nothing due and return.

        Lines logged meanwhile carry the agent; the wake's outcome and duration are
        recorded in the metrics (docs/architecture.md#operations)."""
        recorder = metrics.get()
        started = time.perf_counter()
        outcome = WakeOutcome.FAILED
        with log_context(agent=agent):
            try:
                outcome = self._wake(agent, target_ms)
            except redis.RedisError as exc:
                # The records stay active; a new lease or the reconcile pass wakes the agent.
                recorder.redis_error()
                log.warning("wake for %s: Redis unavailable (%s)", agent, type(exc).__name__)
                outcome = WakeOutcome.REDIS_UNAVAILABLE
            finally:
                recorder.due_transaction(time.perf_counter() - started)
                recorder.wake(outcome.value)
        return outcome

    def _wake(self, agent: str, target_ms: int | None) -> WakeOutcome:
        if not self._coord.leases.is_live(agent, now_ms=self._clock()):
            log.debug("wake for %s: not live", agent)
            return WakeOutcome.NOT_LIVE
        if target_ms is not None:
            self._sleep_out_skew(agent, target_ms)
        try:
            with self._coord.locks.hold(agent, wait_s=self._settings.wake_lock_wait_s):
                settled = self._rounds(agent)
                if isinstance(settled, WakeOutcome):
                    return settled
                self._coord.rearm(agent, settled, self._clock())
                return WakeOutcome.SETTLED
        except LockUnavailable:
            log.debug("wake for %s: lock busy, the holder re-arms", agent)
            return WakeOutcome.LOCK_BUSY

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
        """Immediate wakes for many agents (a rebuild's batch), each decided under its own
        lock after its own preflight, exactly as ``wake``; the liveness checks and the
        final re-arms go to Redis together, and every lock is held until its agent is
        armed."""
        recorder = metrics.get()
        try:
            outcomes = self._wake_batch(agents, recorder)
        except redis.RedisError as exc:
            recorder.redis_error()
            log.warning("wake batch of %d: Redis unavailable (%s)", len(agents),
                        type(exc).__name__)
            outcomes = dict.fromkeys(agents, WakeOutcome.REDIS_UNAVAILABLE)
        for outcome in outcomes.values():
            recorder.wake(outcome.value)
        return outcomes

    def _wake_batch(
        self, agents: Sequence[str], recorder: metrics.Metrics
    ) -> dict[str, WakeOutcome]:
        live = set(self._coord.leases.live_among(agents, now_ms=self._clock()))
        outcomes = {agent: WakeOutcome.NOT_LIVE for agent in agents if agent not in live}
        settled: list[tuple[str, FoldState]] = []
        with ExitStack() as held:
            for agent in agents:
                if agent not in live:
                    continue
                started = time.perf_counter()
                with log_context(agent=agent):
                    try:
                        held.enter_context(
                            self._coord.locks.hold(agent, wait_s=self._settings.wake_lock_wait_s)
                        )
                    except LockUnavailable:
                        log.debug("wake for %s: lock busy, the holder re-arms", agent)
                        outcomes[agent] = WakeOutcome.LOCK_BUSY
                        recorder.due_transaction(time.perf_counter() - started)
                        continue
                    try:
                        state = self._rounds(agent)
                    except redis.RedisError:
                        raise  # every other agent of the batch needs Redis too
                    except Exception:
                        # One agent's failure spares the rest of the batch.
                        log.exception("wake for %s failed", agent)
                        state = WakeOutcome.FAILED
                    finally:
                        # Its share of the batch: its lock and rounds (the re-arm is shared).
                        recorder.due_transaction(time.perf_counter() - started)
                if isinstance(state, WakeOutcome):
                    outcomes[agent] = state
                else:
                    settled.append((agent, state))
                    outcomes[agent] = WakeOutcome.SETTLED
            self._coord.rearm_many(settled, self._clock())
        return outcomes

    def _rounds(self, agent: str) -> FoldState | WakeOutcome:
        """Dispatch until nothing is due; the settled fold to arm from, or the outcome
        that stopped the wake."""
        for _ in range(MAX_ROUNDS):
            loaded = self._preflight(agent)
            if isinstance(loaded, WakeOutcome):
                return loaded
            session, state = loaded
            stopped = self._reproject(agent, session)
            if stopped is not None:
                return stopped
            if isinstance(due_decision(state, self._clock()), Wait):
                return state
            stopped = self._dispatch_in_phase(agent)
            if stopped is not None:
                return stopped
            stopped = self._barrier(agent)
            if stopped is not None:
                return stopped
        log.warning("wake for %s: still due after %d rounds", agent, MAX_ROUNDS)
        return WakeOutcome.STILL_DUE

    def _preflight(self, agent: str) -> tuple[Session, FoldState] | WakeOutcome:
        try:
            self._store.flush(agent)
            return self._store.load(agent)
        except PersistenceError as exc:
            log.warning("due preflight for %s failed: %s", agent, exc.reason)
            return WakeOutcome.PREFLIGHT_FAILED
        except ScheduleLogError as exc:
            log.error("corrupt schedule log for %s, arming nothing: %s", agent, exc)
            return WakeOutcome.CORRUPT_LOG

    def _reproject(self, agent: str, session: Session) -> WakeOutcome | None:
        try:
            added = reproject(self._coord.followups, agent, session, self._ledgers)
        except ScheduleLogError as exc:
            log.error("cannot re-project followups for %s: %s", agent, exc)
            return WakeOutcome.CORRUPT_LOG
        if added:
            metrics.get().delivery("reprojected", added)
            log.info("re-projected %d lost followup(s) for %s", added, agent)
        return None

    def _dispatch_in_phase(self, agent: str) -> WakeOutcome | None:
        """Claim maintenance, dispatch once, release; the outcome when the wake stops."""
        token = uuid.uuid4().hex
        phase = self._coord.phase
        if not phase.claim_maintenance(agent, token, self._settings.maintenance_ttl_s):
            log.debug("agent %s busy: idle waiter registered", agent)
            return WakeOutcome.WAITING_FOR_IDLE
        try:
            if not self._coord.leases.is_live(agent, now_ms=self._clock()):
                return WakeOutcome.NOT_LIVE
            return self._dispatch(agent)
        finally:
            if phase.release(agent, "maintenance", token) is Release.WAITER_WOKEN:
                self._coord.trigger(agent)

    def _dispatch(self, agent: str) -> WakeOutcome | None:
        """Re-decide with the phase held and write one dispatch (followup, then the fenced
        append); the outcome when nothing could be written."""
        try:
            return retry_fenced(f"dispatch for {agent}", lambda n: self._dispatch_once(agent, n))
        except FenceRetriesExhausted as exc:
            log.warning("%s", exc)
            return WakeOutcome.DISPATCH_ABANDONED

    def _dispatch_once(self, agent: str, attempt: int) -> WakeOutcome | None:
        try:
            if attempt:
                # A conflicting writer's suffix must be confirmed before we decide.
                self._store.flush(agent)
            session, state = self._store.load(agent)
        except (PersistenceError, ScheduleLogError) as exc:
            log.warning("re-fold for %s failed: %s", agent, exc)
            return WakeOutcome.DISPATCH_ABANDONED
        now = self._clock()
        decision = due_decision(state, now)
        if isinstance(decision, Wait):
            return None
        try:
            plan = plan_dispatch(decision)
        except FramingError:
            log.exception("framing failed for %s; nothing written", agent)
            return WakeOutcome.DISPATCH_ABANDONED
        with log_context(schedule_id=",".join(pair.scheduleId for pair in plan.pairs)):
            crash_point("before-followup")
            self._coord.followups.add(agent, plan.text, plan.pairs)
            written_ms = self._clock()
            crash_point("after-followup")
            events = [
                NewEvent(type=SCHEDULE_CHANGE, time=now, data=encode_change(c))
                for c in plan.changes
            ]
            try:
                # FenceConflict propagates: retry_fenced re-decides.
                self._store.append(agent, events, expected_seq=len(session.events))
            except (PersistenceError, ScheduleLogError) as exc:
                # The followup may already be read; with no dispatch the host drops it.
                log.error("dispatch append for %s abandoned: %s", agent, exc)
                return WakeOutcome.DISPATCH_ABANDONED
            crash_point("after-append")
            recorder = metrics.get()
            if recorder.enabled:
                kind = "one-shot" if isinstance(decision, DispatchOne) else "batch"
                occurrences = [pair.occurrenceAt for pair in plan.pairs]
                recorder.dispatched(kind, metrics.lateness_s(written_ms, occurrences))
            log.info("dispatched %s for %s",
                     ", ".join(pair.scheduleId for pair in plan.pairs), agent)
        return None

    def _barrier(self, agent: str) -> WakeOutcome | None:
        try:
            self._store.flush(agent)
        except PersistenceError as exc:
            log.warning("dispatch barrier for %s failed: %s", agent, exc.reason)
            return WakeOutcome.BARRIER_FAILED
        return None
