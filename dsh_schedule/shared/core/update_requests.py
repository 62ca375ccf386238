"""The ``schedule_update`` arguments and the update record they build
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders).

The pure half of the tool (``host/tools.py`` is the transaction around ``decide_update``),
checked as create checks.
``parse_update_args`` checks shape only, in this order:

1. arguments not an object, a key other than ``id``, ``prompt``, the selector keys (with
   ``cron`` only under ``calendar``), ``paused``, ``until`` and ``count``, more than one
   selector key, or no change at all → ``invalid_selector``;
2. ``id`` not a non-empty trimmed string → ``invalid_rule`` (as delete answers);
3. ``prompt`` as create checks it → ``invalid_prompt``;
4. the selector's value as create checks it (``invalid_rule``, ``frequency_too_high``);
5. ``paused`` not a boolean, ``count`` not a safe integer ≥ 1 → ``invalid_rule``.

``build_update`` runs in the transaction with the record the id names and one ``now``:
the timing and ``until`` resolve as create resolves a selector and ``at`` (the same
errors); an end condition on a one-shot, ``count`` not above the deliveries made, or
``until`` before the target answer ``invalid_rule``; a recurring result that would let the
session's recurring batch pass the delivery line's bound answers ``invalid_prompt``, as a
create does (``batchbound``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import msgspec

from dsh_schedule.shared.core.batchbound import (
    MAX_LINE_BYTES,
    batch_limit_message,
    fits_one_batch,
)
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.fold import EMPTY, FoldState
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.lifecycle import resume_target_ms
from dsh_schedule.shared.core.records import (
    RECURRING_TYPES,
    AfterSchedule,
    CronSchedule,
    EverySchedule,
    Schedule,
    UpdateChange,
)
from dsh_schedule.shared.core.replay import apply_update
from dsh_schedule.shared.core.requests import (
    CALENDAR_SELECTOR_KEYS,
    MSG_END_ON_ONE_SHOT,
    MSG_UNTIL,
    MSG_UNTIL_NULL,
    SELECTOR_KEYS,
    CreateRequest,
    SelectorKind,
    build_create,
    parse_create_args,
    parse_delete_args,
    read_count,
)
from dsh_schedule.shared.core.timesel import resolve_at

_LIFECYCLE_KEYS: Final = frozenset({"paused", "until", "count"})
_MSG_SELECTOR: Final[str] = (
    "schedule_update takes id and at least one change: prompt, one of after_seconds, at, "
    "every_seconds{cron}, paused, until or count; no other keys."
)
_MSG_PAUSED: Final[str] = "paused must be true or false."
_MSG_COUNT_REACHED: Final[str] = "count must be above the occurrences already delivered."
_MSG_NO_FUTURE: Final[str] = "The reminder has no occurrence left to resume at."


class UpdateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A shape-checked ``schedule_update`` call; None is "not given"."""

    id: str
    prompt: str | None = None
    timing: CreateRequest | None = None
    paused: bool | None = None
    until: Any = None
    count: int | None = None


def parse_update_args(
    args: Any, *, max_prompt_bytes: int, calendar: bool = False
) -> UpdateRequest:
    """The ``schedule_update`` request, or the first shape error in the module's order."""
    selectors: dict[str, SelectorKind] = CALENDAR_SELECTOR_KEYS if calendar else SELECTOR_KEYS
    message = _MSG_SELECTOR.format(cron=", cron" if calendar else "")
    allowed = {"id", "prompt", *selectors, *_LIFECYCLE_KEYS}
    if not isinstance(args, dict) or not set(args) <= allowed or "id" not in args:
        raise ToolError("invalid_selector", message)
    given = [key for key in selectors if key in args]
    if len(given) > 1 or len(args) == 1:
        raise ToolError("invalid_selector", message)
    schedule_id = parse_delete_args({"id": args["id"]})
    # Create's own checks, so every argument answers exactly as create answers it.
    probe = {"prompt": args.get("prompt", "x"), **{key: args[key] for key in given}}
    if not given:
        probe["after_seconds"] = 1
    checked = parse_create_args(probe, max_prompt_bytes=max_prompt_bytes, calendar=calendar)
    paused = args.get("paused")
    if "paused" in args and not isinstance(paused, bool):
        raise ToolError("invalid_rule", _MSG_PAUSED)
    count = read_count(args["count"]) if "count" in args else None
    if "until" in args and args["until"] is None:
        raise ToolError("invalid_rule", MSG_UNTIL_NULL)
    return UpdateRequest(
        id=schedule_id,
        prompt=checked.prompt if "prompt" in args else None,
        timing=checked if given else None,
        paused=paused,
        until=args["until"] if "until" in args else None,
        count=count,
    )


NotFound = Literal["schedule_not_found"]
NOT_FOUND: Final[NotFound] = "schedule_not_found"


def decide_update(
    request: UpdateRequest, state: FoldState, now_ms: int, zone: Callable[[], str], *,
    line_bytes: int = MAX_LINE_BYTES,
) -> tuple[Schedule, UpdateChange | None] | NotFound:
    """What ``schedule_update`` does to the fold ``state`` at ``now_ms``: ``NOT_FOUND``
    when no active record has the id (never created, delivered, ended or deleted); else
    the record as it will be and the update record to append (None: the request changes
    nothing, nothing is appended). Raises what ``build_update`` raises."""
    record = state.find(request.id)
    if record is None:
        return NOT_FOUND
    change = build_update(request, record, now_ms, zone, active=state.active,
                          line_bytes=line_bytes)
    return (record if change is None else apply_update(record, change)), change


def build_update(
    request: UpdateRequest, record: Schedule, now_ms: int, zone: Callable[[], str], *,
    active: Iterable[Schedule] = (), line_bytes: int = MAX_LINE_BYTES,
) -> UpdateChange | None:
    """The update record ``request`` makes of the active ``record`` at ``now_ms``; None
    when it changes nothing (nothing is appended). Raises the errors of the timing and
    ``until`` as create raises them, ``invalid_rule`` for an end condition that cannot
    hold, and, as create does, ``invalid_prompt`` when the updated record, recurring,
    would let the session's recurring batch (``active``) pass ``line_bytes``."""
    change = _update_change(request, record, now_ms, zone)
    if change is None:
        return None
    updated = apply_update(record, change)
    others = [r for r in active if r.id != record.id]
    if isinstance(updated, RECURRING_TYPES) and not fits_one_batch(others, updated, line_bytes):
        raise ToolError("invalid_prompt", batch_limit_message(line_bytes))
    return change


def _update_change(
    request: UpdateRequest, record: Schedule, now_ms: int, zone: Callable[[], str]
) -> UpdateChange | None:
    fields: dict[str, Any] = {}
    if request.prompt is not None and request.prompt != record.prompt:
        fields["prompt"] = request.prompt
    target = record.scheduledAt
    recurring = isinstance(record, RECURRING_TYPES)
    if request.timing is not None:
        schedule = build_create(request.timing, EMPTY, now_ms, zone).schedule
        timing = _timing_fields(schedule)
        if timing != _timing_fields(record):
            fields.update(timing)
            target, recurring = schedule.scheduledAt, isinstance(schedule, RECURRING_TYPES)
    if request.paused is not None and request.paused != record.paused:
        fields["paused"] = request.paused
        if not request.paused and "kind" not in fields:
            moved = resume_target_ms(record, now_ms)
            if moved is None:
                raise ToolError("invalid_rule", _MSG_NO_FUTURE)
            if format_instant(moved) != record.scheduledAt:
                target = fields["scheduledAt"] = format_instant(moved)
    if (request.until is not None or request.count is not None) and not recurring:
        raise ToolError("invalid_rule", MSG_END_ON_ONE_SHOT)
    # A recurring record keeps its end conditions through a timing change; a one-shot has none.
    until = _current(record, "until") if recurring else None
    if request.until is not None:
        until = format_instant(resolve_at(request.until, now_ms=now_ms, implicit_zone=zone))
        if until != _current(record, "until"):
            fields["until"] = until
    if request.count is not None and request.count != _current(record, "count"):
        delivered = record.deliveredCount if isinstance(record, RECURRING_TYPES) else 0
        if request.count <= delivered:
            raise ToolError("invalid_rule", _MSG_COUNT_REACHED)
        fields["count"] = request.count
    if until is not None and parse_instant(until) < parse_instant(target):
        raise ToolError("invalid_rule", MSG_UNTIL)
    if not fields:
        return None
    return UpdateChange(id=record.id, **fields)


def _current(record: Schedule, name: str) -> Any:
    return getattr(record, name) if isinstance(record, RECURRING_TYPES) else None


def _timing_fields(schedule: Schedule) -> dict[str, Any]:
    fields: dict[str, Any] = {"kind": schedule.kind}
    if isinstance(schedule, AfterSchedule):
        fields["afterSeconds"] = schedule.afterSeconds
    elif isinstance(schedule, EverySchedule):
        fields["everySeconds"] = schedule.everySeconds
    elif isinstance(schedule, CronSchedule):
        fields.update(cron=schedule.cron, timeZone=schedule.timeZone)
    fields["scheduledAt"] = schedule.scheduledAt
    return fields
