"""The PostgreSQL session store's outages (shared/store/postgres.py): whether the server
answers and takes writes, which failures are outages, and what the store made that the
server may have lost (appends no flush confirmed yet, appends of unknown outcome)."""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from dsh_schedule.shared.core.events import Event

logger = logging.getLogger("dsh_schedule.shared.store.postgres")

class Unflushed:
    """This store's appends to one session that no flush has confirmed yet, contiguous from
    ``first`` (row ``token``), and the outage count (``Reachability.epoch``) when the first
    was made: a server that crashed since may have lost them."""

    __slots__ = ("epoch", "events", "first", "lines", "token")

    def __init__(self, token: int, events: tuple[Event, ...], lines: list[bytes],
                 epoch: int) -> None:
        self.token = token
        self.first = events[0].seq
        self.events = events
        self.lines = lines
        self.epoch = epoch

    @classmethod
    def after(cls, kept: Unflushed | None, token: int, events: tuple[Event, ...],
              lines: list[bytes], epoch: int) -> Unflushed:
        """The record once ``events`` follow what ``kept`` holds (or alone)."""
        if kept is not None and kept.token == token and kept.first + len(kept.events) == \
                events[0].seq:
            return cls(token, kept.events + events, kept.lines + lines, kept.epoch)
        return cls(token, events, lines, epoch)


class Unconfirmed:
    """An append whose commit's outcome is unknown: the lines sent and where."""

    def __init__(self, token: int, events: tuple[Event, ...], lines: list[bytes]) -> None:
        self.token = token
        self.events = events
        self.lines = lines


class Reachability:
    """Whether the server answers, and takes writes: an outage is said once when it starts
    and once when it ends (as the processes say a Redis outage: docs/architecture.md#
    outages). A server that answers but takes no writes (its disk full, read-only) is
    back only once a write succeeds. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self.unreachable = False  # down, and not even answering
        self.epoch = 0  # failures so far

    def failed(self, code: int, exc: psycopg.Error) -> None:
        with self._lock:
            self.unreachable = code == errno.EIO
            self.epoch += 1
            if self.down_since is not None:
                return
            self.down_since = time.monotonic()
        logger.warning("PostgreSQL session store unavailable (%s: %s); retrying",
                       errno.errorcode.get(code, "?"), type(exc).__name__)

    def succeeded(self, *, wrote: bool) -> bool:
        """Note a success; True when it ends an outage."""
        if self.down_since is None:  # the common case, without the lock
            return False
        with self._lock:
            if self.down_since is None or not (wrote or self.unreachable):
                return False
            since, self.down_since, self.unreachable = self.down_since, None, False
        logger.warning("PostgreSQL session store is back after %.1f s",
                       time.monotonic() - since)
        return True


def configure_connection(conn: psycopg.Connection[Any]) -> None:
    """Every pooled connection commits its appends without waiting for the server's disk:
    ``flush`` is the durability barrier, one synchronous commit for a whole batch."""
    conn.execute("SET synchronous_commit = off")


def outage_errno(exc: psycopg.Error) -> int | None:
    """The errno of a disk that cannot take writes now, for a database that cannot
    (``disk_outage_errno``: the processes ride it out as an outage of the session store,
    one line when it starts and one when it ends): the server's disk full, a read-only
    server (a replica after failover), and every operational failure (connection refused
    or lost, the server shutting down or starting, a statement timeout, no connection
    from the pool in time). None for an error of the statement itself."""
    if isinstance(exc, pg_errors.DiskFull):
        return errno.ENOSPC
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return errno.EROFS
    if isinstance(exc, psycopg.OperationalError):
        return errno.EIO
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether a ``PersistenceError`` came from a connection lost mid-statement (its
    outcome unknown) rather than from the server's answer."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.OperationalError) and not isinstance(
        cause, pg_errors.QueryCanceled | pg_errors.LockNotAvailable)
