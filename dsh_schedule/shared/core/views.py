"""The canonical tool values and their rendering (docs/architecture.md#management-tools).

A view is what ``schedule_create`` and ``schedule_list`` answer for one active record; a
delete value is what ``schedule_delete`` answers. Keys are in exactly the documented
order, and ``render`` turns any value into the deterministic compact JSON the model sees.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

import msgspec

from dsh_schedule.shared.core.due import gate_opens_ms
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import MAX_MS, format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    RECURRING_TYPES,
    AfterSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    has_end,
)

DELIVERY_MODE: Final = "session-local"
NOT_FOUND_CODE: Final = "schedule_not_found"

ViewState = Literal["scheduled", "overdue", "paused"]


def view_state(record: Schedule, now_ms: int) -> ViewState:
    """``paused`` while paused; else ``overdue`` once ``now`` has reached the record's
    target, else ``scheduled``."""
    if record.paused:
        return "paused"
    return "overdue" if now_ms >= parse_instant(record.scheduledAt) else "scheduled"


def delivery_not_before_ms(record: Schedule, state: FoldState, now_ms: int) -> int | None:
    """When an overdue recurring (``every`` or ``cron``) record held back by the recurring
    gate may go out.

    None for one-shots, for records that are not overdue, when the gate is open, and
    when the gate would open after 9999-12-31T23:59:59.999Z: no instant can name that
    time, so the view leaves it out rather than show a time it is not.
    """
    if not isinstance(record, RECURRING_TYPES) or view_state(record, now_ms) != "overdue":
        return None
    gate = gate_opens_ms(state)
    if gate is None or now_ms >= gate or gate > MAX_MS:
        return None
    return gate


def schedule_view(record: Schedule, state: FoldState, now_ms: int) -> dict[str, Any]:
    """The view of one active record at ``now``, keys in the documented order."""
    view: dict[str, Any] = {"id": record.id, "kind": record.kind, "prompt": record.prompt}
    if isinstance(record, AfterSchedule):
        view["afterSeconds"] = record.afterSeconds
    elif isinstance(record, EverySchedule):
        view["everySeconds"] = record.everySeconds
    elif isinstance(record, CronSchedule):
        view["cron"] = record.cron
        view["timeZone"] = record.timeZone
    view["scheduledAt"] = record.scheduledAt
    # End conditions (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders):
    # shown only on a record that has one, so every other view is as before.
    if has_end(record) and isinstance(record, RECURRING_TYPES):
        if record.until is not None:
            view["until"] = record.until
        if record.count is not None:
            view["count"] = record.count
        view["deliveredCount"] = record.deliveredCount
    view["state"] = view_state(record, now_ms)
    view["deliveryMode"] = DELIVERY_MODE
    not_before = delivery_not_before_ms(record, state, now_ms)
    if not_before is not None:
        view["deliveryNotBefore"] = format_instant(not_before)
    return view


def list_value(state: FoldState, now_ms: int) -> list[dict[str, Any]]:
    """The ``schedule_list`` value: the view of every active record in create order."""
    return [schedule_view(record, state, now_ms) for record in state.active]


def delete_value(id: str, deleted: bool) -> dict[str, Any]:
    """The ``schedule_delete`` value; a not-found answer carries ``schedule_not_found``."""
    if deleted:
        return {"id": id, "deleted": True}
    return {"id": id, "deleted": False, "code": NOT_FOUND_CODE}


def update_not_found_value(id: str) -> dict[str, Any]:
    """What ``schedule_update`` answers for an id no active record has."""
    return {"id": id, "updated": False, "code": NOT_FOUND_CODE}


def render(value: Any) -> str:
    """Deterministic compact JSON: insertion order kept, non-ASCII kept, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool call answers: the rendered content, the error flag and the value."""

    content: str
    is_error: bool
    value: Any


def ok_result(value: Any) -> ToolResult:
    """A successful answer (a delete not-found is one too)."""
    return ToolResult(content=render(value), is_error=False, value=value)


def error_result(err: ToolError) -> ToolResult:
    """An error answer carrying the canonical error value of ``err``."""
    value = err.value()
    return ToolResult(content=render(value), is_error=True, value=value)
