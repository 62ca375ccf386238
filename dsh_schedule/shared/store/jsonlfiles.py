"""One session's JSONL file under its ``flock`` (docs/architecture.md#session-logs).

How the JSONL store opens, locks, writes and creates a session file: a file replaced
while a caller waited for the lock is opened again, a failed append is rolled back under
the exclusive lock, and a new file appears complete through a staging file and ``link``.
``JsonlFiles`` holds these steps for ``JsonlStore``; its I/O primitives are the seams
tests inject faults through.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import EventLog, Session
from dsh_schedule.shared.store.codec import decode_event_line, decode_header_line
from dsh_schedule.shared.store.ids import escape_session_id
from dsh_schedule.shared.store.lazylog import read_range
from dsh_schedule.shared.store.port import SessionExists, missing_session
from dsh_schedule.shared.store.sessioncache import (
    CachedSession,
    SessionCache,
    file_stamp,
)
from dsh_schedule.shared.store.syncfs import FileSystemSync

logger = logging.getLogger(__name__)

SUFFIX: Final[str] = ".jsonl"
# A file replaced between open() and flock() is opened again, this many times at most.
_OPEN_ATTEMPTS: Final[int] = 5
# A fork copies its parent's lines this many bytes at a time.
_COPY_BLOCK: Final[int] = 1024 * 1024

def open_session(path: Path, flags: int, session_id: str) -> int:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except FileNotFoundError:
        raise missing_session(session_id) from None
    except OSError as exc:
        raise PersistenceError(f"cannot open session {session_id!r}") from exc


def discard_staging(staging: Path) -> None:
    try:
        staging.unlink(missing_ok=True)
    except OSError:
        logger.warning("could not remove the staging file %s", staging.name)


def copy_bytes(fd: int, start: int, stop: int, session_id: str) -> Iterator[bytes]:
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


def session_path(root: Path, session_id: str) -> Path:
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


class JsonlFiles:
    """The session files under ``root``, each opened and locked for one step. The base of
    ``JsonlStore``, which sets the state below."""

    _root: Path
    _cache: SessionCache
    _fs_sync: FileSystemSync | None
    _paths: Callable[[str], Path]

    @property
    def root(self) -> Path:
        return self._root

    def path(self, session_id: str) -> Path:
        """The file of ``session_id`` (ValueError for an id that cannot be escaped)."""
        return self._paths(session_id)

    def _stamp(self, session_id: str) -> tuple[int, ...]:
        """The session file's stamp, from its path."""
        try:
            return file_stamp(os.stat(self.path(session_id)))
        except FileNotFoundError:
            raise missing_session(session_id) from None
        except OSError as exc:
            raise PersistenceError(f"cannot look up session {session_id!r}") from exc


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
            fd = open_session(path, flags, session_id)
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
            discard_staging(staging)
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
