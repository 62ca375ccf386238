"""The session log line codec (docs/architecture.md#session-logs): line 1 the header, then
one event per line, each a compact JSON object.

Hosts written in other languages may store text that is not valid Unicode, such as a
lone UTF-16 surrogate escaped as ``"\\ud800"`` in a user message. JSON allows that escape,
so such a line is well formed: it decodes to a string holding the lone surrogate, and a
value holding one is written with the same escape, so it reads back unchanged. Whether
the value is acceptable is the reader's business: a ``schedule/change`` holding one is
corrupt by the replay rules, any other event is kept as it is.

Every line stays within the log's bounds, ``MAX_LINE_DEPTH`` arrays and objects nested
and ``MAX_LINE_BYTES`` long: an event beyond them is refused when it is encoded (so an
append writes nothing), and a line beyond them is malformed when it is read (a file
written by another program). JSON decoders recurse once per level and raise
``RecursionError`` near 1000 levels, wherever the caller's stack already is; a bound far
below that, checked before decoding, makes what a store writes readable from any stack.

No I/O happens here.
"""

from __future__ import annotations

import itertools
import json
import re
from array import array
from collections.abc import Iterable
from typing import Any, Final, TypeVar

import msgspec

from dsh_schedule.shared.core import batchbound
from dsh_schedule.shared.core.errors import EventOutOfBounds, ScheduleLogError
from dsh_schedule.shared.core.events import Event, NewEvent, SessionHeader

_T = TypeVar("_T")

# The bounds of every session log line (docs/architecture.md#session-logs): how deep its
# arrays and objects nest, the line's own object counted (an event's data may nest one
# level less), and its UTF-8 bytes, the newline not counted.
MAX_LINE_DEPTH: Final[int] = 128
MAX_LINE_BYTES: Final[int] = batchbound.MAX_LINE_BYTES  # what a create's bound assumes
# What stands in for a value nested too deep in data a host records as a model gave it.
NESTING_OMITTED: Final[str] = f"[omitted: nested deeper than {MAX_LINE_DEPTH} levels]"

_ENCODER: Final = msgspec.json.Encoder()
_EVENT_DECODER: Final = msgspec.json.Decoder(Event)
_HEADER_DECODER: Final = msgspec.json.Decoder(SessionHeader)

# A \uD800-\uDFFF escape, the only JSON that the fast decoder refuses but JSON allows.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# For measuring how deep a line nests: every byte but a bracket deleted, an opening one
# made the signed byte 1 and a closing one -1.
_BRACKET_STEPS: Final = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_TOO_DEEP: Final = f"nests deeper than {MAX_LINE_DEPTH} arrays and objects"
_UNREAD: Final = object()  # a line not decoded while its bounds were checked
_TOO_LONG: Final = f"is longer than {MAX_LINE_BYTES} bytes"


def encode_header(header: SessionHeader) -> bytes:
    """Line 1 of a session file: ``type`` and ``version`` always, None fields omitted."""
    fields = {"type": header.type, "version": header.version, **msgspec.to_builtins(header)}
    return _encode(fields) + b"\n"


def encode_event(event: Event) -> bytes:
    """One event line, ``{"type","seq","time","data"}``; EventOutOfBounds when the line
    would lie beyond the log's bounds (``MAX_LINE_DEPTH``, ``MAX_LINE_BYTES``)."""
    try:
        line = _encode(event)
    except RecursionError:
        raise EventOutOfBounds(event.type, _TOO_DEEP) from None
    fault = line_fault(line)
    if fault is not None:
        raise EventOutOfBounds(event.type, fault)
    return line + b"\n"


def line_fault(line: bytes) -> str | None:
    """Why ``line`` (without its newline) lies beyond the log's bounds, or None when it
    does not. Brackets inside strings do not count. For a line that is no JSON the depth
    measured is at least as deep as a decoder goes before it finds out."""
    return _bounds(line)[0]


def _bounds(line: bytes) -> tuple[str | None, Any]:
    """``line_fault``, and the line's plain JSON value when finding out took decoding it
    (``_UNREAD`` otherwise)."""
    if len(line) > MAX_LINE_BYTES:
        return _TOO_LONG, _UNREAD
    # Nesting deeper than the bound takes more opening brackets, and twice as many bytes.
    if len(line) <= 2 * MAX_LINE_DEPTH or line.count(b"[") + line.count(b"{") <= MAX_LINE_DEPTH:
        return None, _UNREAD
    if b"\\" not in line:
        # Every quote opens or closes a string: outside them is every other piece.
        outside = b"".join(line.split(b'"')[::2])
        steps = array("b", outside.translate(_BRACKET_STEPS, _NOT_BRACKETS))
        deep = max(itertools.accumulate(steps), default=0) > MAX_LINE_DEPTH
        return (_TOO_DEEP if deep else None), _UNREAD
    # Escapes (JSON text inside a string, typically): the decoder finds the strings
    # faster than byte operations do, and what it decoded is not decoded again.
    try:
        try:
            value = msgspec.json.decode(line)
        except msgspec.DecodeError:
            value = _slow_decode(line)  # a lone surrogate escape, or no JSON
    except RecursionError:
        # Deeper than the decoder can go from here, and the bound is far below that.
        return _TOO_DEEP, _UNREAD
    except ValueError:
        # No JSON: a decoder that tries it again from here stops at the same place.
        return None, _UNREAD
    return (_TOO_DEEP if _nests_deeper(value) else None), value


def _nests_deeper(value: Any) -> bool:
    """Whether the arrays and objects of a plain JSON value nest deeper than the bound."""
    depth = 0
    level = [value] if isinstance(value, dict | list) else []
    while level:
        depth += 1
        if depth > MAX_LINE_DEPTH:
            return True
        level = [item for container in level
                 for item in (container.values() if isinstance(container, dict) else container)
                 if isinstance(item, dict | list)]
    return False


def clip_nesting(data: Any) -> Any:
    """An event's ``data`` with every array or object (list, tuple or dict) that would nest
    deeper than its line may replaced by ``NESTING_OMITTED``; ``data`` itself when nothing
    does. For what a host records as a model gave it, such as tool arguments."""
    return _clip(data, MAX_LINE_DEPTH - 1)


def _clip(value: Any, room: int) -> Any:
    """``value`` with the containers more than ``room`` levels down replaced."""
    if isinstance(value, dict):
        if room == 0:
            return NESTING_OMITTED
        items = {key: _clip(item, room - 1) for key, item in value.items()}
        changed = any(items[key] is not item for key, item in value.items())
        return items if changed else value
    if isinstance(value, list | tuple):
        if room == 0:
            return NESTING_OMITTED
        elements = [_clip(item, room - 1) for item in value]
        changed = any(new is not old for new, old in zip(elements, value, strict=True))
        return elements if changed else value
    return value


def decode_header_line(line: bytes, session_id: str | None) -> SessionHeader:
    """Line 1; ScheduleLogError unless it is a session header for ``session_id`` (None:
    any id)."""
    header = _decode(line, _HEADER_DECODER, SessionHeader, 1)
    if header.type != "session" or session_id not in (None, header.id):
        raise _malformed(1, "not this session's header")
    return header


def decode_event_line(line: bytes, seq: int) -> Event:
    """The event line that must carry ``seq``; ScheduleLogError when it is malformed."""
    line_no = seq + 2
    event = _decode(line, _EVENT_DECODER, Event, line_no)
    if event.seq != seq:
        raise _malformed(line_no, f"seq {event.seq} where {seq} was expected")
    return event


def stored_event(event: Event) -> Event:
    """``event`` as it reads back once a store has written it: the line's round trip, with
    the same refusals and encoding failures a file store meets."""
    return decode_event_line(encode_event(event)[:-1], event.seq)


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


def _decode(
    line: bytes, decoder: msgspec.json.Decoder[_T], kind: type[_T], line_no: int
) -> _T:
    """Line ``line_no`` decoded as ``kind``; ScheduleLogError when it lies beyond the log's
    bounds or is no such JSON object."""
    fault, value = _bounds(line)
    if fault is not None:
        raise _malformed(line_no, fault)
    if value is _UNREAD:
        try:
            return decoder.decode(line)
        except msgspec.DecodeError:
            pass
        if _SURROGATE_ESCAPE.search(line) is None:
            raise _malformed(line_no)
        try:
            value = _slow_decode(line)
        except (ValueError, RecursionError):
            raise _malformed(line_no) from None
    try:
        return msgspec.convert(value, type=kind, strict=True)
    except ValueError:  # msgspec.ValidationError included
        raise _malformed(line_no) from None


def _slow_decode(line: bytes) -> Any:
    """Strict JSON that may hold lone surrogate escapes; ValueError when it is none."""
    return json.loads(line.decode("utf-8"), parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
