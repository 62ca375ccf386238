"""What the console's forms send, read into tool calls (docs/web.md#acting-from-the-page).

The create, edit, pause, resume and delete forms become the tool call the person asked
for, with values passed as typed so the tool, not the page, judges them; a session id and
a filter's local date and time are checked here. ``ConsoleError`` is input the console
cannot use.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Final

from dsh_schedule.shared.core.instant import to_ms
from dsh_schedule.shared.core.timesel import is_valid_zone, load_zone
from dsh_schedule.web import model

MAX_SESSION_ID: Final = 64
SELECTORS: Final = ("after_seconds", "at", "every_seconds", "cron")
_WHOLE: Final = re.compile(r"[+-]?\d{1,18}")
_LOCAL_TIME: Final = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})T(?P<time>\d{2}:\d{2})(?P<s>:\d{2})?")

class ConsoleError(Exception):
    """Input the console cannot use; the message is shown to the person."""


def session_id_ok(text: str) -> bool:
    return (0 < len(text) <= MAX_SESSION_ID and text[0].isascii() and text[0].isalnum()
            and all(c.isascii() and (c.isalnum() or c in "._-") for c in text))


def create_call(form: dict[str, str], *, calendar: bool, lifecycle: bool = False
                ) -> model.ToolCall:
    """The ``schedule_create`` call of the page's create form: its prompt and exactly one
    selector, the kind the form names. Values pass as typed (a whole number as a number),
    so the tool, not the page, judges them. ``at`` is the browser's local date and time
    with the browser's zone; ``cron`` is the rule read in that zone. With the lifecycle on,
    a filled-in ``count`` or ``until`` (read as ``at`` is) goes with it."""
    kind = form.get("selector", "")
    _check_selector(kind, calendar)
    args: dict[str, Any] = {"prompt": form.get("prompt", ""),
                            kind: _selector_value(form, kind)}
    if lifecycle:
        args.update(_end_conditions(form))
    return model.ToolCall("schedule_create", args)


def update_call(form: dict[str, str], *, calendar: bool) -> model.ToolCall:
    """The ``schedule_update`` call of the page's edit form, or of a row's pause or resume
    button: the id, and only what the form changes — a non-empty prompt, the timing
    when a selector other than ``keep`` is picked (read as create reads it), ``paused``
    when the form says ``true`` or ``false``, a filled-in ``until`` or ``count``. The tool
    judges the rest, including an edit that changes nothing."""
    args: dict[str, Any] = {"id": form.get("id", "")}
    if form.get("prompt", "").strip():
        args["prompt"] = form["prompt"]
    kind = form.get("selector", "keep") or "keep"
    if kind != "keep":
        _check_selector(kind, calendar)
        args[kind] = _selector_value(form, kind)
    paused = form.get("paused", "")
    if paused in ("true", "false"):
        args["paused"] = paused == "true"
    elif paused:
        raise ConsoleError("paused is true or false")
    args.update(_end_conditions(form))
    return model.ToolCall("schedule_update", args)


def _check_selector(kind: str, calendar: bool) -> None:
    offered = SELECTORS if calendar else SELECTORS[:3]
    if kind not in offered:
        raise ConsoleError(f"the selector is one of {', '.join(offered)}")


def _selector_value(form: dict[str, str], kind: str) -> Any:
    value = form.get(kind, "").strip()
    zone = form.get("clientTimeZone", "").strip()
    if kind in ("after_seconds", "every_seconds"):
        return _whole(value)
    if kind == "at":
        return _local_at(value, zone)
    if kind == "cron" and zone:
        return {"expression": value, "time_zone": zone}
    return value


def _end_conditions(form: dict[str, str]) -> dict[str, Any]:
    """``count`` and ``until`` when filled in (``until`` read as a local ``at`` is)."""
    found: dict[str, Any] = {}
    if count := form.get("count", "").strip():
        found["count"] = _whole(count)
    if until := form.get("until", "").strip():
        found["until"] = _local_at(until, form.get("clientTimeZone", "").strip())
    return found


def _whole(value: str) -> Any:
    return int(value) if _WHOLE.fullmatch(value) else value


def _local_at(value: str, zone: str) -> Any:
    """The browser's local date and time as an ``at`` object in the browser's zone (the
    text as typed when it is no such time: the tool says why)."""
    match = _LOCAL_TIME.fullmatch(value)
    if match is None:
        return value
    selector = {"date": match["date"], "time": match["time"] + (match["s"] or ":00")}
    if zone:
        selector["time_zone"] = zone
    return selector


def delete_call(form: dict[str, str]) -> model.ToolCall:
    """The ``schedule_delete`` call of a reminder's delete button."""
    return model.ToolCall("schedule_delete", {"id": form.get("id", "")})


def local_instant(text: str, zone: str) -> int:
    """Epoch ms of a form's local date and time (``YYYY-MM-DDTHH:MM[:SS]``) in ``zone``
    (UTC when it is no zone Schedule accepts); ConsoleError when it is no such time."""
    try:
        local = datetime.fromisoformat(text.strip())
    except ValueError:
        local = None
    if local is None or local.tzinfo is not None:
        raise ConsoleError(f"{text!r} is not a local date and time such as 2030-01-01T06:00")
    where = load_zone(zone) if is_valid_zone(zone) else UTC
    return to_ms(local.replace(tzinfo=where))

