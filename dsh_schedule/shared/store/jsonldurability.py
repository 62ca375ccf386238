"""Flushing a JSONL session file, and what a failed ``fsync`` leaves owed
(docs/architecture.md#session-logs).

After a failed ``fsync`` the kernel may have dropped the pages it could not write, and a
later ``fsync`` would answer success without them; so the unconfirmed bytes are kept and
written again before a later flush confirms the session.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from typing import NamedTuple

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.store.jsonlfiles import JsonlFiles, open_session
from dsh_schedule.shared.store.lazylog import read_range
from dsh_schedule.shared.store.sessioncache import file_stamp

logger = logging.getLogger(__name__)


class Unconfirmed(NamedTuple):
    """What a failed fsync left unconfirmed of one file: its bytes from ``start`` (None:
    they could not be read back)."""

    identity: tuple[int, int]
    start: int
    data: bytes | None


class OwedBytes:
    """The sessions whose last fsync failed, with their unconfirmed bytes; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[str, Unconfirmed] = {}

    def get(self, session_id: str) -> Unconfirmed | None:
        with self._lock:
            return self._owed.get(session_id)

    def put(self, session_id: str, unconfirmed: Unconfirmed) -> None:
        with self._lock:
            self._owed[session_id] = unconfirmed

    def pop(self, session_id: str) -> None:
        with self._lock:
            self._owed.pop(session_id, None)


class JsonlDurability(JsonlFiles):
    """``flush`` of one session file, writing again what a failed ``fsync`` left owed. The
    base of ``JsonlStore``, which sets the state below."""

    _owed: OwedBytes

    def flush(self, session_id: str) -> None:
        if self._owed.get(session_id) is not None:
            self._flush_again(session_id)
            return
        if self._cache.flushed(session_id) == self._stamp(session_id):
            return  # nothing changed since this store's last successful fsync
        fd = open_session(self.path(session_id), os.O_RDONLY, session_id)
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
        self._owed.put(session_id, Unconfirmed((st.st_dev, st.st_ino), start, data))

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
                 owed: Unconfirmed) -> None:
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
