"""``docs/tool-catalog.md``, rendered from the tool definitions
(docs/architecture.md#management-tools).

``python -m dsh_schedule.shared.core.catalog > docs/tool-catalog.md`` writes it; a test
fails when the committed file is stale.
"""

from __future__ import annotations

import json
from typing import Any

from dsh_schedule.shared.core.catalog import (
    ERROR_WHEN,
    REGENERATE_COMMAND,
    ToolDefinition,
    tool_definitions,
)
from dsh_schedule.shared.core.errors import ERROR_CODES
from dsh_schedule.shared.core.views import NOT_FOUND_CODE


def _json_block(value: Any) -> list[str]:
    return ["```json", json.dumps(value, ensure_ascii=False, indent=2), "```"]


def _tool_section(tool: ToolDefinition, note: str | None = None) -> list[str]:
    """A tool's section: its description, ``note`` when given, its schemas."""
    return [
        f"## `{tool.name}`",
        "",
        tool.description,
        "",
        *([note, ""] if note is not None else []),
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
        *_tool_section(update, note=(
            "Each argument is checked as `schedule_create` checks it, with the same codes; "
            "`invalid_rule` also for a `paused` that is not a boolean, `count` not above the "
            "deliveries already made, `until` before the reminder's next target, or a resume "
            "with no occurrence left. An update that changes nothing appends nothing and "
            "answers the view.")),
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
