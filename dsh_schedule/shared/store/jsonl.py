"""The JSONL session store (docs/architecture.md#session-logs), the embedded default.

One file per session, ``<root>/<escaped id>.jsonl``: line 1 the header, then one event
per line. Appends hold an exclusive ``flock`` and re-check the length under it, so they
are atomic and fenced across processes; reads hold a shared one. Each store caches, per
file (keyed by file identity), the offset it parsed up to, the event count, the fold,
the delivery ledger and a window of the latest events (``sessioncache``), and continues
from there, so a transaction on a long session reads only the new tail. The cache costs
what the schedule state costs, not what the log's length does, and stays within
``cache_mb``; older events are read back from the file when asked for (``lazylog``).

The store is for a local filesystem whose ``flock`` and ``fsync`` are coherent. How one
file is opened, locked, written and created is ``jsonlfiles``; how it is flushed, and
what a failed ``fsync`` leaves owed, ``jsonldurability``.
"""

from __future__ import annotations

import bisect
import fcntl
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TypeVar

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Event, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.codec import encode_event, encode_header, fork_header, number_events
from dsh_schedule.shared.store.dueindex import (
    DUE_DIRECTORY,
    DUE_SUFFIX,
    Recorded,
    due_of,
    due_page,
    read_recorded,
    write_recorded,
)
from dsh_schedule.shared.store.many import flush_one_by_one
from dsh_schedule.shared.store.foldcache import touches_schedule
from dsh_schedule.shared.store.ids import escape_session_id, unescape_session_id
from dsh_schedule.shared.store.jsonldurability import JsonlDurability, OwedBytes
from dsh_schedule.shared.store.jsonlfiles import (
    SUFFIX,
    copy_bytes,
    read_session_file,
    read_session_file_tail,
    session_path,
)
from dsh_schedule.shared.store.port import DUE_PAGE, DueEntry
from dsh_schedule.shared.store.sessioncache import (
    CachedSession,
    CacheStats,
    SessionCache,
    file_stamp,
)
from dsh_schedule.shared.store.syncfs import FileSystemSync
from dsh_schedule.shared.store.transfer import check_lines

__all__ = ["DEFAULT_CACHE_MB", "SUFFIX", "JsonlStore", "read_session_file",
           "read_session_file_tail"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

DEFAULT_CACHE_MB: Final[int] = 256
# How many sessions' file paths a store keeps formatted.
_PATHS_KEPT: Final[int] = 65_536
# A listing of the directory is kept for the due index only when it was taken this long
# after the directory last changed: a later change then moves the modification time
# even where the file system's clock is coarse.
_LISTING_MARGIN_NS: Final[int] = 2_000_000_000


class JsonlStore(JsonlDurability):
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
            functools.partial(session_path, self._root))
        self._owed = OwedBytes()
        # The sorted escaped ids and the directory's (inode, modification time) they were
        # listed at (``_stems``).
        self._listing: tuple[tuple[int, int], list[str]] | None = None

    # -- what the cache holds, for the tests of its budget and cost (no metric exports it,
    # so no production code reads it) -----------------------------------------------------

    def parsed_bytes(self, session_id: str) -> int:
        """Bytes of the session's files this store has parsed since it last cached it (0
        when it holds nothing of the session)."""
        entry = self._cache.peek(session_id)
        return 0 if entry is None else entry.parsed_bytes

    def cache_stats(self) -> CacheStats:
        """How many sessions the store keeps, their accounted bytes and its budget."""
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
            copied = copy_bytes(fd, entry.header_end, entry.offset, parent_id)
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
            data = b"".join(copy_bytes(fd, 0, st.st_size, session_id))
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
