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
request parser remains the authority on every code. The schemas are built in
``toolschemas``; the markdown is rendered by ``catalogdoc``.
"""

from __future__ import annotations

import sys
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.requests import DEFAULT_MAX_PROMPT_BYTES
from dsh_schedule.shared.core.toolschemas import (
    create_input_schema,
    create_output_schema,
    delete_input_schema,
    delete_output_schema,
    list_input_schema,
    list_output_schema,
    update_input_schema,
    update_output_schema,
)

TOOL_NAMES: Final = ("schedule_create", "schedule_list", "schedule_delete")
LIFECYCLE_TOOL_NAMES: Final = (*TOOL_NAMES, "schedule_update")
CATALOG_PATH: Final = "docs/tool-catalog.md"
REGENERATE_COMMAND: Final = f"python -m dsh_schedule.shared.core.catalog > {CATALOG_PATH}"

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


if __name__ == "__main__":
    from dsh_schedule.shared.core.catalogdoc import render_catalog_markdown

    sys.stdout.write(render_catalog_markdown())
