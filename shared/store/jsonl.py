"""The JSONL session store (docs/architecture.md#session-logs), the embedded default.

One file per session, ``<root>/<escaped id>.jsonl``: line 1 the header, then one event
per line. Appends hold an exclusive ``flock`` and re-check the length under it, so they
are atomic and fenced across processes; reads hold a shared one. Each store caches, per
file (keyed by file identity), the offset it parsed up to, the event count, the fold,
the delivery ledger and a window of the latest events (``sessioncache``), and continues
from there, so a transaction on a long session reads only the new tail. The cache costs
what the schedule state costs, not what the log's length does, and stays within
``cache_mb``; older events are read back from the file when asked for (``lazylog``).

The store is for a local filesystem whose ``flock`` and ``fsync`` are coherent.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import itertools
import logging
import os
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple, TypeVar

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Event, EventLog, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.codec import (
    decode_event_line,
    decode_header_line,
    encode_event,
    encode_header,
    fork_header,
    number_events,
)
from dsh_schedule.shared.store.dueindex import (
    DUE_DIRECTORY,
    DUE_SUFFIX,
    Recorded,
    due_of,
    due_page,
    read_recorded,
    write_recorded,
)
from dsh_schedule.shared.store.flushing import flush_one_by_one
from dsh_schedule.shared.store.foldcache import touches_schedule
from dsh_schedule.shared.store.ids import escape_session_id, unescape_session_id
from dsh_schedule.shared.store.lazylog import read_range
from dsh_schedule.shared.store.port import DUE_PAGE, DueEntry, SessionExists, missing_session
from dsh_schedule.shared.store.sessioncache import (
    CachedSession,
    CacheStats,
    SessionCache,
    file_stamp,
)
from dsh_schedule.shared.store.syncfs import FileSystemSync
from dsh_schedule.shared.store.transfer import check_lines

if TYPE_CHECKING:
    from dsh_schedule.shared.settings import Settings

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

SUFFIX: Final[str] = ".jsonl"
# A file replaced between open() and flock() is opened again, this many times at most.
_OPEN_ATTEMPTS: Final[int] = 5
DEFAULT_CACHE_MB: Final[int] = 256
# A fork copies its parent's lines this many bytes at a time.
_COPY_BLOCK: Final[int] = 1024 * 1024
# How many sessions' file paths a store keeps formatted.
_PATHS_KEPT: Final[int] = 65_536
# A listing of the directory is kept for the due index only when it was taken this long
# after the directory last changed: a later change then moves the modification time
# even where the file system's clock is coarse.
_LISTING_MARGIN_NS: Final[int] = 2_000_000_000

def _open(path: Path, flags: int, session_id: str) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except FileNotFoundError:
        raise missing_session(session_id) from None
    except OSError as exc:
        raise PersistenceError(f"cannot open session {session_id!r}") from exc


def _discard(staging: Path) -> None:
    try:
        staging.unlink(missing_ok=True)
    except OSError:
        logger.warning("could not remove the staging file %s", staging.name)


def _copy(fd: int, start: int, stop: int, session_id: str) -> Iterator[bytes]:
    """Bytes ``start:stop`` of the file on ``fd``, a block at a time."""
    while start < stop:
        try:
            block = read_range(fd, start, min(stop, start + _COPY_BLOCK))
        except OSError as exc:
            raise PersistenceError(f"cannot read session {session_id!r}") from exc
        if not block:
            raise PersistenceError(f"session {session_id!r} shrank while it was copied")
        yield block
        start += len(block)


def _session_path(root: Path, session_id: str) -> Path:
    """The file of ``session_id`` under ``root`` (ValueError for an id that cannot be
    escaped)."""
    return root / (escape_session_id(session_id) + SUFFIX)


def read_session_file(path: Path) -> Session:
    """The session in any session file, by the rules of ``JsonlStore.read`` (for the
    ``check``, ``fold`` and ``present`` commands); the header may carry any id. Every
    event is held in memory: this is for one file, read once."""
    return read_session_file_tail(path)[0]


def read_session_file_tail(path: Path) -> tuple[Session, int]:
    """``read_session_file``, and how many bytes follow the last newline: a torn final
    line the read ignored (0 when the file ends with a complete line)."""
    try:
        with open(path, "rb") as file:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH)
            data = file.read()
    except OSError as exc:
        # Why, in the system's words: missing, a directory, no permission, ...
        raise PersistenceError(
            f"cannot read session file {path.name!r}: {exc.strerror or type(exc).__name__}"
        ) from exc
    # Bytes after the last newline are a torn line (a crash mid-write): not committed.
    end = data.rfind(b"\n") + 1
    if end == 0:
        raise PersistenceError(f"session file {path.name!r} has no complete header")
    lines = data[: end - 1].split(b"\n")
    header = decode_header_line(lines[0], None)
    events = [decode_event_line(line, seq) for seq, line in enumerate(lines[1:])]
    return Session(header=header, events=EventLog(events)), len(data) - end


class _Unconfirmed(NamedTuple):
    """What a failed fsync left unconfirmed of one file: its bytes from ``start`` (None:
    they could not be read back)."""

    identity: tuple[int, int]
    start: int
    data: bytes | None


class _OwedBytes:
    """The sessions whose last fsync failed, with their unconfirmed bytes; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[str, _Unconfirmed] = {}

    def get(self, session_id: str) -> _Unconfirmed | None:
        with self._lock:
            return self._owed.get(session_id)

    def put(self, session_id: str, unconfirmed: _Unconfirmed) -> None:
        with self._lock:
            self._owed[session_id] = unconfirmed

    def pop(self, session_id: str) -> None:
        with self._lock:
            self._owed.pop(session_id, None)


class JsonlStore:
    """``SessionStore`` over one JSONL file per session under ``root``. Thread-safe.

    ``cache_mb`` bounds what the store keeps of the sessions it served (accounted bytes,
    least recently used dropped first); a dropped session is parsed from its file again
    when next used. ``syncfs``: confirm a batch of sessions (``flush_many``) with one
    file system sync where that can be trusted (``syncfs``); False flushes each file.
    """

    def __init__(
        self, root: Path | str, *, cache_mb: float = DEFAULT_CACHE_MB, syncfs: bool = True
    ) -> None:
        if not cache_mb >= 0:
            raise ValueError(f"cache_mb must be a number of MiB >= 0, got {cache_mb!r}")
        self._root = Path(root)
        self._cache = SessionCache(int(cache_mb * 1024 * 1024))
        self._fs_sync = FileSystemSync(self._root) if syncfs else None
        if self._fs_sync is not None and self._root.is_dir():
            self._fs_sync.open()  # before this store writes anything
        # Escaping an id and formatting its path cost more than the file calls on a busy
        # worker; the paths of recent sessions are kept (a path, once formatted, keeps
        # its string). The cache is bound to the root, not to the store: a store that
        # referred to itself would outlive its last reference until a full collection,
        # its descriptor open.
        self._paths = functools.lru_cache(maxsize=_PATHS_KEPT)(
            functools.partial(_session_path, self._root))
        self._owed = _OwedBytes()
        # The sorted escaped ids and the directory's (inode, modification time) they were
        # listed at (``_stems``).
        self._listing: tuple[tuple[int, int], list[str]] | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> JsonlStore:
        """The store a deployment's settings describe: its session directory, cache budget
        and whether ``syncfs`` may confirm a batch."""
        return cls(settings.sessions, cache_mb=settings.cache_mb, syncfs=settings.syncfs)

    @property
    def root(self) -> Path:
        return self._root

    def path(self, session_id: str) -> Path:
        """The file of ``session_id`` (ValueError for an id that cannot be escaped)."""
        return self._paths(session_id)

    def parsed_bytes(self, session_id: str) -> int:
        """Bytes of the session's files this store has parsed since it last cached it
        (cache diagnostics; 0 when it holds nothing of the session)."""
        entry = self._cache.peek(session_id)
        return 0 if entry is None else entry.parsed_bytes

    def cache_stats(self) -> CacheStats:
        """How many sessions the store keeps, and their accounted bytes (diagnostics)."""
        return self._cache.stats()

    def cached_bytes(self, session_id: str) -> int | None:
        """The accounted bytes of the session's cache entry; None when not cached."""
        entry = self._cache.peek(session_id)
        return None if entry is None else entry.charged

    # -- the SessionStore contract --------------------------------------------------------

    def create(self, header: SessionHeader) -> None:
        self._publish(self.path(header.id), header.id, encode_header(header))

    def fork(self, parent_id: str, child_id: str, *, created_at_ms: int) -> SessionHeader:
        path = self.path(child_id)
        with self._synced(parent_id, os.O_RDONLY, fcntl.LOCK_SH) as (entry, fd, _):
            parent = entry.require_header(parent_id)
            header = fork_header(parent, child_id, created_at_ms, entry.length)
            # The parent's committed lines, copied as written while its shared flock holds
            # them still: they parsed as its events, so they parse as the child's.
            copied = _copy(fd, entry.header_end, entry.offset, parent_id)
            self._publish(path, child_id, itertools.chain([encode_header(header)], copied))
        return header

    def exists(self, session_id: str) -> bool:
        path = self.path(session_id)
        try:
            os.stat(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise PersistenceError(f"cannot look up session {session_id!r}") from exc
        return True

    def sessions(self) -> list[str]:
        try:
            names = os.listdir(self._root)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PersistenceError("cannot list the sessions directory") from exc
        ids = []
        for name in names:
            if name.endswith(SUFFIX):
                try:
                    ids.append(unescape_session_id(name[: -len(SUFFIX)]))
                except ValueError:
                    continue  # not a file this store wrote
        return sorted(ids)

    def read(self, session_id: str) -> Session:
        path = self.path(session_id)
        return self._cached(session_id, lambda entry: entry.session(session_id, path))

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        path = self.path(session_id)
        return self._cached(session_id,
                            lambda entry: (entry.session(session_id, path), entry.fold()))

    def _cached(self, session_id: str, take: Callable[[CachedSession], _T]) -> _T:
        """``take`` of the session's entry, caught up with its file. The file is not even
        opened when it is still at the stamp it had when the entry last matched all of it
        (one ``stat``). That is safe without the flock: an append changes the size and a
        replacement the identity, so an equal stamp means no writer has changed the file
        since (one in progress has not yet, and is ordered after this read)."""
        entry = self._cache.entry(session_id)
        if entry.synced is not None:
            try:
                stamp: tuple[int, ...] | None = file_stamp(os.stat(self.path(session_id)))
            except OSError:
                stamp = None  # the full path below tells what is wrong
            with entry.lock:
                if stamp is not None and entry.synced == stamp:
                    return take(entry)
        with self._synced(session_id, os.O_RDONLY, fcntl.LOCK_SH) as (entry, _, _):
            return take(entry)

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        candidates = number_events(events, expected_seq)
        lines = [encode_event(e) for e in candidates]
        payload = b"".join(lines)
        if self._fs_sync is not None:
            self._fs_sync.open()  # before this store's first write; answers at once after
        with self._synced(session_id, os.O_RDWR, fcntl.LOCK_EX) as (entry, fd, size):
            entry.require_header(session_id)
            if entry.length != expected_seq:
                raise FenceConflict(expected_seq, entry.length)
            if not candidates:
                return ()
            entry.digest.check(candidates)
            self._cut_torn_line(fd, size, entry.offset, session_id)
            self._write_or_roll_back(fd, payload, entry.offset, session_id)
            try:
                stamp: tuple[int, ...] | None = file_stamp(os.fstat(fd))
            except OSError:
                stamp = None  # the next read opens the file
            entry.appended(candidates, lines, stamp)
            if stamp is not None and touches_schedule(candidates):
                self._index_due(session_id, entry, stamp)
        return candidates

    def flush(self, session_id: str) -> None:
        if self._owed.get(session_id) is not None:
            self._flush_again(session_id)
            return
        if self._cache.flushed(session_id) == self._stamp(session_id):
            return  # nothing changed since this store's last successful fsync
        fd = _open(self.path(session_id), os.O_RDONLY, session_id)
        try:
            st = os.fstat(fd)
            stamp = file_stamp(st)
            try:
                self._fsync(fd)
            except OSError:
                # Linux may have dropped the pages the failed fsync could not write, and a
                # later fsync would answer success without them: keep the unconfirmed
                # bytes, so the next flush writes them again before it confirms them.
                self._owe(session_id, fd, st, self._confirmed_size(session_id, st))
                raise
            self._cache.mark_flushed(session_id, stamp)
        except OSError as exc:
            # The bytes stay: they may or may not be durable; a later flush confirms them.
            raise PersistenceError(f"flush of session {session_id!r} failed") from exc
        finally:
            os.close(fd)

    def _confirmed_size(self, session_id: str, st: os.stat_result) -> int:
        """The file's size at this store's last successful fsync of it (0: unknown)."""
        flushed = self._cache.flushed(session_id)
        if flushed is None or flushed[:2] != (st.st_dev, st.st_ino):
            return 0
        return min(flushed[2], st.st_size)

    def _owe(self, session_id: str, fd: int, st: os.stat_result, start: int) -> None:
        """Keep what a failed fsync left unconfirmed of the session: its complete lines
        from ``start`` (the size last confirmed), read while the page cache still holds
        them."""
        data: bytes | None
        try:
            read = read_range(fd, start, st.st_size) if st.st_size > start else b""
        except OSError:
            data = None  # the next flush cannot confirm the session: this process cannot
        else:
            data = read[: read.rfind(b"\n") + 1]  # a torn line was never committed
        self._owed.put(session_id, _Unconfirmed((st.st_dev, st.st_ino), start, data))

    def _flush_again(self, session_id: str) -> None:
        """The flush of a session whose earlier fsync failed: the unconfirmed bytes this
        store kept are written again at their place, under the exclusive flock, so the
        fsync that follows writes them whatever the failed one dropped; only then is the
        session confirmed. A file that no longer holds them, nor a prefix of them, is not
        confirmed (its lost bytes cannot be told from another writer's)."""
        fd, st = self._open_locked(session_id, os.O_RDWR, fcntl.LOCK_EX)
        try:
            owed = self._owed.get(session_id)
            start = self._confirmed_size(session_id, st)
            if owed is not None and owed.identity == (st.st_dev, st.st_ino):
                self._rewrite(session_id, fd, st, owed)
                start = owed.start
            try:
                self._fsync(fd)
            except OSError as exc:
                # Failed again: everything from the same start, as the file holds it now.
                self._owe(session_id, fd, os.fstat(fd), start)
                raise PersistenceError(f"flush of session {session_id!r} failed") from exc
            self._owed.pop(session_id)
            self._cache.mark_flushed(session_id, file_stamp(os.fstat(fd)))
        except PersistenceError:
            raise
        except OSError as exc:
            raise PersistenceError(f"flush of session {session_id!r} failed") from exc
        finally:
            os.close(fd)  # releases the flock

    def _rewrite(self, session_id: str, fd: int, st: os.stat_result,
                 owed: _Unconfirmed) -> None:
        if owed.data is None:
            raise PersistenceError(
                f"session {session_id!r}: the bytes a failed fsync left unconfirmed "
                "could not be read back; they cannot be confirmed by this process")
        held = read_range(fd, owed.start, st.st_size)
        if st.st_size < owed.start or not (
                held.startswith(owed.data) or owed.data.startswith(held)):
            raise PersistenceError(
                f"session {session_id!r} no longer holds the bytes a failed fsync left "
                "unconfirmed; they cannot be confirmed")
        if len(held) < len(owed.data):
            logger.warning("session %r lost %d unconfirmed bytes after a failed fsync; "
                           "writing them again", session_id, len(owed.data) - len(held))
        self._write(fd, owed.data, owed.start)  # dirty again: the next fsync writes them

    def flush_many(self, session_ids: Sequence[str]) -> dict[str, PersistenceError]:
        """``flush`` for many sessions; the failures, by session. The files changed since
        this store last flushed them are confirmed by one ``syncfs`` where it can be
        trusted (``syncfs``), else each by its own ``fsync``, several at once."""
        ids = list(dict.fromkeys(session_ids))
        if len(ids) <= 1 or self._fs_sync is None or not self._fs_sync.open():
            return flush_one_by_one(self, ids)
        # A session whose fsync failed is written again before it is confirmed.
        owed = [session_id for session_id in ids if self._owed.get(session_id) is not None]
        failed: dict[str, PersistenceError] = flush_one_by_one(self, owed) if owed else {}
        changed: list[tuple[str, tuple[int, ...]]] = []
        for session_id in ids:
            if session_id in owed:
                continue
            # A file the entry last saw at another stamp than its last flush's (this
            # store's own append, or a change it read) needs no ``stat``: that stamp is
            # what the sync confirms, at least; a later change moves the stamp again.
            known = self._cache.changed_since_flush(session_id)
            if known is not None:
                changed.append((session_id, known))
                continue
            try:
                stamp = self._stamp(session_id)
            except PersistenceError as exc:
                failed[session_id] = exc
                continue
            if self._cache.flushed(session_id) != stamp:
                changed.append((session_id, stamp))
        if not changed:
            return failed
        if self._syncfs():  # every byte written before the stamps were read is durable
            for session_id, stamp in changed:
                self._cache.mark_flushed(session_id, stamp)
            return failed
        failed.update(flush_one_by_one(self, [session_id for session_id, _ in changed]))
        return failed

    def session_lines(self, session_id: str) -> tuple[bytes, list[bytes]]:
        """The session's header line and committed event lines, as the file holds them
        (``store copy``, ``export``)."""
        fd, st = self._open_locked(session_id, os.O_RDONLY, fcntl.LOCK_SH)
        try:
            data = b"".join(_copy(fd, 0, st.st_size, session_id))
        finally:
            os.close(fd)
        end = data.rfind(b"\n")  # bytes after the last newline are a torn line
        if end < 0:
            raise PersistenceError(f"session {session_id!r} has no complete header")
        header, *lines = data[:end].split(b"\n")
        return header, lines

    def import_lines(self, session_id: str, header: bytes, lines: Sequence[bytes]) -> None:
        """Create the session's file holding exactly these lines, durably, once they read
        as its log (``store copy``); ``SessionExists`` when it exists."""
        check_lines(session_id, header, lines)
        self._publish(self.path(session_id), session_id,
                      itertools.chain([header + b"\n"], (line + b"\n" for line in lines)))

    def _stamp(self, session_id: str) -> tuple[int, ...]:
        """The session file's stamp, from its path."""
        try:
            return file_stamp(os.stat(self.path(session_id)))
        except FileNotFoundError:
            raise missing_session(session_id) from None
        except OSError as exc:
            raise PersistenceError(f"cannot look up session {session_id!r}") from exc

    def close(self) -> None:
        """Release the descriptor ``syncfs`` keeps (the store stays usable, flushing each
        file from then on)."""
        if self._fs_sync is not None:
            self._fs_sync.close()

    # -- the index of next due moments ----------------------------------------------------

    def due_index(
        self, *, before_ms: int | None = None, after: str | None = None, limit: int = DUE_PAGE
    ) -> list[DueEntry]:
        stems = self._stems()
        start = 0 if after is None else bisect.bisect_right(stems, escape_session_id(after))
        return due_page(stems[start:], self._due_entry, before_ms=before_ms, limit=limit)

    def _stems(self) -> list[str]:
        """The escaped ids of the sessions, sorted. A listing is kept while the directory
        is unchanged since: it is listed again when its modification time moved, or when
        the kept listing was taken too close to that time to tell a later change by it."""
        try:
            before = os.stat(self._root)
            kept = self._listing
            if kept is not None and kept[0] == (before.st_ino, before.st_mtime_ns):
                return kept[1]
            listed_ns = time.time_ns()
            names = os.listdir(self._root)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise PersistenceError("cannot list the sessions directory") from exc
        stems = sorted(name[: -len(SUFFIX)] for name in names
                       if name.endswith(SUFFIX) and not name.startswith("."))
        if listed_ns - before.st_mtime_ns > _LISTING_MARGIN_NS:
            self._listing = ((before.st_ino, before.st_mtime_ns), stems)
        return stems

    def _due_entry(self, stem: str) -> DueEntry | None:
        """The entry of the session whose escaped id is ``stem``: as recorded when it
        matches the log's stamp (one ``stat``, no read of the log), else folded from the
        log and recorded again. None for a file name no id escapes to."""
        try:
            st = os.stat(os.path.join(self._root, stem + SUFFIX))
        except FileNotFoundError:
            return None  # gone since it was listed
        except OSError as exc:
            raise PersistenceError(f"cannot look up session file {stem!r}") from exc
        recorded = read_recorded(os.path.join(self._root, DUE_DIRECTORY, stem + DUE_SUFFIX))
        try:
            session_id = unescape_session_id(stem)
        except ValueError:
            return None  # not a file this store wrote
        if recorded is None or recorded.stamp != file_stamp(st):
            try:
                recorded = self._refold_due(session_id)
            except ScheduleLogError as exc:
                logger.warning("session %r has no due moment: its log does not read (%s)",
                               session_id, exc)
                return None
        if recorded.due_ms is None:
            return None
        return DueEntry(session_id, recorded.due_ms, recorded.length)

    def _refold_due(self, session_id: str) -> Recorded:
        """Fold the session's log and record its entry, under the log's shared flock so no
        append comes in between. A session this store caches continues from its entry;
        any other is folded on an entry of its own, so a scan of the whole store leaves
        the cache as it found it."""
        if self._cache.peek(session_id) is not None:
            with self._synced(session_id, os.O_RDONLY, fcntl.LOCK_SH) as (entry, fd, _):
                return self._refolded(session_id, entry, fd)
        fd, st = self._open_locked(session_id, os.O_RDONLY, fcntl.LOCK_SH)
        try:
            entry = CachedSession()
            entry.sync(fd, st, session_id)
            return self._refolded(session_id, entry, fd)
        finally:
            os.close(fd)  # releases the flock

    def _refolded(self, session_id: str, entry: CachedSession, fd: int) -> Recorded:
        entry.require_header(session_id)
        try:
            stamp = file_stamp(os.fstat(fd))
        except OSError as exc:
            raise PersistenceError(f"cannot look up session {session_id!r}") from exc
        return self._index_due(session_id, entry, stamp)

    def _index_due(self, session_id: str, entry: CachedSession, stamp: tuple[int, ...]
                   ) -> Recorded:
        """Record the entry of ``entry`` (caught up with the file at ``stamp``, its flock
        held): best effort, a stale entry is folded again when read."""
        recorded = Recorded(due_of(entry.digest), entry.length, stamp)
        write_recorded(self._root / DUE_DIRECTORY,
                       escape_session_id(session_id) + DUE_SUFFIX, recorded)
        return recorded

    # -- overridable I/O primitives (tests inject faults here) ---------------------------

    def _write(self, fd: int, data: bytes, offset: int) -> None:
        """Write ``data`` at ``offset`` in one call; OSError unless all of it was written."""
        written = os.pwrite(fd, data, offset)
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} bytes")

    def _fsync(self, fd: int) -> None:
        os.fsync(fd)

    def _syncfs(self) -> bool:
        """One file system sync: True when every file written so far is durable."""
        return self._fs_sync is not None and self._fs_sync.sync()

    # -- internals ------------------------------------------------------------------------

    @contextmanager
    def _synced(
        self, session_id: str, flags: int, operation: int
    ) -> Iterator[tuple[CachedSession, int, int]]:
        """For the block: the file open and flocked (``operation``), this store's cache
        of it caught up and locked; yields the entry, the descriptor and the file size.
        Afterwards the entry is counted at its new size and the cache kept in budget."""
        fd, st = self._open_locked(session_id, flags, operation)
        try:
            entry = self._cache.entry(session_id)
            with entry.lock:
                try:
                    entry.sync(fd, st, session_id)
                    yield entry, fd, st.st_size
                finally:
                    self._cache.settle(session_id, entry)
        finally:
            os.close(fd)  # releases the flock

    def _open_locked(
        self, session_id: str, flags: int, operation: int
    ) -> tuple[int, os.stat_result]:
        """The session file open on a descriptor that holds ``operation`` (a flock)."""
        path = self.path(session_id)
        for _ in range(_OPEN_ATTEMPTS):
            fd = _open(path, flags, session_id)
            try:
                fcntl.flock(fd, operation)
                st = os.fstat(fd)
                current = os.stat(path)
            except FileNotFoundError:
                os.close(fd)
                raise missing_session(session_id) from None
            except OSError as exc:
                os.close(fd)
                raise PersistenceError(f"cannot lock session {session_id!r}") from exc
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise PersistenceError(f"session {session_id!r} is not a regular file")
            if (st.st_dev, st.st_ino) == (current.st_dev, current.st_ino):
                return fd, st
            os.close(fd)  # replaced while we waited for the lock: lock the new file
        raise PersistenceError(f"session {session_id!r} kept being replaced")

    def _cut_torn_line(self, fd: int, size: int, offset: int, session_id: str) -> None:
        if size <= offset:
            return
        logger.warning("cutting a torn final line from session %r", session_id)
        try:
            os.ftruncate(fd, offset)
        except OSError as exc:
            raise PersistenceError(f"cannot cut the torn line of session {session_id!r}") from exc

    def _write_or_roll_back(self, fd: int, payload: bytes, offset: int, session_id: str) -> None:
        try:
            self._write(fd, payload, offset)
        except BaseException as exc:
            # Still under the exclusive flock: nobody has seen the partial bytes.
            try:
                os.ftruncate(fd, offset)
            except OSError:
                logger.exception("rolling back a failed append to session %r failed", session_id)
                raise PersistenceError(
                    f"append to session {session_id!r} failed and was not rolled back"
                ) from exc
            if isinstance(exc, OSError):
                raise PersistenceError(f"append to session {session_id!r} failed") from exc
            raise

    def _publish(self, path: Path, session_id: str, payload: bytes | Iterable[bytes]) -> None:
        """Make a complete, flushed file appear at ``path`` at once, never replacing one."""
        # The name starts with '.', which no escaped id does, so sessions() never lists it.
        staging = self._root / f".{uuid.uuid4().hex}.staging"
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            if path.exists():
                raise SessionExists(session_id)
            self._write_staging(staging, payload)
            try:
                os.link(staging, path)
            except FileExistsError:
                raise SessionExists(session_id) from None
        except SessionExists:
            raise
        except OSError as exc:
            raise PersistenceError(f"cannot create session {session_id!r}") from exc
        finally:
            _discard(staging)
        self._sync_directory(session_id)

    def _write_staging(self, staging: Path, payload: bytes | Iterable[bytes]) -> None:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            offset = 0
            for part in [payload] if isinstance(payload, bytes) else payload:
                self._write(fd, part, offset)
                offset += len(part)
            self._fsync(fd)
        finally:
            os.close(fd)

    def _sync_directory(self, session_id: str) -> None:
        try:
            fd = os.open(self._root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                self._fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # The session exists; only its durability is unconfirmed.
            raise PersistenceError(f"session {session_id!r} created but not flushed") from exc
