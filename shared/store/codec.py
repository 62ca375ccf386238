"""The session log line codec (docs/architecture.md#session-logs): line 1 the header, then
one event per line, each a compact JSON object.

Hosts written in other languages may store text that is not valid Unicode, such as a
lone UTF-16 surrogate escaped as ``"\\ud800"`` in a user message. JSON allows that escape,
so such a line is well formed: it decodes to a string holding the lone surrogate, and a
value holding one is written with the same escape, so it reads back unchanged. Whether
the value is acceptable is the reader's business: a ``schedule/change`` holding one is
corrupt by the replay rules, any other event is kept as it is.

No I/O happens here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final, TypeVar

import msgspec

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import Event, NewEvent, SessionHeader

_T = TypeVar("_T")

_ENCODER: Final = msgspec.json.Encoder()
_EVENT_DECODER: Final = msgspec.json.Decoder(Event)
_HEADER_DECODER: Final = msgspec.json.Decoder(SessionHeader)

# A \uD800-\uDFFF escape, the only JSON that the fast decoder refuses but JSON allows.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def encode_header(header: SessionHeader) -> bytes:
    """Line 1 of a session file: ``type`` and ``version`` always, None fields omitted."""
    fields = {"type": header.type, "version": header.version, **msgspec.to_builtins(header)}
    return _encode(fields) + b"\n"


def encode_event(event: Event) -> bytes:
    """One event line, ``{"type","seq","time","data"}``."""
    return _encode(event) + b"\n"


def decode_header_line(line: bytes, session_id: str | None) -> SessionHeader:
    """Line 1; ScheduleLogError unless it is a session header for ``session_id`` (None:
    any id)."""
    header = _decode(line, _HEADER_DECODER, SessionHeader)
    if header is None:
        raise _malformed(1)
    if header.type != "session" or session_id not in (None, header.id):
        raise _malformed(1, "not this session's header")
    return header


def decode_event_line(line: bytes, seq: int) -> Event:
    """The event line that must carry ``seq``; ScheduleLogError when it is malformed."""
    line_no = seq + 2
    event = _decode(line, _EVENT_DECODER, Event)
    if event is None:
        raise _malformed(line_no)
    if event.seq != seq:
        raise _malformed(line_no, f"seq {event.seq} where {seq} was expected")
    return event


def stored_value(data: Any) -> Any:
    """``data`` as it reads back once a store has written it: the JSON round trip, with
    the same encoding failures a file store meets."""
    line = _encode(data)
    try:
        return msgspec.json.decode(line)
    except msgspec.DecodeError:
        return _slow_decode(line)


def fork_header(
    parent: SessionHeader, child_id: str, created_at_ms: int, length: int
) -> SessionHeader:
    """The header of a fork of ``parent`` taken when it had ``length`` events."""
    return SessionHeader(
        id=child_id,
        createdAt=created_at_ms,
        timeZone=parent.timeZone,
        parentSession=parent.id,
        seedLength=length,
    )


def number_events(events: Iterable[NewEvent], first_seq: int) -> tuple[Event, ...]:
    """``events`` as log events numbered from ``first_seq``."""
    return tuple(
        Event(type=e.type, seq=first_seq + i, time=e.time, data=e.data)
        for i, e in enumerate(events)
    )


def _malformed(line_no: int, why: str = "") -> ScheduleLogError:
    return ScheduleLogError(f"log line {line_no} malformed{': ' + why if why else ''}")


def _encode(value: Any) -> bytes:
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:
        pass
    # Only text holding a lone surrogate gets here. A surrogate can only sit inside a
    # JSON string, where its \u escape is an equivalent spelling that stays valid UTF-8.
    text = json.dumps(
        msgspec.to_builtins(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _decode(line: bytes, decoder: msgspec.json.Decoder[_T], kind: type[_T]) -> _T | None:
    """The line decoded as ``kind``; None when it is no such JSON object."""
    try:
        return decoder.decode(line)
    except msgspec.DecodeError:
        pass
    if _SURROGATE_ESCAPE.search(line) is None:
        return None
    try:
        return msgspec.convert(_slow_decode(line), type=kind, strict=True)
    except (ValueError, RecursionError):  # msgspec.ValidationError included
        return None


def _slow_decode(line: bytes) -> Any:
    """Strict JSON that may hold lone surrogate escapes; ValueError when it is none."""
    return json.loads(line.decode("utf-8"), parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
