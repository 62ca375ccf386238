"""Which zone an ``at`` object without ``time_zone`` means (docs/architecture.md#time).

The zone is implicit only when the session header fixes ``timeZone``, the current open
turn holds a time-context reading, and the person's messages of that turn carry exactly
one distinct ``clientTimeZone``, equal to the header zone. Everything is derived from the
original owners in the log (header and user-rpc sources); nothing is copied or cached.
Malformed non-Schedule events never raise here: they contribute nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import (
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
    Session,
)

UNAVAILABLE: Final[str] = "unavailable"
TIME_CONTEXT_PLUGIN: Final[str] = "time-context"

_MSG_CONFIRM: Final[str] = (
    "This local time has no time_zone, and the user's time zone is not confirmed for this "
    "request. Ask the user which time zone they mean, then pass at.time_zone explicitly "
    '("UTC" or an IANA Area/Location name), or give at as a string with Z or a ±HH:MM '
    "offset."
)


class ZoneContext(msgspec.Struct, frozen=True, kw_only=True):
    """What the log says about zones for the current request.

    ``client_zones`` is sorted and unique, and empty when the open turn holds no
    time-context reading.
    """

    session_zone: str | None
    client_zones: tuple[str, ...] = ()
    has_reading: bool = False


def _data(event: Event) -> dict[str, Any]:
    return event.data if isinstance(event.data, dict) else {}


def _same_value(left: object, right: object) -> bool:
    # Strict: a turn id 1 is not the turn id True, nor 1.0.
    return type(left) is type(right) and left == right


def open_turn_start(events: Sequence[Event]) -> int | None:
    """Index of the ``turn/start`` of the current open turn, or None when none is open.

    Walk back from the end: a ``step/end`` or ``turn/end`` before any ``step/start``
    means no turn is open; otherwise the ``step/start``'s turn is open, starting at the
    last ``turn/start`` of that turn.
    """
    for index in range(len(events) - 1, -1, -1):
        kind = events[index].type
        if kind in (STEP_END, TURN_END):
            return None
        if kind == STEP_START:
            data = _data(events[index])
            if "turn" not in data:
                return None
            return _last_turn_start(events, data["turn"], index)
    return None


def _last_turn_start(events: Sequence[Event], turn: object, before: int) -> int | None:
    for index in range(before, -1, -1):
        event = events[index]
        if event.type == TURN_START and _same_value(_data(event).get("turn"), turn):
            return index
    return None


def _source(event: Event) -> dict[str, Any]:
    source = _data(event).get("source")
    return source if isinstance(source, dict) else {}


def _is_reading(source: dict[str, Any]) -> bool:
    return source.get("kind") == "plugin" and source.get("plugin") == TIME_CONTEXT_PLUGIN


def _client_zone(source: dict[str, Any]) -> str | None:
    zone = source.get("clientTimeZone")
    if source.get("kind") == "user" and isinstance(zone, str):
        return zone
    return None


def _header_zone(session: Session) -> str | None:
    zone = session.header.timeZone
    return zone if isinstance(zone, str) and zone != "" else None


def derive_zone_context(session: Session) -> ZoneContext:
    """The session zone, the open turn's client zones and whether it has a reading."""
    session_zone = _header_zone(session)
    start = open_turn_start(session.events)
    if start is None or start < session.seed_length:
        # A turn copied from a fork's parent is not this session's own open turn.
        return ZoneContext(session_zone=session_zone)
    zones: set[str] = set()
    has_reading = False
    for event in session.events[start:]:
        if event.type != USER_MESSAGE:
            continue
        source = _source(event)
        has_reading = has_reading or _is_reading(source)
        zone = _client_zone(source)
        if zone is not None:
            zones.add(zone)
    return ZoneContext(
        session_zone=session_zone,
        client_zones=tuple(sorted(zones)) if has_reading else (),
        has_reading=has_reading,
    )


def implicit_zone(context: ZoneContext) -> str:
    """The session zone when the open turn confirms it; else the confirmation error.

    Raises ``timezone_confirmation_required`` carrying ``sessionTimeZone`` (the header
    zone or ``"unavailable"``) and ``clientTimeZones`` (sorted, unique; empty without a
    reading).
    """
    zone = context.session_zone
    if zone is not None and context.has_reading and context.client_zones == (zone,):
        return zone
    raise ToolError(
        "timezone_confirmation_required",
        _MSG_CONFIRM,
        sessionTimeZone=zone if zone is not None else UNAVAILABLE,
        clientTimeZones=sorted(set(context.client_zones)) if context.has_reading else [],
    )
