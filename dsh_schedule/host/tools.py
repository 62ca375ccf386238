"""The management transactions (docs/architecture.md#management-tools): create, list,
delete and, with the lifecycle, update.

Shape checks run before the queue. Then each call is one log transaction
(``shared/transaction.py``) whose decider, a pure function of the read log and one ``now``
sample, says what to append and what to answer once it is confirmed.

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
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.core.errors import ScheduleLogError, ToolError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.records import (
    CreateChange,
    DeleteChange,
    UpdateChange,
    encode_change,
)
from dsh_schedule.shared.core.requests import (
    CreateRequest,
    build_create,
    parse_create_args,
    parse_delete_args,
    parse_list_args,
)
from dsh_schedule.shared.core.timecontext import derive_zone_context, implicit_zone
from dsh_schedule.shared.core.update_requests import (
    UpdateRequest,
    decide_update,
    parse_update_args,
)
from dsh_schedule.shared.core.views import (
    ToolResult,
    delete_value,
    error_result,
    list_value,
    ok_result,
    schedule_view,
    update_not_found_value,
)
from dsh_schedule.shared.logging_setup import add_log_context, log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import (
    Decision,
    FenceRetriesExhausted,
    LogTransactions,
    OwedRearms,
    PersistenceUncertain,
    Read,
)

log = logging.getLogger(__name__)

CLOSED_MESSAGE: Final = "Schedule is no longer available in this agent; nothing was changed."


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
        announce: bool = False,
    ) -> None:
        self.calendar = settings.calendar if calendar is None else calendar
        self.lifecycle = settings.lifecycle if lifecycle is None else lifecycle
        # ``watch`` is told each re-arm's fold: the host's watchdog keeps the agent's next
        # due moment. ``owed``: the re-arms Redis failed, repaid by ``repay_owed``.
        self._tx = LogTransactions(store, coordination, clock, owed=owed, watch=watch)
        self.owed = self._tx.owed
        # ``announce``: a process that is not the agents' host (``dsh-schedule call``) names
        # each agent it wrote for on its host's ready stream, so that host's watchdog looks
        # at the agent (docs/architecture.md#repairing-lost-keys).
        self._announce = announce
        self._coordination = coordination
        self._settings = settings
        self._closed = False

    def close(self) -> None:
        """Stop new work: later calls answer ``internal_error`` and touch nothing."""
        self._closed = True

    def call(self, agent: str, tool: str, args: Any) -> ToolResult:
        """Run one tool call; every failure becomes a closed-code error value."""
        recorder = metrics.get()
        started = time.perf_counter() if recorder.enabled else 0.0
        with log_context(agent=agent):
            result = self._call(agent, tool, args)
            if self._announce and tool != "schedule_list":
                self._tell_host(agent)
        if recorder.enabled:
            code = result.value.get("code") if result.is_error else "ok"
            recorder.tool_call(tool, str(code), time.perf_counter() - started)
        return result

    def _tell_host(self, agent: str) -> None:
        """Name the agent on its host's ready stream: the host watches it (its watchdog
        knows only its own tool calls' moments) and repairs what Redis lost of it. A
        failure is said, never raised: the answer stands."""
        try:
            self._coordination.announce([agent])
        except redis.RedisError as exc:
            log.warning("%s: its host was not told of this call (%s)", agent,
                        type(exc).__name__)

    def repay_owed(self) -> list[str]:
        """Wake every agent whose re-arm failed (``OwedRearms.repay``): nothing is sent
        when none is owed, so a host calls it on every pass of its loop. Raises
        ``redis.RedisError`` while Redis does not answer (the agents stay owed)."""
        return self._tx.repay_owed()

    def _call(self, agent: str, tool: str, args: Any) -> ToolResult:
        operation = tool.removeprefix("schedule_")
        if self._closed:
            return error_result(ToolError("internal_error", CLOSED_MESSAGE))
        try:
            decide = self._decider(tool, args)
            return self._tx.transact(agent, decide, what=f"{operation} for {agent}",
                                     wait_s=self._settings.tool_lock_wait_s)
        except ToolError as err:
            return error_result(err)
        except PersistenceUncertain as unc:
            extra: dict[str, Any] = {"operation": operation}
            if unc.subject is not None:
                extra["id"] = unc.subject
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

    def _decider(self, tool: str, args: Any) -> Callable[[Read, int], Decision[ToolResult]]:
        """The decider of a well-formed call; shape errors are ``ToolError``s, raised
        before any lock is taken."""
        if tool == "schedule_create":
            return create_decider(parse_create_args(
                args, max_prompt_bytes=self._settings.max_prompt_bytes,
                calendar=self.calendar, lifecycle=self.lifecycle),
                max_active=self._settings.max_active if self.lifecycle else None)
        if tool == "schedule_list":
            parse_list_args(args)
            return decide_list
        if tool == "schedule_delete":
            schedule_id = parse_delete_args(args)
            add_log_context(schedule_id=schedule_id)
            return delete_decider(schedule_id)
        if tool == "schedule_update" and self.lifecycle:
            request = parse_update_args(
                args, max_prompt_bytes=self._settings.max_prompt_bytes, calendar=self.calendar)
            add_log_context(schedule_id=request.id)
            return update_decider(request)
        raise ToolError("invalid_selector", f"Unknown tool {tool!r}.")


# -- the deciders: pure functions of (read, now) -------------------------------------------


def create_decider(
    request: CreateRequest, *, max_active: int | None
) -> Callable[[Read, int], Decision[ToolResult]]:
    """A create: the record ``build_create`` makes at ``now``, answered with its view in
    the fold that holds it."""

    def decide(read: Read, now: int) -> Decision[ToolResult]:
        def zone() -> str:
            return implicit_zone(derive_zone_context(read.session))

        change = build_create(request, read.state, now, zone, max_active=max_active)
        return Decision(events=(_change_event(change, now),), subject=change.schedule.id,
                        then=lambda after: ok_result(schedule_view(change.schedule, after, now)))

    return decide


def decide_list(read: Read, now: int) -> Decision[ToolResult]:
    """A list writes nothing: the schedules of the confirmed fold."""
    return Decision(events=(), then=lambda state: ok_result(list_value(state, now)))


def delete_decider(schedule_id: str) -> Callable[[Read, int], Decision[ToolResult]]:
    """A delete: a delete record when the schedule is active, otherwise nothing."""

    def decide(read: Read, now: int) -> Decision[ToolResult]:
        if read.state.find(schedule_id) is None:
            return Decision(events=(), then=lambda _state: ok_result(
                delete_value(schedule_id, deleted=False)))
        return Decision(events=(_change_event(DeleteChange(id=schedule_id), now),),
                        subject=schedule_id, then=lambda _state: ok_result(
                            delete_value(schedule_id, deleted=True)))

    return decide


def update_decider(request: UpdateRequest) -> Callable[[Read, int], Decision[ToolResult]]:
    """An update: only what changed appended (``decide_update``), answered with the
    record's view; an id not active after the preflight is not found."""

    def decide(read: Read, now: int) -> Decision[ToolResult]:
        def zone() -> str:
            return implicit_zone(derive_zone_context(read.session))

        decision = decide_update(request, read.state, now, zone)
        if isinstance(decision, str):  # NOT_FOUND
            return Decision(events=(), then=lambda _state: ok_result(
                update_not_found_value(request.id)))
        record, change = decision
        events = () if change is None else (_change_event(change, now),)
        return Decision(events=events, subject=request.id,
                        then=lambda state: ok_result(schedule_view(record, state, now)))

    return decide


def _change_event(change: CreateChange | DeleteChange | UpdateChange, now: int) -> NewEvent:
    return NewEvent(type=SCHEDULE_CHANGE, time=now, data=encode_change(change))
