"""What a file store keeps of the session logs it serves, within a byte budget
(docs/architecture.md#session-logs).

Per session file, ``CachedSession`` keeps what the callers of a store need and nothing in
proportion to the log's length beyond one offset per ``MARK_EVERY`` events: the header,
the file's identity and the offset parsed up to, the event count, the fold and the
delivery ledger (``LogDigest``), and a window of the latest events (for the time-context
rule, which looks at the current turn). ``SessionCache`` keeps those entries least
recently used first and drops the oldest once their accounted bytes pass the budget; a
session read again after that is parsed and folded from its file again.

Accounted bytes are an estimate of what an entry holds in memory, computed from what it
keeps (events of the window, the schedule state, the marks), never measured.
"""

from __future__ import annotations

import itertools
import os
import threading
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Final, Protocol, TypeVar

import msgspec

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import Event, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.codec import decode_event_line, decode_header_line
from dsh_schedule.shared.store.foldcache import LogDigest
from dsh_schedule.shared.store.lazylog import MARK_EVERY, FileEvents, read_range

# The window of latest events: at most this many, of at most this many line bytes.
RECENT_EVENTS: Final[int] = 64
RECENT_BYTES: Final[int] = 64 * 1024
# A long file is parsed this many bytes at a time, so parsing holds one block's events.
READ_BLOCK: Final[int] = 4 * 1024 * 1024

_ENTRY_BYTES: Final = 2048  # the entry, its locks, header, digest and window objects
_EVENT_BYTES: Final = 400  # one parsed event of the window, plus twice its line's bytes
_LINE_FACTOR: Final = 2
_MARK_BYTES: Final = 8

# The digest of an entry with no header yet. Shared, and never fed: events come only after
# a header, and the header brings the entry its own digest (``_take``).
_NO_DIGEST: Final = LogDigest(0)


class CacheStats(msgspec.Struct, frozen=True, kw_only=True):
    """How full a ``SessionCache`` is: entries and their accounted bytes."""

    entries: int
    accounted_bytes: int
    budget_bytes: int


def file_stamp(st: os.stat_result) -> tuple[int, ...]:
    """What changes whenever a file's bytes do: identity, size and change times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class CachedSession:
    """What one store has parsed of one session file: its complete lines up to ``offset``.

    Guarded by ``lock``. Whoever changes the entry holds the file's flock as well (taken
    first); ``synced``, the file's stamp when the entry last matched the whole file (None:
    unknown), lets a reader that finds the file still at that stamp use the entry without
    the flock. ``charged`` (the bytes the cache counts for it) and ``flushed`` (the file's
    stamp at this store's last successful fsync) belong to the cache's lock.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parsed_bytes = 0
        self.charged = 0
        self.flushed: tuple[int, ...] | None = None
        self.synced: tuple[int, ...] | None = None
        self._reset(None)

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self.identity = identity
        self.offset = 0
        self.header: SessionHeader | None = None
        self.header_end = 0
        self.digest = _NO_DIGEST
        # Never shrunk in place: a handed-out FileEvents reads them up to its own length.
        self.marks: array[int] = array("q")
        self.recent: list[Event] = []
        self._recent_sizes: list[int] = []
        self._recent_bytes = 0

    @property
    def length(self) -> int:
        """The number of committed events."""
        return self.digest.length

    def sync(self, fd: int, st: os.stat_result, session_id: str | None) -> None:
        """Catch up with the locked file on ``fd``; start over if it was replaced or shrank.

        ``session_id`` is the id the header must carry (None: any id). A malformed line
        raises ``ScheduleLogError`` and leaves the entry at the last block that parsed.
        """
        self.synced = None
        identity = (st.st_dev, st.st_ino)
        if identity != self.identity or st.st_size < self.offset:
            self._reset(identity)
        position = self.offset
        carried: list[bytes] = []  # the start of a line longer than one block
        while position < st.st_size:
            try:
                block = read_range(fd, position, min(st.st_size, position + READ_BLOCK))
            except OSError as exc:
                raise PersistenceError(f"cannot read session {session_id!r}") from exc
            if not block:
                break
            position += len(block)
            self.parsed_bytes += len(block)
            if carried:
                carried.append(block)
                if b"\n" not in block:
                    continue
                block = b"".join(carried)
            used = self._take(block, session_id)
            carried = [block[used:]] if used < len(block) else []
        # Bytes after the last newline are a torn line (a crash mid-write): not committed.
        if position >= st.st_size:
            self.synced = file_stamp(st)

    def _take(self, block: bytes, session_id: str | None) -> int:
        """Parse the complete lines at the start of ``block`` (which starts at ``offset``);
        how many bytes they took. Nothing is kept unless every line parsed."""
        end = block.rfind(b"\n") + 1
        if end == 0:
            return 0
        lines = block[: end - 1].split(b"\n")
        header = self.header
        offset = self.offset
        rest = iter(lines)
        if header is None:
            first = next(rest)
            header = decode_header_line(first, session_id)
            offset += len(first) + 1
        header_end = self.header_end if self.header is not None else offset
        events: list[Event] = []
        sizes: list[int] = []
        marks: list[int] = []
        seq = self.length
        for line in rest:
            events.append(decode_event_line(line, seq))
            if seq % MARK_EVERY == 0:
                marks.append(offset)
            sizes.append(len(line) + 1)
            offset += len(line) + 1
            seq += 1
        if self.header is None:
            self.header = header
            self.header_end = header_end
            self.digest = LogDigest(header.seedLength or 0)
        self._commit(events, sizes, marks, offset)
        return end

    def appended(self, events: tuple[Event, ...], lines: list[bytes],
                 stamp: tuple[int, ...] | None) -> None:
        """Record an append this store wrote at ``offset``, one line per event; ``stamp``:
        the file's stamp after it (None: unknown)."""
        self.synced = stamp
        offset = self.offset
        marks: list[int] = []
        for event, line in zip(events, lines, strict=True):
            if event.seq % MARK_EVERY == 0:
                marks.append(offset)
            offset += len(line)
        self._commit(list(events), [len(line) for line in lines], marks, offset)

    def _commit(self, events: list[Event], sizes: list[int], marks: list[int], offset: int) -> None:
        self.digest.feed(events)
        self.marks.extend(marks)
        self._remember(events, sizes)
        self.offset = offset

    def _remember(self, events: list[Event], sizes: list[int]) -> None:
        """Keep the latest events within the window's bounds."""
        if not events:
            return
        total = self._recent_bytes + sum(sizes)
        if len(self.recent) + len(events) <= RECENT_EVENTS and total <= RECENT_BYTES:
            self.recent.extend(events)  # views end at their own length: appending is safe
            self._recent_sizes.extend(sizes)
            self._recent_bytes = total
            return
        kept = list(itertools.chain(self.recent, events[-RECENT_EVENTS:]))[-RECENT_EVENTS:]
        kept_sizes = list(itertools.chain(self._recent_sizes, sizes[-RECENT_EVENTS:]))
        kept_sizes = kept_sizes[-len(kept) :] if kept else []
        kept_bytes = sum(kept_sizes)
        cut = 0
        while cut < len(kept) and kept_bytes > RECENT_BYTES:
            kept_bytes -= kept_sizes[cut]
            cut += 1
        # New lists: views handed out keep reading the old ones.
        self.recent = kept[cut:]
        self._recent_sizes = kept_sizes[cut:]
        self._recent_bytes = kept_bytes

    def require_header(self, session_id: str) -> SessionHeader:
        """The parsed header; PersistenceError when the file has no complete one."""
        if self.header is None:
            raise PersistenceError(f"session {session_id!r} has no complete header")
        return self.header

    def session(self, session_id: str, path: Path) -> Session:
        """The parsed session, its events read from ``path`` beyond the window."""
        header = self.require_header(session_id)
        events = FileEvents(
            path=path,
            session_id=session_id,
            identity=self.identity,
            length=self.length,
            end=self.offset,
            marks=self.marks,
            recent=self.recent,
            recent_start=self.length - len(self.recent),
        )
        return Session(header=header, events=events, ledger=self.digest.ledger())

    def fold(self) -> FoldState:
        """The fold of the session's own suffix (``LogDigest.fold``)."""
        return self.digest.fold()

    def cost(self) -> int:
        """Accounted bytes of what the entry holds (an estimate, never measured)."""
        header = self.header
        return (
            _ENTRY_BYTES
            + (0 if header is None else len(header.id) + len(header.timeZone or ""))
            + _MARK_BYTES * len(self.marks)
            + _EVENT_BYTES * len(self.recent)
            + _LINE_FACTOR * self._recent_bytes
            + self.digest.cost()
        )


class Charged(Protocol):
    """A cache entry that knows the bytes it is counted at."""

    charged: int


_Entry = TypeVar("_Entry", bound=Charged)


def evict_oldest(entries: OrderedDict[str, _Entry], total: int, budget_bytes: int,
                 keep: str) -> int:
    """Drop ``entries`` (least recently used first) oldest first until
    their ``total`` fits ``budget_bytes``, ``keep`` excepted; returns the new total. Each
    step looks at the oldest entry only, so a settle costs O(entries it drops), not
    O(entries cached)."""
    while total > budget_bytes and len(entries) > 1:
        oldest = next(iter(entries))
        if oldest == keep:
            # Just used (an entry looked at without moving it is not at the end): it is
            # the newest.
            entries.move_to_end(keep)
            continue
        total -= entries.pop(oldest).charged
    return total


class SessionCache:
    """One ``CachedSession`` per session, least recently used first, within a budget.

    After every use of an entry (``settle``), entries are dropped oldest first until
    their accounted bytes fit ``budget_bytes``; the entry just used is kept even when it
    alone is larger. A settle looks at the entries it drops and no other (O(1) amortised
    per use, whatever the number cached). A dropped entry still serves the thread using
    it, and is no longer counted. Thread-safe.
    """

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("the cache budget cannot be negative")
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, CachedSession] = OrderedDict()
        self._total = 0

    def entry(self, session_id: str) -> CachedSession:
        """The entry of ``session_id``, made the most recently used (a new one if none)."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None:
                entry = self._entries[session_id] = CachedSession()
            else:
                self._entries.move_to_end(session_id)
            return entry

    def peek(self, session_id: str) -> CachedSession | None:
        """The entry of ``session_id`` if cached, without making it recently used."""
        with self._lock:
            return self._entries.get(session_id)

    def settle(self, session_id: str, entry: CachedSession) -> None:
        """Count ``entry`` at its current size, then keep the cache within its budget.
        The caller holds ``entry.lock``."""
        cost = entry.cost()
        with self._lock:
            if self._entries.get(session_id) is not entry:
                return  # dropped while in use: nobody counts it any more
            self._total += cost - entry.charged
            entry.charged = cost
            self._evict(keep=session_id)

    def flushed(self, session_id: str) -> tuple[int, ...] | None:
        """The file stamp at this store's last successful fsync, if still known."""
        with self._lock:
            entry = self._entries.get(session_id)
            return None if entry is None else entry.flushed

    def changed_since_flush(self, session_id: str) -> tuple[int, ...] | None:
        """The file's stamp as the entry last matched it, when that is known and differs
        from the stamp at the last successful fsync: the file changed since, so it needs
        one. None when that is not known (whether the file changed takes a ``stat``)."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is None:
                return None
            synced = entry.synced
            return synced if synced is not None and synced != entry.flushed else None

    def mark_flushed(self, session_id: str, stamp: tuple[int, ...]) -> None:
        """Remember a successful fsync (only for a session the cache holds)."""
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                entry.flushed = stamp

    def stats(self) -> CacheStats:
        """How full the cache is (read by ``JsonlStore.cache_stats``, for tests)."""
        with self._lock:
            return CacheStats(
                entries=len(self._entries),
                accounted_bytes=self._total,
                budget_bytes=self.budget_bytes,
            )

    def _evict(self, keep: str) -> None:
        self._total = evict_oldest(self._entries, self._total, self.budget_bytes, keep)
