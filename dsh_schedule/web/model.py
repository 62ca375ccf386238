"""The web console's scripted model: a few commands it turns into Schedule tool calls, and
the answer it gives once the tools have answered.

It understands

- ``remind me in 30 seconds to stretch`` (also ``in 5 minutes …``, ``remind me to … in
  2 hours``) → ``schedule_create`` with ``after_seconds``;
- ``every 5 minutes check the build`` → ``schedule_create`` with ``every_seconds``;
- ``at 17:00 call the office`` (optionally ``at 17:00:30``, ``… today``/``tomorrow``,
  ``… on 2026-12-01``, ``… in Europe/Berlin``) → ``schedule_create`` with an ``at``
  object. Without ``in ZONE`` the object has no ``time_zone``: a local time the tool
  accepts only when the turn's time-context reading and the browser's zone confirm the
  session's zone (docs/architecture.md#local-times-without-a-zone). The date is the next
  day on which that local time is still ahead, read in the zone the model was given;
- with calendar rules enabled (docs/decisions.md#calendar-rules): ``every weekday at 09:00
  stand-up`` (also ``every day``, ``every monday`` … ``every sunday``, ``every weekend``,
  optionally ``… in Europe/Berlin``) → ``schedule_create`` with ``cron``: the rule string
  alone (its zone from the turn, as for a bare ``at``), or ``{expression, time_zone}``
  when a zone is named;
- ``list`` → ``schedule_list``;
- ``delete schedule-2`` (or ``cancel``/``remove``) → ``schedule_delete``;
- with the lifecycle on (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders):
  ``pause schedule-2`` and ``resume schedule-2`` → ``schedule_update`` with ``paused``.

Anything else gets no tool call and a short help answer. Pure: ``now`` and the zone are
passed in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import parse_instant, to_datetime
from dsh_schedule.shared.core.timesel import load_zone

HELP: Final = (
    "I understand: “remind me in 30 seconds to stretch”, “every 5 minutes check the "
    "build”, “at 17:00 call the office” (your browser's zone; or “at 17:00 in "
    "Europe/Berlin call the office”), “list” and “delete schedule-2”."
)
LIFECYCLE_HELP: Final = HELP[:-1] + ", “pause schedule-2” and “resume schedule-2”."

_UNITS: Final = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}
_UNIT: Final = r"(?P<unit>seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d)"
_COUNT: Final = r"(?P<n>\d{1,15}|an?|one)"
_ZONE: Final = r"(?P<zone>UTC|[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+){1,2})"

_FLAGS: Final = re.IGNORECASE | re.DOTALL
_AFTER: Final = re.compile(
    rf"(?:remind me\s+)?in\s+{_COUNT}\s*{_UNIT}\s+(?:to\s+)?(?P<prompt>.+)", _FLAGS
)
_AFTER_TAIL: Final = re.compile(
    rf"remind me\s+(?:to\s+)?(?P<prompt>.+?)\s+in\s+{_COUNT}\s*{_UNIT}", _FLAGS
)
_EVERY: Final = re.compile(
    rf"(?:remind me\s+)?every\s+(?:{_COUNT}\s*)?{_UNIT}\s+(?:to\s+)?(?P<prompt>.+)", _FLAGS
)
_AT: Final = re.compile(
    r"(?:remind me\s+)?at\s+(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?"
    r"(?:\s+(?P<day>today|tomorrow)|\s+on\s+(?P<date>\d{4}-\d{2}-\d{2}))?"
    rf"(?:\s+in\s+{_ZONE})?"
    r"\s+(?:to\s+)?(?P<prompt>.+)",
    _FLAGS,
)
_DAYS: Final = {
    "day": "*", "weekday": "MON-FRI", "weekend": "SAT,SUN",
    **{f"{name}day": name[:3].upper() for name in ("mon", "tues", "wednes", "thurs", "fri",
                                                    "satur", "sun")},
}
_CRON: Final = re.compile(
    r"(?:remind me\s+)?every\s+(?P<days>day|weekday|weekend|monday|tuesday|wednesday|thursday"
    r"|friday|saturday|sunday)\s+at\s+(?P<hour>\d{1,2}):(?P<minute>\d{2})"
    rf"(?:\s+in\s+{_ZONE})?"
    r"\s+(?:to\s+)?(?P<prompt>.+)",
    _FLAGS,
)
_LIST: Final = re.compile(
    r"(?:list|ls|show|list reminders|show reminders|what(?:'s| is) scheduled)\??", _FLAGS
)
_DELETE: Final = re.compile(r"(?:delete|cancel|remove)\s+(?P<id>\S+)", _FLAGS)
_PAUSE: Final = re.compile(r"(?P<verb>pause|resume)\s+(?P<id>\S+)", _FLAGS)


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """What the model does with one prompt: tool calls, or a reply without any."""

    calls: tuple[ToolCall, ...] = ()
    reply: str | None = None


@dataclass(frozen=True)
class Answered:
    """One tool call and what it answered (``ToolResult``'s fields)."""

    call: ToolCall
    is_error: bool
    value: Any


def plan(text: str, *, now_ms: int, zone: str | None, calendar: bool = False,
         lifecycle: bool = False) -> Plan:
    """The tool calls for a prompt. ``zone`` is the zone the model reads local times in
    (the session's, from the time-context reading); it only picks the date of a bare
    ``at HH:MM``, it is never passed to the tool. ``calendar`` says whether the tool
    offers calendar rules; only then is ``every weekday at 09:00 …`` a rule. ``lifecycle``
    says whether ``schedule_update`` is offered; only then is ``pause schedule-2`` a call."""
    words = " ".join(text.split())
    if not words:
        return Plan(reply=HELP)
    if _LIST.fullmatch(words):
        return Plan(calls=(ToolCall("schedule_list", {}),))
    if match := _DELETE.fullmatch(words):
        return Plan(calls=(ToolCall("schedule_delete", {"id": match["id"]}),))
    if lifecycle and (match := _PAUSE.fullmatch(words)):
        paused = match["verb"].lower() == "pause"
        return Plan(calls=(ToolCall("schedule_update", {"id": match["id"], "paused": paused}),))
    if match := _AFTER.fullmatch(words) or _AFTER_TAIL.fullmatch(words):
        seconds = _count(match["n"]) * _UNITS[match["unit"].lower()]
        return _create(match["prompt"], after_seconds=seconds)
    if calendar and (match := _CRON.fullmatch(words)):
        return _create(match["prompt"], cron=_cron(match))
    if match := _EVERY.fullmatch(words):
        seconds = _count(match["n"]) * _UNITS[match["unit"].lower()]
        return _create(match["prompt"], every_seconds=seconds)
    if match := _AT.fullmatch(words):
        return _create(match["prompt"], at=_at(match, now_ms=now_ms, zone=zone))
    return Plan(reply=HELP)


def _create(prompt: str, **selector: Any) -> Plan:
    return Plan(calls=(ToolCall("schedule_create", {"prompt": prompt, **selector}),))


def _cron(match: re.Match[str]) -> str | dict[str, str]:
    """The ``cron`` selector: ``minute hour * * days``, with the zone only when named."""
    expression = f"{int(match['minute'])} {int(match['hour'])} * * {_DAYS[match['days'].lower()]}"
    if match["zone"]:
        return {"expression": expression, "time_zone": match["zone"]}
    return expression


def _count(word: str | None) -> int:
    if word is None or word.lower() in ("a", "an", "one"):
        return 1
    return int(word)


def _at(match: re.Match[str], *, now_ms: int, zone: str | None) -> dict[str, str]:
    """The ``at`` object: the local date and time, and ``time_zone`` only when named."""
    hour, minute = int(match["hour"]), int(match["minute"])
    second = int(match["second"] or 0)
    clock = f"{hour:02d}:{minute:02d}:{second:02d}"
    named = match["zone"]
    if match["date"]:
        date = match["date"]
    else:
        local = _local(now_ms, named or zone)
        day = local.date()
        if match["day"] and match["day"].lower() == "tomorrow":
            day += timedelta(days=1)
        elif not match["day"] and (hour, minute, second) <= (
            local.hour, local.minute, local.second
        ):
            day += timedelta(days=1)  # that time has passed today: the next one
        date = day.isoformat()
    selector = {"date": date, "time": clock}
    if named:
        selector["time_zone"] = named
    return selector


def _local(ms: int, zone: str | None) -> datetime:
    """``ms`` as a local wall time in ``zone`` (UTC when there is no usable zone)."""
    moment = to_datetime(ms)
    if zone:
        try:
            return moment.astimezone(load_zone(zone))
        except (ToolError, OverflowError):
            pass
    return moment


def local_text(ms: int, zone: str | None) -> str:
    """``YYYY-MM-DD HH:MM:SS ZONE`` for a person (in UTC without a usable zone)."""
    if zone:
        try:
            return f"{to_datetime(ms).astimezone(load_zone(zone)):%Y-%m-%d %H:%M:%S} {zone}"
        except (ToolError, OverflowError):
            pass
    return f"{to_datetime(ms):%Y-%m-%d %H:%M:%S} UTC"


def answer(answered: Sequence[Answered], *, zone: str | None) -> str:
    """The assistant's answer once the tools have answered."""
    return " ".join(_one(item, zone) for item in answered) or HELP


def _one(item: Answered, zone: str | None) -> str:
    name, value = item.call.name, item.value
    if item.is_error and isinstance(value, dict):
        text = f"{name} answered {value.get('code')}: {value.get('message')}"
        if value.get("code") == "timezone_confirmation_required":
            session_zone = value.get("sessionTimeZone")
            clients = ", ".join(value.get("clientTimeZones") or []) or "no zone"
            text += (f" This session's zone is {session_zone}; this turn carried {clients}."
                     f" Name the zone, e.g. “at 17:00 in {_example_zone(session_zone)} "
                     "call the office”.")
        return text
    if name == "schedule_create" and isinstance(value, dict):
        return f"Set {value['id']}: {_describe(value, zone)}."
    if name == "schedule_list" and isinstance(value, list):
        if not value:
            return "No active reminders."
        listed = "; ".join(f"{view['id']}: {_describe(view, zone)}, {view['state']}"
                           for view in value)
        return f"{len(value)} active: {listed}."
    if name == "schedule_delete" and isinstance(value, dict):
        if value.get("deleted"):
            return f"Deleted {value['id']}."
        return f"{value['id']} is not an active reminder ({value.get('code')})."
    if name == "schedule_update" and isinstance(value, dict):
        return _updated(item.call.args, value, zone)
    return f"{name} answered."


def _updated(args: dict[str, Any], value: dict[str, Any], zone: str | None) -> str:
    """What the model says of an update: paused or resumed when that was all it asked."""
    if value.get("updated") is False:
        return f"{value['id']} is not an active reminder ({value.get('code')})."
    described = _describe(value, zone) + (", paused" if value.get("state") == "paused" else "")
    if set(args) == {"id", "paused"}:
        return f"{'Paused' if args['paused'] else 'Resumed'} {value['id']}: {described}."
    return f"Updated {value['id']}: {described}."


def _describe(view: dict[str, Any], zone: str | None) -> str:
    return _timing(view, zone) + _ends(view, zone)


def _timing(view: dict[str, Any], zone: str | None) -> str:
    when = local_text(parse_instant(view["scheduledAt"]), zone)
    prompt = f"“{view['prompt']}”"
    if view["kind"] == "every":
        return f"{prompt} every {view['everySeconds']} s, next at {when}"
    if view["kind"] == "after":
        return f"{prompt} in {view['afterSeconds']} s, at {when}"
    if view["kind"] == "cron":
        return f"{prompt} on the rule “{view['cron']}” in {view['timeZone']}, next at {when}"
    return f"{prompt} at {when}"


def _ends(view: dict[str, Any], zone: str | None) -> str:
    """A recurring view's end conditions: how many times (and how many delivered), until."""
    text = ""
    if "count" in view:
        text += f", {view['count']} times ({view.get('deliveredCount', 0)} delivered)"
    if "until" in view:
        text += f", until {local_text(parse_instant(view['until']), zone)}"
    return text


def _example_zone(zone: Any) -> str:
    return zone if isinstance(zone, str) and zone != "unavailable" else "Europe/Berlin"
