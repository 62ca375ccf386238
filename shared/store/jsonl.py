"""The JSONL session store (docs/architecture.md#session-logs), the embedded default.

One file per session, ``<root>/<escaped id>.jsonl``: line 1 the header, then one event
per line. Appends hold an exclusive ``flock`` and re-check the length under it, so they
are atomic and fenced across processes; reads hold a shared one. Each store caches what
it parsed of every file (keyed by file identity) and the fold of it, and continues from
there, so a transaction on a long session reads only the new tail.

The store is for a local filesystem whose ``flock`` and ``fsync`` are coherent.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError
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
from dsh_schedule.shared.store.foldcache import IncrementalFold, check_append
from dsh_schedule.shared.store.ids import escape_session_id, unescape_session_id
from dsh_schedule.shared.store.port import SessionExists, missing_session

logger = logging.getLogger(__name__)

SUFFIX: Final[str] = ".jsonl"
# A file replaced between open() and flock() is opened again, this many times at most.
_OPEN_ATTEMPTS: Final[int] = 5

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


def _read_range(fd: int, start: int, stop: int) -> bytes:
    parts: list[bytes] = []
    while start < stop:
        part = os.pread(fd, stop - start, start)
        if not part:
            break
        parts.append(part)
        start += len(part)
    return b"".join(parts)


class _Tail:
    """What one store has parsed of one session file: its complete lines up to ``offset``.

    Guarded by ``lock``, which is only ever taken while holding the file's flock.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parsed_bytes = 0
        self._reset(None)

    def _reset(self, identity: tuple[int, int] | None) -> None:
        self.identity = identity
        self.offset = 0
        self.header: SessionHeader | None = None
        self.events: list[Event] = []
        self.fold = IncrementalFold(0)
        self._session: Session | None = None

    def sync(self, fd: int, st: os.stat_result, session_id: str | None) -> None:
        """Catch up with the locked file on ``fd``; start over if it was replaced or shrank.

        ``session_id`` is the id the header must carry (None: any id).
        """
        identity = (st.st_dev, st.st_ino)
        if identity != self.identity or st.st_size < self.offset:
            self._reset(identity)
        if st.st_size > self.offset:
            try:
                chunk = _read_range(fd, self.offset, st.st_size)
            except OSError as exc:
                raise PersistenceError(f"cannot read session {session_id!r}") from exc
            self.parsed_bytes += len(chunk)
            self._take(chunk, session_id)

    def _take(self, chunk: bytes, session_id: str | None) -> None:
        # Bytes after the last newline are a torn line (a crash mid-write): not committed.
        end = chunk.rfind(b"\n") + 1
        if end == 0:
            return
        header = self.header
        new: list[Event] = []
        for line in chunk[: end - 1].split(b"\n"):
            if header is None:
                header = decode_header_line(line, session_id)
            else:
                new.append(decode_event_line(line, len(self.events) + len(new)))
        if self.header is None and header is not None:
            self.fold = IncrementalFold(header.seedLength or 0)
        self.header = header
        self.offset += end
        if new:
            self.events.extend(new)
            self._session = None

    def require_header(self, session_id: str) -> SessionHeader:
        """The parsed header; PersistenceError when the file has no complete one."""
        if self.header is None:
            raise PersistenceError(f"session {session_id!r} has no complete header")
        return self.header

    def session(self, session_id: str) -> Session:
        """The parsed session; PersistenceError when the file has no complete header."""
        header = self.require_header(session_id)
        if self._session is None:
            self._session = Session(header=header, events=EventLog(self.events))
        return self._session

    def appended(self, events: tuple[Event, ...], size: int, checked: FoldState | None) -> None:
        """Record an append this store wrote at ``offset``."""
        self.events.extend(events)
        self.offset += size
        self._session = None
        if checked is not None:
            self.fold.appended(checked, len(self.events))


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """What changes whenever a file's bytes do: identity, size and change times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_session_file(path: Path) -> Session:
    """The session in any session file, by the rules of ``JsonlStore.read`` (for the
    ``check``, ``fold`` and ``present`` commands); the header may carry any id."""
    tail = _Tail()
    try:
        with open(path, "rb") as file:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH)
            tail.sync(file.fileno(), os.fstat(file.fileno()), None)
    except PersistenceError:
        raise
    except OSError as exc:
        raise PersistenceError(f"cannot read session file {path.name!r}") from exc
    return tail.session(path.name)


class JsonlStore:
    """``SessionStore`` over one JSONL file per session under ``root``. Thread-safe."""

    def __init__(self, root: Path | str) -> None:
        self._root = Path(root)
        self._lock = threading.Lock()
        self._tails: dict[str, _Tail] = {}
        self._flushed: dict[str, tuple[int, ...]] = {}

    @property
    def root(self) -> Path:
        return self._root

    def path(self, session_id: str) -> Path:
        """The file of ``session_id`` (ValueError for an id that cannot be escaped)."""
        return self._root / (escape_session_id(session_id) + SUFFIX)

    def parsed_bytes(self, session_id: str) -> int:
        """Bytes of the session's files this store has parsed so far (cache diagnostics)."""
        return self._tail(session_id).parsed_bytes

    # -- the SessionStore contract --------------------------------------------------------

    def create(self, header: SessionHeader) -> None:
        self._publish(self.path(header.id), header.id, encode_header(header))

    def fork(self, parent_id: str, child_id: str, *, created_at_ms: int) -> SessionHeader:
        path = self.path(child_id)
        parent = self.read(parent_id)
        header = fork_header(parent.header, child_id, created_at_ms, len(parent.events))
        lines = [encode_header(header), *(encode_event(e) for e in parent.events)]
        self._publish(path, child_id, b"".join(lines))
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
        with self._synced(session_id, os.O_RDONLY, fcntl.LOCK_SH) as (tail, _, _):
            return tail.session(session_id)

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        with self._synced(session_id, os.O_RDONLY, fcntl.LOCK_SH) as (tail, _, _):
            return tail.session(session_id), tail.fold.advance(tail.events)

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        candidates = number_events(events, expected_seq)
        payload = b"".join(encode_event(e) for e in candidates)
        with self._synced(session_id, os.O_RDWR, fcntl.LOCK_EX) as (tail, fd, size):
            tail.require_header(session_id)
            if len(tail.events) != expected_seq:
                raise FenceConflict(expected_seq, len(tail.events))
            if not candidates:
                return ()
            checked = check_append(tail.fold, tail.events, candidates)
            self._cut_torn_line(fd, size, tail.offset, session_id)
            self._write_or_roll_back(fd, payload, tail.offset, session_id)
            tail.appended(candidates, len(payload), checked)
        return candidates

    def flush(self, session_id: str) -> None:
        fd = _open(self.path(session_id), os.O_RDONLY, session_id)
        try:
            stamp = _stamp(os.fstat(fd))
            with self._lock:
                if self._flushed.get(session_id) == stamp:
                    return  # nothing changed since this store's last successful fsync
            self._fsync(fd)
            with self._lock:
                self._flushed[session_id] = stamp
        except OSError as exc:
            # The bytes stay: they may or may not be durable; a later flush confirms them.
            raise PersistenceError(f"flush of session {session_id!r} failed") from exc
        finally:
            os.close(fd)

    # -- overridable I/O primitives (tests inject faults here) ---------------------------

    def _write(self, fd: int, data: bytes, offset: int) -> None:
        """Write ``data`` at ``offset`` in one call; OSError unless all of it was written."""
        written = os.pwrite(fd, data, offset)
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} bytes")

    def _fsync(self, fd: int) -> None:
        os.fsync(fd)

    # -- internals ------------------------------------------------------------------------

    def _tail(self, session_id: str) -> _Tail:
        with self._lock:
            return self._tails.setdefault(session_id, _Tail())

    @contextmanager
    def _synced(
        self, session_id: str, flags: int, operation: int
    ) -> Iterator[tuple[_Tail, int, int]]:
        """For the block: the file open and flocked (``operation``), this store's cache
        of it caught up and locked; yields the cache, the descriptor and the file size."""
        fd, st = self._open_locked(session_id, flags, operation)
        try:
            tail = self._tail(session_id)
            with tail.lock:
                tail.sync(fd, st, session_id)
                yield tail, fd, st.st_size
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

    def _publish(self, path: Path, session_id: str, payload: bytes) -> None:
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

    def _write_staging(self, staging: Path, payload: bytes) -> None:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            self._write(fd, payload, 0)
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
