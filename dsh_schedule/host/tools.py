"""The management transactions (docs/architecture.md#management-tools): create, list,
delete and, with the lifecycle, update.

Shape checks run before the queue. Then, holding the per-agent lock: preflight flush,
fold, one ``now`` sample, a fenced append, the barrier flush, and the re-arm from the latest
confirmed fold (owed, and retried once Redis answers, when it fails).
A fence conflict re-reads, re-folds and re-decides; it is not an error.

Every call is counted and timed by tool and answer code when metrics are on, and lines it
logs carry the agent and, once known, the schedule id (docs/architecture.md#operations).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Final

import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import HeldLock, LockUnavailable
from dsh_schedule.shared.coordination.owed import OwedRearms
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError, ToolError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, Session
from dsh_schedule.shared.core.fold import FoldState, fold_events
from dsh_schedule.shared.core.records import (
    CreateChange,
    DeleteChange,
    UpdateChange,
    encode_change,
)
from dsh_schedule.shared.core.requests import (
    build_create,
    parse_create_args,
    parse_delete_args,
    parse_list_args,
)
from dsh_schedule.shared.core.timecontext import derive_zone_context, implicit_zone
from dsh_schedule.shared.core.update_requests import decide_update, parse_update_args
from dsh_schedule.shared.core.views import (
    ToolResult,
    delete_value,
    error_result,
    list_value,
    ok_result,
    schedule_view,
    update_not_found_value,
)
from dsh_schedule.shared.fencing import FenceRetriesExhausted, retry_fenced
from dsh_schedule.shared.logging_setup import add_log_context, log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)

CLOSED_MESSAGE: Final = "Schedule is no longer available in this agent; nothing was changed."


class _Uncertain(Exception):
    """Preflight or barrier failed: the answer is persistence_uncertain."""

    def __init__(self, schedule_id: str | None = None) -> None:
        self.schedule_id = schedule_id


class _LatestFold:
    """The latest confirmed fold of a transaction: what the re-arm recomputes from when
    it ends (None: nothing was confirmed, nothing to re-arm)."""

    def __init__(self) -> None:
        self.state: FoldState | None = None

    def confirmed(self, state: FoldState) -> None:
        self.state = state


class ScheduleTools:
    """Runs tool calls for agents whose id is their root session id.

    ``calendar`` offers calendar rules (the ``cron`` selector); None takes
    ``settings.calendar``. ``lifecycle`` offers ``schedule_update``, the end conditions
    and the cap per session; None takes ``settings.lifecycle``. Records of either are
    read whatever the switches say.
    """

    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        settings: Settings,
        clock: Clock,
        calendar: bool | None = None,
        owed: OwedRearms | None = None,
        lifecycle: bool | None = None,
        watch: Callable[[str, FoldState], None] | None = None,
    ) -> None:
        self.calendar = settings.calendar if calendar is None else calendar
        self.lifecycle = settings.lifecycle if lifecycle is None else lifecycle
        # Told each re-arm's fold: the host's watchdog keeps the agent's next due moment.
        self._watch = watch
        self._store = store
        self._coord = coordination
        self._settings = settings
        self._clock = clock
        self._closed = False
        self.owed = OwedRearms() if owed is None else owed

    def close(self) -> None:
        """Stop new work: later calls answer ``internal_error`` and touch nothing."""
        self._closed = True

    def call(self, agent: str, tool: str, args: Any) -> ToolResult:
        """Run one tool call; every failure becomes a closed-code error value."""
        recorder = metrics.get()
        started = time.perf_counter() if recorder.enabled else 0.0
        with log_context(agent=agent):
            result = self._call(agent, tool, args)
        if recorder.enabled:
            code = result.value.get("code") if result.is_error else "ok"
            recorder.tool_call(tool, str(code), time.perf_counter() - started)
        return result

    def _call(self, agent: str, tool: str, args: Any) -> ToolResult:
        operation = tool.removeprefix("schedule_")
        if self._closed:
            return error_result(ToolError("internal_error", CLOSED_MESSAGE))
        try:
            if tool == "schedule_create":
                return self._create(agent, args)
            if tool == "schedule_list":
                return self._list(agent, args)
            if tool == "schedule_delete":
                return self._delete(agent, args)
            if tool == "schedule_update" and self.lifecycle:
                return self._update(agent, args)
            return error_result(ToolError("invalid_selector", f"Unknown tool {tool!r}."))
        except ToolError as err:
            return error_result(err)
        except _Uncertain as unc:
            extra: dict[str, Any] = {"operation": operation}
            if unc.schedule_id is not None:
                extra["id"] = unc.schedule_id
            return error_result(ToolError("persistence_uncertain", **extra))
        except ScheduleLogError as exc:
            log.error("corrupt schedule log for %s: %s", agent, exc)
            return error_result(ToolError("corrupt_schedule_log"))
        except LockUnavailable:
            log.warning("%s for %s: the agent's lock was busy", tool, agent)
            return error_result(ToolError("internal_error"))
        except redis.RedisError as exc:
            metrics.get().redis_error()
            log.warning("%s for %s: Redis unavailable (%s)", tool, agent, type(exc).__name__)
            return error_result(ToolError("internal_error"))
        except FenceRetriesExhausted as exc:
            log.warning("%s for %s: %s", tool, agent, exc)
            return error_result(ToolError("internal_error"))
        except Exception:
            log.exception("unexpected failure in %s for %s", tool, agent)
            return error_result(ToolError("internal_error"))

    # -- transactions ---------------------------------------------------------------

    def _create(self, agent: str, args: Any) -> ToolResult:
        request = parse_create_args(
            args, max_prompt_bytes=self._settings.max_prompt_bytes, calendar=self.calendar,
            lifecycle=self.lifecycle)
        max_active = self._settings.max_active if self.lifecycle else None

        def attempt(latest: _LatestFold) -> ToolResult:
            session, state = self._preflight(agent, latest)
            now = self._clock()

            def zone() -> str:
                return implicit_zone(derive_zone_context(session))

            change = build_create(request, state, now, zone, max_active=max_active)
            add_log_context(schedule_id=change.schedule.id)
            state = self._append(agent, session, state, change, now)
            self._barrier(agent, change.schedule.id)
            latest.confirmed(state)
            return ok_result(schedule_view(change.schedule, state, now))

        return self._transaction(agent, "create", attempt)

    def _list(self, agent: str, args: Any) -> ToolResult:
        parse_list_args(args)

        def attempt(latest: _LatestFold) -> ToolResult:
            _session, state = self._preflight(agent, latest)
            return ok_result(list_value(state, self._clock()))

        return self._transaction(agent, "list", attempt)

    def _delete(self, agent: str, args: Any) -> ToolResult:
        schedule_id = parse_delete_args(args)
        add_log_context(schedule_id=schedule_id)

        def attempt(latest: _LatestFold) -> ToolResult:
            session, state = self._preflight(agent, latest)
            now = self._clock()
            if state.find(schedule_id) is None:
                return ok_result(delete_value(schedule_id, deleted=False))
            state = self._append(agent, session, state, DeleteChange(id=schedule_id), now)
            self._barrier(agent, schedule_id)
            latest.confirmed(state)
            return ok_result(delete_value(schedule_id, deleted=True))

        return self._transaction(agent, "delete", attempt)

    def _update(self, agent: str, args: Any) -> ToolResult:
        request = parse_update_args(
            args, max_prompt_bytes=self._settings.max_prompt_bytes, calendar=self.calendar)
        add_log_context(schedule_id=request.id)

        def attempt(latest: _LatestFold) -> ToolResult:
            session, state = self._preflight(agent, latest)
            now = self._clock()

            def zone() -> str:
                return implicit_zone(derive_zone_context(session))

            decision = decide_update(request, state, now, zone)
            if isinstance(decision, str):  # NOT_FOUND
                return ok_result(update_not_found_value(request.id))
            record, change = decision
            if change is not None:
                state = self._append(agent, session, state, change, now)
                self._barrier(agent, request.id)
                latest.confirmed(state)
            return ok_result(schedule_view(record, state, now))

        return self._transaction(agent, "update", attempt)

    # -- steps ----------------------------------------------------------------------

    def _transaction(
        self, agent: str, operation: str, attempt: Callable[[_LatestFold], ToolResult]
    ) -> ToolResult:
        """Run ``attempt`` under the agent's lock, re-deciding on fence conflicts, then
        re-arm. Once an attempt has answered, nothing that fails while finishing (the
        re-arm, the lock's release) changes the answer: the log already holds what it
        confirmed (docs/architecture.md#outages)."""
        latest = _LatestFold()
        with self._coord.locks.hold(agent, wait_s=self._settings.tool_lock_wait_s) as held:
            try:
                return retry_fenced(f"{operation} for {agent}", lambda _n: attempt(latest))
            finally:
                self._rearm(agent, latest, held)

    def _rearm(self, agent: str, latest: _LatestFold, held: HeldLock) -> None:
        """Re-arm from the latest confirmed fold (the preflight's, or the mutation's once
        its barrier passed), releasing the lock in the re-arm's own
        write; a failure here is logged, never answered, and the re-arm is owed: retried
        by ``repay_owed`` once Redis answers (docs/architecture.md#owed-re-arms)."""
        if latest.state is None:
            return
        if self._watch is not None:
            self._watch(agent, latest.state)
        try:
            self._coord.rearm(agent, latest.state, self._clock(), release=held)
        except redis.RedisError as exc:
            metrics.get().redis_error()
            self.owed.owe([agent])
            log.warning("re-arm for %s failed (%s); it is woken once Redis answers",
                        agent, type(exc).__name__)
        except Exception:
            self.owed.owe([agent])
            log.exception("re-arm for %s failed; it is woken again", agent)

    def repay_owed(self) -> list[str]:
        """Wake every agent whose re-arm failed (``OwedRearms.repay``): nothing is sent
        when none is owed, so a host calls it on every pass of its loop. Raises
        ``redis.RedisError`` while Redis does not answer (the agents stay owed)."""
        return self.owed.repay(self._coord)

    def _preflight(self, agent: str, latest: _LatestFold) -> tuple[Session, FoldState]:
        """Flush, then fold the confirmed log; a successful preflight asks for a recompute."""
        try:
            self._store.flush(agent)
            session, state = self._store.load(agent)
        except PersistenceError as exc:
            log.warning("preflight failed for %s: %s", agent, exc.reason)
            raise _Uncertain() from None
        latest.confirmed(state)
        return session, state

    def _append(
        self,
        agent: str,
        session: Session,
        state: FoldState,
        change: CreateChange | DeleteChange | UpdateChange,
        now: int,
    ) -> FoldState:
        event = NewEvent(type=SCHEDULE_CHANGE, time=now, data=encode_change(change))
        try:
            appended = self._store.append(agent, [event], expected_seq=len(session.events))
        except PersistenceError as exc:
            log.warning("append failed for %s: %s", agent, exc.reason)
            raise _Uncertain() from None
        return fold_events(state, appended)

    def _barrier(self, agent: str, schedule_id: str) -> None:
        try:
            self._store.flush(agent)
        except PersistenceError as exc:
            log.warning("barrier failed for %s: %s", agent, exc.reason)
            raise _Uncertain(schedule_id) from None

