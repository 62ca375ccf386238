"""The in-memory ``SessionStore``: the same contract in process memory, plus faults.

It ships with the package (exported by ``dsh_schedule``) so tests, a host's as ours, and
single-process demos can run without a filesystem. Fault injection lets tests make
appends and flushes fail and check which flushes were attempted; appended events that no
flush has confirmed yet are tracked (``unflushed``) but never lost (unless
``lose_unflushed``). Those hooks are the fake's API for tests, with no production caller
by design (docs/decisions.md#layout).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError
from dsh_schedule.shared.core.events import Event, EventLog, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.codec import fork_header, number_events, stored_event
from dsh_schedule.shared.store.dueindex import due_of, due_page
from dsh_schedule.shared.store.foldcache import LogDigest, touches_schedule
from dsh_schedule.shared.store.ids import escape_session_id
from dsh_schedule.shared.store.port import DUE_PAGE, DueEntry, SessionExists, missing_session


class _Log:
    """One session: header, events, how many of them a flush confirmed, the fold and
    ledger (``LogDigest``) the JSONL store keeps too."""

    def __init__(self, header: SessionHeader, events: Sequence[Event]) -> None:
        self.header = header
        self.events: list[Event] = list(events)
        self.durable = len(self.events)
        self.digest = LogDigest(header.seedLength or 0)
        self.digest.feed(self.events)
        # The index entry: (next due moment, the log length it was derived from); None
        # until one is written (an append of a schedule/change) or folded (due_index).
        self.due: tuple[int | None, int] | None = None

    def session(self) -> Session:
        return Session(
            header=self.header, events=EventLog(self.events), ledger=self.digest.ledger()
        )


class MemoryStore:
    """``SessionStore`` in memory. Thread-safe; one lock guards every session.

    Faults (all raise ``PersistenceError`` exactly where the file store would):
    ``fail_next_append(n)`` makes the next n appends fail at the write, after the fence
    and the invariant passed, with nothing written; ``fail_next_flush(n)`` and
    ``fail_flushes`` make ``flush`` fail with the events kept; ``lose_unflushed`` then
    drops what no flush confirmed, as a crashed database does; ``fail_reads`` makes
    ``read`` and ``load`` fail. ``create`` and ``fork`` are durable on return and consult
    no flush fault; they are not counted as flush calls.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logs: dict[str, _Log] = {}
        self._append_failures = 0
        self._flush_failures = 0
        self.fail_flushes = False
        self.fail_reads = False
        self.flush_calls: list[str] = []
        # How often a log was read: ``read``, ``load`` and folds of the due index.
        self.log_reads = 0

    # -- fault injection and inspection -------------------------------------------------

    def fail_next_append(self, n: int = 1) -> None:
        """The next ``n`` appends that pass the fence and the invariant fail to write."""
        with self._lock:
            self._append_failures += n

    def fail_next_flush(self, n: int = 1) -> None:
        """The next ``n`` flushes of an existing session fail."""
        with self._lock:
            self._flush_failures += n

    def flush_count(self, session_id: str) -> int:
        """How many flushes of ``session_id`` were attempted, failed ones included."""
        with self._lock:
            return self.flush_calls.count(session_id)

    def unflushed(self, session_id: str) -> tuple[Event, ...]:
        """The appended events no successful flush has confirmed yet."""
        with self._lock:
            log = self._get(session_id)
            return tuple(log.events[log.durable :])

    def lose_unflushed(self, session_id: str) -> tuple[Event, ...]:
        """What a database that crashed does to the commits it had not yet written (the
        PostgreSQL store's asynchronous appends): the appended events no flush confirmed
        are gone, and the session reads as it did at its last confirmed flush. Returns
        them."""
        with self._lock:
            log = self._get(session_id)
            lost = tuple(log.events[log.durable :])
            self._logs[session_id] = _Log(log.header, log.events[: log.durable])
            return lost

    # -- the SessionStore contract --------------------------------------------------------

    def create(self, header: SessionHeader) -> None:
        escape_session_id(header.id)
        with self._lock:
            if header.id in self._logs:
                raise SessionExists(header.id)
            self._logs[header.id] = _Log(header, ())

    def fork(self, parent_id: str, child_id: str, *, created_at_ms: int) -> SessionHeader:
        escape_session_id(child_id)
        with self._lock:
            parent = self._get(parent_id)
            if child_id in self._logs:
                raise SessionExists(child_id)
            header = fork_header(parent.header, child_id, created_at_ms, len(parent.events))
            self._logs[child_id] = _Log(header, parent.events)
            return header

    def exists(self, session_id: str) -> bool:
        escape_session_id(session_id)
        with self._lock:
            return session_id in self._logs

    def sessions(self) -> list[str]:
        with self._lock:
            return sorted(self._logs)

    def read(self, session_id: str) -> Session:
        with self._lock:
            return self._readable(session_id).session()

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        with self._lock:
            log = self._readable(session_id)
            return log.session(), log.digest.fold()

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        # The values, the refusals and the encoding failures of a store that writes them
        # to a file.
        candidates = tuple(stored_event(e) for e in number_events(events, expected_seq))
        with self._lock:
            log = self._get(session_id)
            if len(log.events) != expected_seq:
                raise FenceConflict(expected_seq, len(log.events))
            log.digest.check(candidates)
            if self._append_failures > 0:
                self._append_failures -= 1
                raise PersistenceError(f"injected write failure for session {session_id!r}")
            log.events.extend(candidates)
            log.digest.feed(candidates)
            if touches_schedule(candidates):
                log.due = (due_of(log.digest), len(log.events))
            return candidates

    def flush(self, session_id: str) -> None:
        escape_session_id(session_id)
        with self._lock:
            self.flush_calls.append(session_id)
            log = self._get(session_id)
            if self.fail_flushes or self._flush_failures > 0:
                if not self.fail_flushes:
                    self._flush_failures -= 1
                raise PersistenceError(f"injected flush failure for session {session_id!r}")
            log.durable = len(log.events)

    def due_index(
        self, *, before_ms: int | None = None, after: str | None = None, limit: int = DUE_PAGE
    ) -> list[DueEntry]:
        with self._lock:
            by_key = {escape_session_id(session_id): session_id for session_id in self._logs}
            keys = sorted(by_key)
            start = 0 if after is None else bisect.bisect_right(keys, escape_session_id(after))
            ids = [by_key[key] for key in keys[start:]]
            return due_page(ids, self._due_entry, before_ms=before_ms, limit=limit)

    # -- the index's faults and inspection (the crash between a log and its index) -------

    def due_entries(self) -> dict[str, tuple[int | None, int] | None]:
        """Every session's index entry as kept (None: none kept)."""
        with self._lock:
            return {session_id: log.due for session_id, log in self._logs.items()}

    def set_due_entry(self, session_id: str, entry: tuple[int | None, int] | None) -> None:
        """Put back an index entry (``due_entries``), as a crash between the two writes
        leaves it; None drops it."""
        with self._lock:
            self._get(session_id).due = entry

    # -- internals ------------------------------------------------------------------------

    def _due_entry(self, session_id: str) -> DueEntry | None:
        log = self._logs[session_id]
        if log.due is None or log.due[1] != len(log.events):
            self.log_reads += 1  # the log is folded again
            log.due = (due_of(log.digest), len(log.events))
        due_ms, length = log.due
        return None if due_ms is None else DueEntry(session_id, due_ms, length)

    def _get(self, session_id: str) -> _Log:
        escape_session_id(session_id)
        log = self._logs.get(session_id)
        if log is None:
            raise missing_session(session_id)
        return log

    def _readable(self, session_id: str) -> _Log:
        log = self._get(session_id)
        self.log_reads += 1
        if self.fail_reads:
            raise PersistenceError(f"injected read failure for session {session_id!r}")
        return log
