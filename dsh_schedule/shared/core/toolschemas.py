"""The JSON Schemas of the management tools' arguments and results
(docs/architecture.md#management-tools).

Draft 2020-12. Argument schemas avoid a top-level ``oneOf``/``anyOf``/``allOf`` so every
tool format accepts them, and stay advisory: the request parser remains the authority on
every code. ``calendar`` adds the ``cron`` selector and view; ``lifecycle`` adds ``until``,
``count``, ``paused``, ``schedule_update`` and ``limit_exceeded``. ``catalog`` assembles
them into the tool definitions.
"""

from __future__ import annotations

from typing import Any, Final

from dsh_schedule.shared.core.errors import ERROR_CODES, V1_ERROR_CODES
from dsh_schedule.shared.core.instant import MAX_SAFE_INTEGER
from dsh_schedule.shared.core.records import MAX_EVERY_SECONDS, MIN_EVERY_SECONDS
from dsh_schedule.shared.core.requests import DEFAULT_MAX_PROMPT_BYTES
from dsh_schedule.shared.core.views import DELIVERY_MODE, NOT_FOUND_CODE

OPERATIONS: Final = ("create", "list", "delete")
LIFECYCLE_OPERATIONS: Final = (*OPERATIONS, "update")

AT_STRING_PATTERN: Final = (
    r"^(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,3})?"
    r"(Z|(?!-00:00)[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
DATE_PATTERN: Final = r"^(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
TIME_PATTERN: Final = r"^([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,3})?$"
INSTANT_PATTERN: Final = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$"


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
