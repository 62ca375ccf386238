"""Sessions moved between stores line by line (docs/architecture.md#session-logs): a
session's exact lines from any store (``session_lines``), ``copy_sessions`` between any
two (resumable, each copy verified line by line), for ``dsh-schedule store copy`` and
``dsh-schedule export``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import NewEvent
from dsh_schedule.shared.store.codec import (
    decode_event_line,
    decode_header_line,
    encode_event,
    encode_header,
)
from dsh_schedule.shared.store.port import SessionStore


@runtime_checkable
class HoldsLines(Protocol):
    """A store that gives and takes a session's exact lines (without their newlines)."""

    def session_lines(self, session_id: str) -> tuple[bytes, list[bytes]]:
        """The header line and every committed event line."""
        ...

    def import_lines(self, session_id: str, header: bytes, lines: Sequence[bytes]) -> None:
        """Create ``session_id`` durably holding exactly these lines (checked as a read
        checks them); ``SessionExists`` when it exists."""
        ...


class CopyReport(msgspec.Struct, kw_only=True):
    """What ``copy_sessions`` did, by session id."""

    copied: list[str] = msgspec.field(default_factory=list)
    already: list[str] = msgspec.field(default_factory=list)
    extended: list[str] = msgspec.field(default_factory=list)
    conflicts: list[str] = msgspec.field(default_factory=list)


def session_lines(store: SessionStore, session_id: str) -> tuple[bytes, list[bytes]]:
    """The session's header line and event lines, as its store keeps them (a store that
    keeps no lines gives them as the JSONL store would write them)."""
    if isinstance(store, HoldsLines):
        return store.session_lines(session_id)
    session = store.read(session_id)
    return (encode_header(session.header)[:-1],
            [encode_event(event)[:-1] for event in session.events])


def check_lines(session_id: str, header: bytes, lines: Sequence[bytes]) -> None:
    """``ScheduleLogError`` unless the lines are a session log for ``session_id``."""
    decode_header_line(header, session_id)
    for seq, line in enumerate(lines):
        decode_event_line(line, seq)


def copy_sessions(source: SessionStore, target: SessionStore, *,
                  progress: Callable[[str, str], None] | None = None) -> CopyReport:
    """Copy every session of ``source`` into ``target``. A session the target holds already
    is left when its lines are the same, extended when they are a prefix of the source's
    (a copy resumed after the source grew), and reported as a conflict otherwise. Every
    session copied or extended is read back from the target and compared line by line:
    ``PersistenceError`` when it differs. ``progress(session_id, what)`` after each one."""
    if not isinstance(target, HoldsLines):
        raise PersistenceError("the target store cannot take sessions line by line")
    report = CopyReport()
    for session_id in source.sessions():
        header, lines = session_lines(source, session_id)
        if target.exists(session_id):
            have_header, have = session_lines(target, session_id)
            seed = decode_header_line(header, session_id).seedLength or 0
            if have_header == header and have == lines:
                outcome = "already"
            elif have_header == header and lines[: len(have)] == have and len(have) >= seed:
                tail = [decode_event_line(line, seq)
                        for seq, line in enumerate(lines[len(have):], start=len(have))]
                target.append(session_id, [NewEvent(type=e.type, time=e.time, data=e.data)
                                           for e in tail], len(have))
                target.flush(session_id)
                outcome = "extended"
            else:
                outcome = "conflicts"
        else:
            target.import_lines(session_id, header, lines)
            outcome = "copied"
        if outcome in ("copied", "extended") and session_lines(target, session_id) != (
                header, lines):
            raise PersistenceError(f"session {session_id!r}: the copy differs from its source")
        getattr(report, outcome).append(session_id)
        if progress is not None:
            progress(session_id, outcome)
    return report
