"""The session store port (docs/architecture.md#session-logs) and what every store
implementation shares.

The session event log is the only authority for Schedule state. A store keeps one
append-only log per session: a header, then events whose ``seq`` equals their index.
This module holds the ``SessionStore`` protocol, the session id escaping that maps any
id onto one safe file name segment, the codec of log lines and the incremental fold
the stores cache.
No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol

import msgspec

from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import EMPTY, FoldState, check_candidate, fold_events

# Bytes that stand for themselves in an escaped id. Upper-case letters, '.' and '%' are
# escaped too, so two ids never meet on a case-insensitive filesystem and no segment is
# '.', '..' or hidden.
_PLAIN: Final[frozenset[int]] = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_-")
# NAME_MAX is 255 bytes; the JSONL store adds the ".jsonl" suffix.
MAX_ESCAPED_LENGTH: Final[int] = 255 - len(".jsonl")


class SessionExists(PersistenceError):
    """``create`` or ``fork`` named a session that already exists."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} already exists")


class SessionStore(Protocol):
    """Append-only session logs, safe across threads and (for files) processes.

    Every method raises ``ValueError`` for an id ``escape_session_id`` rejects.
    I/O failures are ``PersistenceError``; a session that cannot be read is never
    answered as an empty log.
    """

    def create(self, header: SessionHeader) -> None:
        """Create ``header.id`` with no events, durably (file and directory flushed).

        ``SessionExists`` when the id is taken; ``PersistenceError`` when the session
        could not be created or its durability not confirmed.
        """
        ...

    def fork(self, parent_id: str, child_id: str, *, created_at_ms: int) -> SessionHeader:
        """Create ``child_id`` durably as a fork of ``parent_id`` and return its header.

        The child's events are a copy of the parent's (same ``seq``); its header carries
        ``parentSession``, ``seedLength`` = the number of copied events and the parent's
        ``timeZone``. Schedule in the child folds only its own suffix.
        ``SessionExists`` when the child exists, ``PersistenceError`` when the parent
        cannot be read.
        """
        ...

    def exists(self, session_id: str) -> bool:
        """Whether the session exists (``PersistenceError`` when that cannot be known)."""
        ...

    def sessions(self) -> list[str]:
        """The ids of all sessions, sorted."""
        ...

    def read(self, session_id: str) -> Session:
        """The header and every committed event.

        ``PersistenceError`` when the session is missing or unreadable;
        ``ScheduleLogError`` when a line before the last is malformed or ``seq`` is not
        contiguous from 0. A torn final line (a crash mid-write) is ignored.
        """
        ...

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        """``read`` plus the fold of ``events[seedLength:]``, both cached incrementally.

        ``ScheduleLogError`` when the session's own Schedule records are corrupt or
        ``seedLength`` lies outside the log.
        """
        ...

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        """Append ``events`` atomically, numbered from ``expected_seq``; return them.

        ``FenceConflict`` when the log's length is not ``expected_seq`` (the fencing
        token: a stale lock holder cannot slip an append in). When any event is a
        ``schedule/change`` the invariant runs first: ``ScheduleLogError`` if the log
        plus the candidates would not fold. A failed write is rolled back before
        ``PersistenceError`` is raised. In every failure nothing is appended. The
        appended events are not durable until ``flush``.
        """
        ...

    def flush(self, session_id: str) -> None:
        """The durability barrier: everything appended so far is durable on return.

        ``PersistenceError`` when that cannot be confirmed; the appended events stay
        where they are (they may or may not be durable) and a later successful flush
        confirms them. Never removes anything.
        """
        ...


def escape_session_id(session_id: str) -> str:
    """The one file name segment for ``session_id``; ``unescape_session_id`` inverts it.

    Every UTF-8 byte outside ``[a-z0-9_-]`` becomes ``%XX`` (upper-case hex), so the
    mapping is injective even on case-insensitive filesystems and never yields '/', '.',
    '..' or a hidden name. ``ValueError`` for a non-string, empty or non-UTF-8 id, or one
    whose segment would exceed ``MAX_ESCAPED_LENGTH``.
    """
    if not isinstance(session_id, str) or session_id == "":
        raise ValueError("a session id is a non-empty string")
    try:
        raw = session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a session id must be encodable as UTF-8") from None
    segment = "".join(chr(b) if b in _PLAIN else f"%{b:02X}" for b in raw)
    if len(segment) > MAX_ESCAPED_LENGTH:
        raise ValueError("the session id is too long for a file name")
    return segment


def unescape_session_id(segment: str) -> str:
    """The session id ``segment`` stands for; ``ValueError`` if no id escapes to it."""
    raw = bytearray()
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "%":
            raw.append(_hex_byte(segment[i + 1 : i + 3]))
            i += 3
        else:
            raw.extend(char.encode("utf-8"))
            i += 1
    try:
        session_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not an escaped session id") from None
    if escape_session_id(session_id) != segment:
        raise ValueError("not an escaped session id")
    return session_id


def _hex_byte(digits: str) -> int:
    if len(digits) != 2 or not all(d in "0123456789ABCDEF" for d in digits):
        raise ValueError("not an escaped session id")
    return int(digits, 16)


# The log line codec: line 1 the header, then one event per line
# (docs/architecture.md#session-logs).

_ENCODER: Final = msgspec.json.Encoder()
_EVENT_DECODER: Final = msgspec.json.Decoder(Event)
_HEADER_DECODER: Final = msgspec.json.Decoder(SessionHeader)


def encode_header(header: SessionHeader) -> bytes:
    """Line 1 of a session file: ``type`` and ``version`` always, None fields omitted."""
    fields = {"type": header.type, "version": header.version, **msgspec.to_builtins(header)}
    return _ENCODER.encode(fields) + b"\n"


def encode_event(event: Event) -> bytes:
    """One event line, ``{"type","seq","time","data"}``."""
    return _ENCODER.encode(event) + b"\n"


def _malformed(line_no: int, why: str = "") -> ScheduleLogError:
    return ScheduleLogError(f"log line {line_no} malformed{': ' + why if why else ''}")


def decode_header_line(line: bytes, session_id: str | None) -> SessionHeader:
    """Line 1; ScheduleLogError unless it is a session header for ``session_id`` (None:
    any id)."""
    try:
        header = _HEADER_DECODER.decode(line)
    except msgspec.DecodeError:
        raise _malformed(1) from None
    if header.type != "session" or session_id not in (None, header.id):
        raise _malformed(1, "not this session's header")
    return header


def decode_event_line(line: bytes, seq: int) -> Event:
    """The event line that must carry ``seq``; ScheduleLogError when it is malformed."""
    line_no = seq + 2
    try:
        event = _EVENT_DECODER.decode(line)
    except msgspec.DecodeError:
        raise _malformed(line_no) from None
    if event.seq != seq:
        raise _malformed(line_no, f"seq {event.seq} where {seq} was expected")
    return event


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


def touches_schedule(events: Iterable[Event]) -> bool:
    """Whether the invariant must run before ``events`` are appended."""
    return any(e.type == SCHEDULE_CHANGE for e in events)


def missing_session(session_id: str) -> PersistenceError:
    """The error for a session that does not exist (never an empty log)."""
    return PersistenceError(f"session {session_id!r} does not exist")


class IncrementalFold:
    """The fold of one log's own suffix, continued as the log grows.

    Not thread-safe: the store guards it with the lock of the log it belongs to. A log
    only grows, so once its Schedule records are found corrupt they stay corrupt; the
    store starts a new ``IncrementalFold`` when the log is replaced.
    """

    def __init__(self, seed_length: int) -> None:
        self._seed_length = seed_length
        self._folded = seed_length
        self._state: FoldState = EMPTY
        self._error: ScheduleLogError | None = None

    def advance(self, events: Sequence[Event]) -> FoldState:
        """The fold of ``events[seed_length:]``, folding only what is new since last time."""
        if self._error is not None:
            raise ScheduleLogError(self._error.reason, self._error.seq)
        if not 0 <= self._seed_length <= len(events):
            raise ScheduleLogError("seedLength outside the log")
        if len(events) > self._folded:
            try:
                self._state = fold_events(self._state, events[self._folded :])
            except ScheduleLogError as exc:
                self._error = exc
                raise
            self._folded = len(events)
        return self._state

    def appended(self, state: FoldState, length: int) -> None:
        """Record the fold checked for an append that brought the log to ``length``."""
        self._state = state
        self._folded = length


def check_append(
    fold: IncrementalFold, events: Sequence[Event], candidates: tuple[Event, ...]
) -> FoldState | None:
    """The invariant before an append: the fold after ``candidates``, or None when no
    candidate is a ``schedule/change`` (nothing to check). ``ScheduleLogError`` when the
    log plus the candidates would not fold."""
    if not touches_schedule(candidates):
        return None
    return check_candidate(fold.advance(events), candidates)


__all__ = [
    "MAX_ESCAPED_LENGTH",
    "IncrementalFold",
    "SessionExists",
    "SessionStore",
    "check_append",
    "decode_event_line",
    "decode_header_line",
    "encode_event",
    "encode_header",
    "escape_session_id",
    "fork_header",
    "missing_session",
    "number_events",
    "touches_schedule",
    "unescape_session_id",
]
