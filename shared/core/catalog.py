"""The management tool definitions, defined once (docs/architecture.md#management-tools).

Names, model-facing descriptions, argument schemas and output schemas live here and
nowhere else. ``docs/tool-catalog.md`` is generated from them
(``python -m dsh_schedule.shared.core.catalog > docs/tool-catalog.md``),
``dsh-schedule catalog`` prints
``catalog_json()``, and the two exporters give the OpenAI and Anthropic tool formats.
Each takes ``calendar``: when calendar rules are enabled (docs/decisions.md#calendar-rules)
``schedule_create`` gains the ``cron`` selector and a ``cron`` view; disabled (the
default) every definition is exactly the one without them. Each takes ``lifecycle`` too
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders): ``schedule_update`` is a
fourth tool, ``schedule_create`` gains ``until`` and ``count``, views gain ``paused`` and the
end conditions, and ``limit_exceeded`` joins the codes; disabled, nothing of it is shown.
Schemas are JSON Schema draft 2020-12; argument schemas avoid a top-level
``oneOf``/``anyOf``/``allOf`` so every tool format accepts them, and stay advisory: the
request parser remains the authority on every code.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.errors import ERROR_CODES, V1_ERROR_CODES
from dsh_schedule.shared.core.instant import MAX_SAFE_INTEGER
from dsh_schedule.shared.core.records import MAX_EVERY_SECONDS, MIN_EVERY_SECONDS
from dsh_schedule.shared.core.requests import DEFAULT_MAX_PROMPT_BYTES
from dsh_schedule.shared.core.views import DELIVERY_MODE, NOT_FOUND_CODE

TOOL_NAMES: Final = ("schedule_create", "schedule_list", "schedule_delete")
OPERATIONS: Final = ("create", "list", "delete")
LIFECYCLE_TOOL_NAMES: Final = (*TOOL_NAMES, "schedule_update")
LIFECYCLE_OPERATIONS: Final = (*OPERATIONS, "update")
CATALOG_PATH: Final = "docs/tool-catalog.md"
REGENERATE_COMMAND: Final = f"python -m dsh_schedule.shared.core.catalog > {CATALOG_PATH}"

AT_STRING_PATTERN: Final = (
    r"^(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,3})?"
    r"(Z|(?!-00:00)[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
DATE_PATTERN: Final = r"^(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
TIME_PATTERN: Final = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,3})?$"
INSTANT_PATTERN: Final = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$"

CREATE_DESCRIPTION: Final = (
    "Create a durable reminder in this session. Give prompt (the reminder text, shown back "
    "to you when it is due) and exactly one of: after_seconds (one reminder that many "
    "seconds from now), at (one reminder at an absolute time that must be strictly in the "
    "future), or every_seconds (a fixed-rate reminder repeating every that many seconds; "
    "at least 300). at is either a string with an explicit UTC offset, such as "
    '"2026-12-01T16:00:00Z" or "2026-12-01T17:00:00+01:00", or a local time '
    '{"date": "YYYY-MM-DD", "time": "HH:mm:ss", "time_zone": "Area/Location"}. Leave out '
    "time_zone only when the user's time zone is confirmed for this turn; otherwise the "
    "call answers timezone_confirmation_required, and you should ask the user for their "
    "time zone and pass it. Delivery is session-local: a due reminder arrives in this "
    "session as a user-role message while the session is live; a session that is closed "
    "then receives it after it resumes. Recurring reminders are delivered together, in "
    "batches at least 300 seconds apart. Answers the new schedule's view, or an error "
    "object {code, message}."
)
CALENDAR_SENTENCES: Final = (
    " With calendar rules, cron is a fourth selector: a recurring reminder at local "
    "wall-clock times, given as a five-field cron expression \"minute hour day-of-month "
    'month day-of-week", such as "0 9 * * MON-FRI" (every weekday at 09:00), or as '
    '{"expression": "0 9 * * MON-FRI", "time_zone": "Area/Location"}; the time_zone rule '
    "is the one for a local at. Its times of day must be at least 5 minutes apart. A time "
    "skipped by a daylight-saving change fires when the change ends; a time that happens "
    "twice fires once, the first time."
)
CALENDAR_CREATE_DESCRIPTION: Final = CREATE_DESCRIPTION + CALENDAR_SENTENCES
LIFECYCLE_CREATE_SENTENCES: Final = (
    " A recurring reminder may also end: until (a time given as at is; the last occurrence "
    "is the last one not after it) and count (how many times it is delivered in all, at "
    "least 1); it then shows deliveredCount and leaves the list after its last occurrence. "
    "A one-shot takes neither. A session holds at most a deployment-set number of active "
    "reminders (100 by default); past it a create answers limit_exceeded."
)
LIST_DESCRIPTION: Final = (
    "List every active reminder of this session in creation order. Each view has state "
    '"scheduled" or "overdue" and deliveryMode "session-local" (delivered only while this '
    "session is live). An overdue recurring reminder waiting for the 300-second gap "
    "between recurring batches also shows deliveryNotBefore. Delivered one-shot reminders "
    "and deleted reminders are no longer listed."
)
LIFECYCLE_LIST_SENTENCES: Final = (
    ' A paused reminder has state "paused" and is not delivered until it is resumed. A '
    "reminder with an end condition shows until and/or count, and deliveredCount."
)
UPDATE_DESCRIPTION: Final = (
    'Change an active reminder of this session, keeping its id, such as "schedule-1". Give '
    "id and at least one change: prompt (new text; the timing stays), one of after_seconds, "
    "at or every_seconds{cron} (a new timing, read as schedule_create reads it, counted "
    "from now), paused (true stops it firing; false resumes it: a recurring reminder at "
    "its next regular time, no missed ones; a one-shot whose time passed while paused is "
    "delivered once at once), until or count (end conditions of a recurring reminder). "
    "Only what you give changes; paused changes only when you give it. Answers the "
    'reminder\'s view, or {"id", "updated": false, "code": "schedule_not_found"} when no '
    "active reminder has that id, or an error object {code, message} with "
    "schedule_create's codes."
)
DELETE_DESCRIPTION: Final = (
    'Delete an active reminder of this session by its id, such as "schedule-1". Answers '
    '{"id", "deleted": true}, or {"id", "deleted": false, "code": "schedule_not_found"} '
    "when no active reminder has that id (a delivered one-shot or an already deleted "
    "reminder is no longer active). Deleting a recurring reminder stops all its future "
    "deliveries."
)

ERROR_WHEN: Final[dict[str, str]] = {
    "invalid_prompt": (
        "prompt is missing, not a string, empty after trimming, not storable, or longer "
        f"than the deployment's limit ({DEFAULT_MAX_PROMPT_BYTES} bytes of UTF-8 after "
        "trimming by default); the message names the limit. A recurring create is refused "
        "too when the session's recurring prompts together could make one delivered batch "
        "longer than a session log line may be; the message says so"
    ),
    "invalid_selector": "not exactly one of after_seconds, at, every_seconds, or an unknown key",
    "invalid_rule": (
        "after_seconds is not a positive safe integer, every_seconds is not a safe integer, "
        "at is malformed, names an impossible date or a local time in a daylight-saving gap, "
        "or a delete id is empty, not a string or padded with whitespace"
    ),
    "invalid_time_zone": "time_zone is not UTC or a known IANA Area/Location name",
    "timezone_confirmation_required": (
        "a local at omits time_zone and the session's time zone is not confirmed by this "
        "turn; carries sessionTimeZone and clientTimeZones"
    ),
    "not_future": "the resolved at instant is not strictly after now",
    "time_out_of_range": "the target lies outside years 0001-9999",
    "frequency_too_high": "every_seconds is below 300",
    "corrupt_schedule_log": "the session's schedule history breaks the replay rules",
    "persistence_uncertain": (
        "the session could not be confirmed durable before or after the change; carries "
        "operation and, when known, id"
    ),
    "internal_error": (
        "the lock could not be had in time, the coordination store failed, or anything "
        "unexpected happened; nothing half-done is left"
    ),
    "limit_exceeded": (
        "with the lifecycle on, a create in a session already holding the most active "
        "reminders it may (DSH_SCHEDULE_MAX_ACTIVE, 100 by default); nothing is created"
    ),
}


class ToolDefinition(msgspec.Struct, frozen=True, kw_only=True):
    """One management tool: its name, model-facing description and both schemas."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", **extra, "description": description}


def _object(properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        **extra,
    }


def _at_schema() -> dict[str, Any]:
    local = _object(
        {
            "date": _string("Local calendar date, YYYY-MM-DD.", pattern=DATE_PATTERN),
            "time": _string("Local wall time, HH:mm:ss[.SSS].", pattern=TIME_PATTERN),
            "time_zone": _string(
                'Zone of the local time: "UTC" or an IANA Area/Location name. Omit only '
                "when the user's time zone is confirmed for this turn."
            ),
        },
        ["date", "time"],
    )
    offset = _string(
        "Absolute time with an explicit offset: YYYY-MM-DDTHH:mm:ss[.SSS] then Z or +HH:MM.",
        pattern=AT_STRING_PATTERN,
    )
    return {"description": "When a one-shot reminder is due.", "oneOf": [offset, local]}


def _cron_schema() -> dict[str, Any]:
    expression = _string(
        'Five-field cron expression "minute hour day-of-month month day-of-week", such as '
        '"0 9 * * MON-FRI"; times of day at least 5 minutes apart.',
        minLength=1,
    )
    with_zone = _object(
        {
            "expression": expression,
            "time_zone": _string(
                'Zone the rule is read in: "UTC" or an IANA Area/Location name. Omit only '
                "when the user's time zone is confirmed for this turn."
            ),
        },
        ["expression"],
    )
    return {
        "description": "When a calendar rule recurs, at local wall-clock times.",
        "oneOf": [expression, with_zone],
    }


def _end_schemas() -> dict[str, Any]:
    until = dict(_at_schema())
    until["description"] = (
        "A recurring reminder's end: no occurrence after this time (given as at is).")
    count = {
        "type": "integer",
        "minimum": 1,
        "maximum": MAX_SAFE_INTEGER,
        "description": "A recurring reminder's end: how many times it is delivered in all.",
    }
    return {"until": until, "count": count}


def create_input_schema(calendar: bool = False, lifecycle: bool = False) -> dict[str, Any]:
    """``{prompt, after_seconds? | at? | every_seconds? | cron?, until?, count?}``: prompt
    and exactly one selector (``cron`` only with ``calendar``; the end conditions only with
    ``lifecycle``)."""
    properties = {
        "prompt": _string(
            "The reminder text, shown back to you when it is due. Surrounding whitespace is "
            "trimmed; it must not be empty, and at most "
            f"{DEFAULT_MAX_PROMPT_BYTES} bytes of UTF-8 (32 KiB) unless the deployment set "
            "another limit.",
            minLength=1,
        ),
        "after_seconds": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_SAFE_INTEGER,
            "description": "One-shot reminder this many seconds from now.",
        },
        "at": _at_schema(),
        "every_seconds": {
            "type": "integer",
            "minimum": MIN_EVERY_SECONDS,
            # Any safe integer is accepted; one whose milliseconds are not safe answers
            # time_out_of_range, as its target cannot be represented.
            "maximum": MAX_SAFE_INTEGER,
            "description": "Fixed-rate reminder every this many seconds (at least 300).",
        },
    }
    if calendar:
        properties["cron"] = _cron_schema()
    if lifecycle:
        properties.update(_end_schemas())
        return _object(properties, ["prompt"], minProperties=2, maxProperties=4)
    # prompt plus exactly one selector, without a top-level oneOf.
    return _object(properties, ["prompt"], minProperties=2, maxProperties=2)


def update_input_schema(calendar: bool = False) -> dict[str, Any]:
    """``{id, prompt?, one selector?, paused?, until?, count?}``: id and at least one
    change."""
    create = create_input_schema(calendar, lifecycle=True)["properties"]
    properties = {
        "id": _string('Id of the reminder to change, such as "schedule-1", exactly as listed.',
                      minLength=1),
        **create,
        "paused": {"type": "boolean",
                   "description": "true stops the reminder firing; false resumes it."},
    }
    properties["prompt"] = _string("The new reminder text; the timing stays.", minLength=1)
    properties["until"], properties["count"] = properties.pop("until"), properties.pop("count")
    return _object(properties, ["id"], minProperties=2)


def list_input_schema() -> dict[str, Any]:
    return _object({}, [])


def delete_input_schema() -> dict[str, Any]:
    schedule_id = _string(
        'Id of the reminder to delete, such as "schedule-1", exactly as listed.', minLength=1
    )
    return _object({"id": schedule_id}, ["id"])


def _view_defs(calendar: bool = False, lifecycle: bool = False) -> dict[str, Any]:
    states = ["scheduled", "overdue", "paused"] if lifecycle else ["scheduled", "overdue"]
    common = {
        "id": _string("Session-local schedule id.", minLength=1),
        "prompt": _string("The trimmed reminder text.", minLength=1),
        "scheduledAt": _string("Next target, canonical UTC.", pattern=INSTANT_PATTERN),
        "state": {"enum": states},
        "deliveryMode": {"const": DELIVERY_MODE},
    }
    ends: dict[str, Any] = {}
    if lifecycle:
        ends = {
            "until": _string("No occurrence after this instant.", pattern=INSTANT_PATTERN),
            "count": {"type": "integer", "minimum": 1, "maximum": MAX_SAFE_INTEGER},
            "deliveredCount": {"type": "integer", "minimum": 0,
                               "description": "Occurrences delivered so far."},
        }
    base = ["id", "kind", "prompt", "scheduledAt", "state", "deliveryMode"]
    after = {"type": "integer", "minimum": 1, "maximum": MAX_SAFE_INTEGER}
    every = {"type": "integer", "minimum": MIN_EVERY_SECONDS, "maximum": MAX_EVERY_SECONDS}
    not_before = _string(
        "When an overdue recurring reminder held back by the 300-second batch gap may go out.",
        pattern=INSTANT_PATTERN,
    )
    kinds = ("after", "at", "every", "cron") if calendar else ("after", "at", "every")
    defs = {
        "view": {"oneOf": [{"$ref": f"#/$defs/{k}View"} for k in kinds]},
        "afterView": _object(
            {**common, "kind": {"const": "after"}, "afterSeconds": after}, [*base, "afterSeconds"]
        ),
        "atView": _object({**common, "kind": {"const": "at"}}, base),
        "everyView": _object(
            {
                **common,
                "kind": {"const": "every"},
                "everySeconds": every,
                **ends,
                "deliveryNotBefore": not_before,
            },
            [*base, "everySeconds"],
        ),
    }
    if calendar:
        defs["cronView"] = _object(
            {
                **common,
                "kind": {"const": "cron"},
                "cron": _string("The rule, trimmed, its spaces made single.", minLength=1),
                "timeZone": _string('The zone the rule is read in: "UTC" or Area/Location.'),
                **ends,
                "deliveryNotBefore": not_before,
            },
            [*base, "cron", "timeZone"],
        )
    return defs


def error_schema(lifecycle: bool = False) -> dict[str, Any]:
    """The error object: ``{code, message}`` plus the optional documented extras."""
    return _object(
        {
            "code": {"enum": list(ERROR_CODES if lifecycle else V1_ERROR_CODES)},
            "message": _string("Stable explanation of what to do next."),
            "operation": {"enum": list(LIFECYCLE_OPERATIONS if lifecycle else OPERATIONS)},
            "id": _string("The schedule id concerned, when known."),
            "sessionTimeZone": _string('The session\'s zone, or "unavailable".'),
            "clientTimeZones": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        ["code", "message"],
    )


def _result(description: str, one_of: list[dict[str, Any]], defs: dict[str, Any],
            lifecycle: bool = False) -> dict[str, Any]:
    return {
        "description": description,
        "oneOf": one_of,
        "$defs": {**defs, "error": error_schema(lifecycle)},
    }


def create_output_schema(calendar: bool = False, lifecycle: bool = False) -> dict[str, Any]:
    return _result(
        "The new schedule's view, or an error.",
        [{"$ref": "#/$defs/view"}, {"$ref": "#/$defs/error"}],
        _view_defs(calendar, lifecycle),
        lifecycle,
    )


def list_output_schema(calendar: bool = False, lifecycle: bool = False) -> dict[str, Any]:
    views = {"type": "array", "items": {"$ref": "#/$defs/view"}}
    return _result(
        "The views of all active schedules in creation order, or an error.",
        [views, {"$ref": "#/$defs/error"}],
        _view_defs(calendar, lifecycle),
        lifecycle,
    )


def update_output_schema(calendar: bool = False) -> dict[str, Any]:
    schedule_id = _string("The id that was asked for.")
    not_found = _object(
        {"id": schedule_id, "updated": {"const": False}, "code": {"const": NOT_FOUND_CODE}},
        ["id", "updated", "code"],
    )
    return _result(
        "The schedule's view once updated; not found is an answer, not an error.",
        [{"$ref": "#/$defs/view"}, {"$ref": "#/$defs/notFound"}, {"$ref": "#/$defs/error"}],
        {**_view_defs(calendar, lifecycle=True), "notFound": not_found},
        lifecycle=True,
    )


def delete_output_schema(lifecycle: bool = False) -> dict[str, Any]:
    schedule_id = _string("The id that was asked for.")
    deleted = _object({"id": schedule_id, "deleted": {"const": True}}, ["id", "deleted"])
    not_found = _object(
        {"id": schedule_id, "deleted": {"const": False}, "code": {"const": NOT_FOUND_CODE}},
        ["id", "deleted", "code"],
    )
    return _result(
        "Whether the schedule was deleted; not found is an answer, not an error.",
        [{"$ref": "#/$defs/deleted"}, {"$ref": "#/$defs/notFound"}, {"$ref": "#/$defs/error"}],
        {"deleted": deleted, "notFound": not_found},
        lifecycle,
    )


def tool_definitions(calendar: bool = False, lifecycle: bool = False) -> list[ToolDefinition]:
    """The management tools in catalog order (fresh, independently mutable copies):
    three, and ``schedule_update`` fourth with ``lifecycle``; ``calendar`` gives the
    variant with calendar rules."""
    create = CALENDAR_CREATE_DESCRIPTION if calendar else CREATE_DESCRIPTION
    listing = LIST_DESCRIPTION
    if lifecycle:
        create += LIFECYCLE_CREATE_SENTENCES
        listing += LIFECYCLE_LIST_SENTENCES
    tools = [
        ToolDefinition(
            name="schedule_create",
            description=create,
            input_schema=create_input_schema(calendar, lifecycle),
            output_schema=create_output_schema(calendar, lifecycle),
        ),
        ToolDefinition(
            name="schedule_list",
            description=listing,
            input_schema=list_input_schema(),
            output_schema=list_output_schema(calendar, lifecycle),
        ),
        ToolDefinition(
            name="schedule_delete",
            description=DELETE_DESCRIPTION,
            input_schema=delete_input_schema(),
            output_schema=delete_output_schema(lifecycle),
        ),
    ]
    if lifecycle:
        tools.append(ToolDefinition(
            name="schedule_update",
            description=UPDATE_DESCRIPTION.replace("{cron}", ", cron" if calendar else ""),
            input_schema=update_input_schema(calendar),
            output_schema=update_output_schema(calendar),
        ))
    return tools


def catalog_json(calendar: bool = False, lifecycle: bool = False) -> list[dict[str, Any]]:
    """What ``dsh-schedule catalog`` prints: name, description, inputSchema, outputSchema."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "inputSchema": tool.input_schema,
            "outputSchema": tool.output_schema,
        }
        for tool in tool_definitions(calendar, lifecycle)
    ]


def openai_tools(calendar: bool = False, lifecycle: bool = False) -> list[dict[str, Any]]:
    """The tools in the OpenAI function-calling format."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
            },
        }
        for tool in tool_definitions(calendar, lifecycle)
    ]


def anthropic_tools(calendar: bool = False, lifecycle: bool = False) -> list[dict[str, Any]]:
    """The tools in the Anthropic tool-use format."""
    return [
        {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        for tool in tool_definitions(calendar, lifecycle)
    ]


def _json_block(value: Any) -> list[str]:
    return ["```json", json.dumps(value, ensure_ascii=False, indent=2), "```"]


def _tool_section(tool: ToolDefinition) -> list[str]:
    return [
        f"## `{tool.name}`",
        "",
        tool.description,
        "",
        "### Arguments",
        "",
        *_json_block(tool.input_schema),
        "",
        "### Result",
        "",
        *_json_block(tool.output_schema),
        "",
    ]


def _error_section() -> list[str]:
    rows = [f"| `{code}` | {ERROR_WHEN[code]} |" for code in ERROR_CODES]
    return [
        "## Error codes",
        "",
        'An error answers `{"code", "message"}` plus the extras named below, and the tool '
        "result is marked as an error. A delete of an unknown or ended id is not an error: it "
        f'answers `"deleted": false` with `"code": "{NOT_FOUND_CODE}"`.',
        "",
        "| code | when |",
        "| --- | --- |",
        *rows,
        "",
    ]


def _calendar_section() -> list[str]:
    create, listing = tool_definitions(calendar=True)[:2]
    return [
        "## Calendar rules: `schedule_create` with `cron`",
        "",
        "Offered only when calendar rules are enabled: `SchedulePlugin(..., calendar=True)` "
        "(and `AsyncSchedulePlugin`, which both adapters take), or `DSH_SCHEDULE_CALENDAR=on` "
        "for `call`, `host`, `demo` and `web`; `DSH_SCHEDULE_CALENDAR=on dsh-schedule catalog` "
        "prints this variant. Disabled (the default), the tools are exactly the ones above and "
        "`cron` is an unknown key (`invalid_selector`, whose message says how to enable "
        "calendar rules). Records of calendar rules are read "
        "whatever the setting. The semantics, with daylight-saving examples, are in "
        "docs/decisions.md#calendar-rules.",
        "",
        "With them, `cron` answers `invalid_rule` when it is neither an expression string nor "
        '`{"expression", "time_zone"?}`, breaks the grammar, or matches no time in the next '
        "ten years; `frequency_too_high` when two of its times of day can be less than 5 "
        "minutes apart; `invalid_time_zone` and `timezone_confirmation_required` as a local "
        "`at` does (grammar and frequency are checked first; the message names the rule's "
        "`time_zone`); `time_out_of_range` when its "
        "first occurrence lies after 9999.",
        "",
        f"### `{create.name}` description",
        "",
        create.description,
        "",
        "### Arguments",
        "",
        *_json_block(create.input_schema),
        "",
        "### Result",
        "",
        "The result of `schedule_create`, and each item of the `schedule_list` result, may "
        "also be a `cronView`:",
        "",
        *_json_block(listing.output_schema["$defs"]["cronView"]),
        "",
    ]


def _lifecycle_section() -> list[str]:
    create, listing, _delete, update = tool_definitions(lifecycle=True)
    return [
        "## The lifecycle: `schedule_update`, pause and resume, end conditions, the cap",
        "",
        "Offered only when the lifecycle is enabled: `SchedulePlugin(..., lifecycle=True)` "
        "(and `AsyncSchedulePlugin`), or `DSH_SCHEDULE_LIFECYCLE=on` for `call`, `host`, "
        "`demo` and `web`; `DSH_SCHEDULE_LIFECYCLE=on dsh-schedule catalog` prints this "
        "variant (with `DSH_SCHEDULE_CALENDAR=on` too, both). Disabled (the default), the "
        "tools are exactly the ones above, `until`, `count` and `schedule_update` are "
        "unknown, and no cap applies. Records it wrote are read whatever the setting. The "
        "semantics are in docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders.",
        "",
        "With it, `schedule_create` also takes `until` and `count` on a recurring reminder "
        "(`invalid_rule` on a one-shot, for a `count` that is not a safe integer of at least "
        "1, or an `until` before the first target; `until` answers every code `at` does), "
        "and answers `limit_exceeded` once the session holds `DSH_SCHEDULE_MAX_ACTIVE` "
        f"(100 by default) active reminders: {ERROR_WHEN['limit_exceeded']}. An error's "
        "`operation` may be `update`.",
        "",
        f"### `{create.name}` description",
        "",
        create.description,
        "",
        "### `schedule_create` arguments",
        "",
        *_json_block(create.input_schema),
        "",
        f"### `{listing.name}` description",
        "",
        listing.description,
        "",
        "### Views",
        "",
        "Every view's `state` may also be `paused`; an `everyView` (and a `cronView`) may "
        "also carry the end conditions:",
        "",
        *_json_block(listing.output_schema["$defs"]["everyView"]),
        "",
        f"## `{update.name}`",
        "",
        update.description,
        "",
        "Each argument is checked as `schedule_create` checks it, with the same codes; "
        "`invalid_rule` also for a `paused` that is not a boolean, `count` not above the "
        "deliveries already made, `until` before the reminder's next target, or a resume "
        "with no occurrence left. An update that changes nothing appends nothing and "
        "answers the view.",
        "",
        "### Arguments",
        "",
        *_json_block(update.input_schema),
        "",
        "### Result",
        "",
        *_json_block(update.output_schema),
        "",
    ]


def render_catalog_markdown() -> str:
    """The full text of ``docs/tool-catalog.md``."""
    lines = [
        "# Schedule tool catalog",
        "",
        f"Generated by `{REGENERATE_COMMAND}` from `shared/core/catalog.py`; do not edit this "
        "file by hand. A test fails when it is stale.",
        "",
        "Schemas are JSON Schema draft 2020-12. Tool values are rendered as compact JSON with "
        "keys in the order shown; record fields are camelCase while arguments use snake_case.",
        "",
    ]
    for tool in tool_definitions():
        lines.extend(_tool_section(tool))
    lines.extend(_error_section())
    lines.extend(_calendar_section())
    lines.extend(_lifecycle_section())
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render_catalog_markdown())
