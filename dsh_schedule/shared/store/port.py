"""The session store port (docs/architecture.md#session-logs).

The session event log is the only authority for Schedule state. A store keeps one
append-only log per session: a header, then events whose ``seq`` equals their index.
This module holds the ``SessionStore`` protocol, the failures every store shares, and
``append_durably`` (one session appended and flushed in one write where the store can:
``AppendsDurably``, the PostgreSQL store's synchronously committed statement); the
stores are built from ``ids`` (session id escaping), ``codec`` (the log lines) and
``foldcache`` (the fold and ledger kept per log, and the append invariant); the JSONL
store adds ``sessioncache`` (what it keeps per file, within a byte budget) and ``lazylog``
(events read back from the file). No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple, Protocol, runtime_checkable

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import Event, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState


class SessionExists(PersistenceError):
    """``create`` or ``fork`` named a session that already exists."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} already exists")


# How many entries ``SessionStore.due_index`` answers at most, unless asked for another number.
DUE_PAGE: Final[int] = 1000


class DueEntry(NamedTuple):
    """One session of the index of next due moments: ``due_ms`` is
    ``core.due.next_due_moment_ms`` of the session's fold at log length ``length``."""

    session_id: str
    due_ms: int
    length: int


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
        """The header and every committed event, and the delivery ledger of the own
        suffix (``Session.ledger``; None when the Schedule records do not fold).

        ``len(events)`` is the log's length, the fence for the next append. The events
        need not all be in memory: one read back from the log when indexed raises
        ``PersistenceError`` if the log has been replaced since. A session never changes
        as the log grows after it was read.

        ``PersistenceError`` when the session is missing or unreadable;
        ``ScheduleLogError`` when a line before the last is malformed (one beyond the
        line bounds of ``codec`` included) or ``seq`` is not contiguous from 0. A torn
        final line (a crash mid-write) is ignored. A string
        holding a lone surrogate (another host's text) reads back as written.
        """
        ...

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        """``read`` plus the fold of ``events[seedLength:]``, both kept incrementally;
        the session always carries its ledger.

        ``ScheduleLogError`` when the session's own Schedule records are corrupt or
        ``seedLength`` lies outside the log.
        """
        ...

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        """Append ``events`` atomically, numbered from ``expected_seq``; return them.

        ``EventOutOfBounds`` when an event's line would lie beyond the line bounds
        (``codec.MAX_LINE_DEPTH``, ``codec.MAX_LINE_BYTES``), before anything else is
        checked: what an append accepts, a read accepts. ``FenceConflict`` when the
        log's length is not ``expected_seq`` (the fencing token: a stale lock holder
        cannot slip an append in). When any event is a
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

    def due_index(
        self, *, before_ms: int | None = None, after: str | None = None, limit: int = DUE_PAGE
    ) -> list[DueEntry]:
        """One page of the index of each session's next due moment (docs/architecture.md#
        the-index-of-next-due-moments): the sessions after the session id ``after`` (None:
        from the first), in the order of their escaped ids (``ids.escape_session_id``, the
        same in every store), that have a next due moment (and,
        with ``before_ms``, one before it); at most ``limit`` (>= 1) of them. A page
        shorter than ``limit`` is the last; the next page starts ``after`` the last id of
        this one.

        The log stays the authority: an entry is derived from the log at ``length`` and a
        log that grew since (a crash between the append and the index write, a copied-in
        file) is folded again before it is answered, as is a session with no entry or an
        unreadable one. So an answer is never later than the log's fold says: a stale
        entry can only make a timer early. A session that has nothing active, or whose
        own Schedule records do not fold, has no entry. Each page is read at its own
        moment: a session whose entry changes while the pages are read (an append, which
        re-arms its own timer) may be answered twice or not at all.
        ``PersistenceError`` when the index or a log cannot be read.
        """
        ...


@runtime_checkable
class AppendsDurably(Protocol):
    """A store that appends to a session and makes the append durable in one write."""

    def append_durably(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[tuple[Event, ...], PersistenceError | None]:
        """``append`` then ``flush`` of that session: the events appended (raising as
        ``append`` does), and the flush's failure (None: everything appended to the
        session so far is durable)."""
        ...


def append_durably(
    store: SessionStore, session_id: str, events: Sequence[NewEvent], expected_seq: int
) -> tuple[tuple[Event, ...], PersistenceError | None]:
    """``store.append`` then ``store.flush`` of the session, in one write when the store
    can (``AppendsDurably``): the events appended (the append's failures raised), and the
    flush's ``PersistenceError`` (None: durable)."""
    if isinstance(store, AppendsDurably):
        return store.append_durably(session_id, events, expected_seq)
    appended = store.append(session_id, events, expected_seq=expected_seq)
    try:
        store.flush(session_id)
    except PersistenceError as exc:
        return appended, exc
    return appended, None


def missing_session(session_id: str) -> PersistenceError:
    """The error for a session that does not exist (never an empty log)."""
    return PersistenceError(f"session {session_id!r} does not exist")


__all__ = ["DUE_PAGE", "AppendsDurably", "DueEntry", "SessionExists", "SessionStore",
           "append_durably", "missing_session"]
