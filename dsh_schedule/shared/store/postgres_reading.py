"""The PostgreSQL session store's pool, schema and reads (shared/store/postgres.py): a
pooled connection a block, every failure a ``PersistenceError`` (an outage said once when
it starts and once when it ends), the schema brought to ``SCHEMA_VERSION``, and a
session's entry caught up with the table in one query."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import Event, Session
from dsh_schedule.shared.store.codec import decode_event_line, decode_header_line
from dsh_schedule.shared.store.port import SessionExists, missing_session
from dsh_schedule.shared.store.postgres_cache import EntryCache, SessionEntry, TableEvents
from dsh_schedule.shared.store.postgres_outage import (
    Reachability,
    Unconfirmed,
    Unflushed,
    configure_connection,
    outage_errno,
)
from dsh_schedule.shared.store.postgres_schema import (
    RANGE,
    SCHEMA_VERSION,
    TAIL_MANY,
    database_version,
    migrate_database,
    row_key,
)

_T = TypeVar("_T")


def tail_from(entry: SessionEntry | None) -> tuple[int, bytes | None]:
    """Where a catch-up from a cached entry reads: its length (0: none cached) and the
    line of the last event fed to it (None: none), read again to check it."""
    if entry is None:
        return 0, None
    return entry.length, entry.last_line

DEFAULT_CACHE_MB: Final[int] = 256
DEFAULT_POOL_SIZE: Final[int] = 8
# How long an operation waits for a connection before it is an outage.
DEFAULT_TIMEOUT_S: Final[float] = 5.0
# While the server is known to be out of reach, an operation waits at most this long for
# a connection (else a batch of operations would each wait ``timeout_s``).
DOWN_TIMEOUT_S: Final[float] = 0.5


class PostgresReading:
    """The pool, the schema and the cache of a ``PostgresStore`` (its parameters there),
    and reading a session through them."""

    def __init__(self, url: str, *, cache_mb: float = DEFAULT_CACHE_MB,
                 pool_size: int = DEFAULT_POOL_SIZE, migrate: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not cache_mb >= 0:
            raise ValueError(f"cache_mb must be a number of MiB >= 0, got {cache_mb!r}")
        self._cache = EntryCache(int(cache_mb * 1024 * 1024))
        self._migrate = migrate
        self._timeout_s = timeout_s
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._unconfirmed: dict[str, Unconfirmed] = {}
        self._unconfirmed_lock = threading.Lock()
        # The appends of each session this store made and no flush confirmed yet.
        self._unflushed: dict[str, Unflushed] = {}
        self._reach = Reachability()
        pool_log = logging.getLogger("psycopg.pool")
        if pool_log.level == logging.NOTSET:
            # The pool says every failed connection attempt; an outage of the store is
            # said once when it starts and once when it ends by the processes instead.
            pool_log.setLevel(logging.ERROR)
        self._pool = ConnectionPool(
            url, min_size=1, max_size=max(1, pool_size), open=False, timeout=timeout_s,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout_s))},
            configure=configure_connection, name="dsh-schedule-store",
        )
        self._pool.open(wait=False)

    def close(self) -> None:
        """Close the pool's connections (the store is unusable afterwards)."""
        self._pool.close()

    # For the tests of the cache's budget (no metric exports it, so no production code
    # reads it).
    def cache_stats(self) -> tuple[int, int]:
        """How many sessions the store keeps, and their accounted bytes."""
        return self._cache.total()

    # -- schema ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The database's schema version (0: none yet)."""
        with self._connection("read the schema version", schema=False) as conn:
            return database_version(conn)

    def migrate(self) -> tuple[int, int]:
        """Bring the schema to ``SCHEMA_VERSION``, one step (one transaction) per version;
        the versions before and after. ``PersistenceError`` for a database at a newer
        version than this code knows."""
        with self._connection("migrate the schema", schema=False, writes=True) as conn:
            before = migrate_database(conn)
            self._schema_ready = True
            return before, SCHEMA_VERSION

    def _ensure_schema(self) -> None:
        if self._schema_ready:
            return
        with self._schema_lock:
            if self._schema_ready:
                return
            if self._migrate:
                self.migrate()
                return
            version = self.schema_version()
            if version != SCHEMA_VERSION:
                raise PersistenceError(
                    f"the database's session schema is version {version}, this release "
                    f"needs {SCHEMA_VERSION}: run `dsh-schedule store migrate`")
            self._schema_ready = True

    def _session(self, session_id: str, entry: SessionEntry) -> Session:
        token = entry.token
        fetch = functools.partial(self._fetch_range, session_id, token)
        events = TableEvents(fetch, entry.length, entry.recent)
        return Session(header=entry.header, events=events, ledger=entry.digest.ledger())

    def _fetch_range(self, session_id: str, token: int, start: int, stop: int) -> list[Event]:
        with self._connection(f"read session {session_id!r}") as conn:
            rows = conn.execute(RANGE, {"id": row_key(session_id), "token": token,
                                         "start": start, "stop": stop}).fetchall()
        if len(rows) != stop - start:
            raise PersistenceError(f"session {session_id!r} was replaced since it was read")
        return [decode_event_line(bytes(line), int(seq)) for seq, line in rows]

    def _caught_up(self, session_id: str, take: Callable[[SessionEntry], _T]) -> _T:
        entry = self._catch_up(session_id)
        with entry.lock:
            return take(entry)

    def _entry_at(self, session_id: str, expected_seq: int) -> SessionEntry:
        """The session's entry; caught up with the table unless it already stands at
        ``expected_seq`` (the append's statement checks the length itself)."""
        entry = self._cache.get(session_id)
        if entry is not None and entry.length == expected_seq:
            return entry
        return self._catch_up(session_id)

    def _catch_up(self, session_id: str) -> SessionEntry:
        """The session's entry, with every committed row fed to it (one query)."""
        entry = self._cache.get(session_id)
        tail = tail_from(entry)
        rows = self._read_tails(f"read session {session_id!r}", {session_id: tail})
        return self._feed_tail(session_id, entry, *tail, rows[session_id])

    def _read_tails(self, what: str, tails: dict[str, tuple[int, bytes | None]]
                    ) -> dict[str, list[tuple[Any, ...]]]:
        """Each session's row and its rows from where ``tails`` (``tail_from``) says, read
        in one query; ``PersistenceError`` when it fails (``what``: what it was for)."""
        keys = {row_key(session_id): session_id for session_id in tails}
        found: dict[str, list[tuple[Any, ...]]] = {session_id: [] for session_id in tails}
        with self._connection(what) as conn:
            for row in conn.execute(TAIL_MANY, {
                    "ids": list(keys), "froms": [start - 1 if last is not None else start
                                                 for start, last in tails.values()]}):
                found[keys[row[0]]].append(row[1:])
        return found

    def _feed_tail(self, session_id: str, entry: SessionEntry | None, start: int,
                   last: bytes | None, rows: Sequence[tuple[Any, ...]]) -> SessionEntry:
        """Feed the rows a catch-up read (``_read_tails``) from where ``entry``, the
        cached entry it started from, stood before the query (``start``, ``last``:
        ``tail_from``) to the session's entry; that entry."""
        if not rows:
            raise missing_session(session_id)
        token, header_line, length = int(rows[0][0]), bytes(rows[0][1]), int(rows[0][2])
        if last is not None and rows[0][3] is not None and int(rows[0][3]) == start - 1:
            if bytes(rows[0][4]) != last:
                length = -1  # the event it holds last is not the log's: read it all
            rows = rows[1:] or [(token, header_line, length, None, None)]
        if entry is None or entry.token != token or length < entry.length:
            if start > 0:  # made again since, shorter than it was, or not the same log
                self._cache.drop(session_id)
                return self._catch_up(session_id)
            entry = SessionEntry(token, decode_header_line(header_line, session_id))
            self._cache.put(session_id, entry)
        with entry.lock:
            if entry.length == start:
                events: list[Event] = []
                sizes: list[int] = []
                line = b""
                seq = start
                for row in rows:
                    if row[3] is None:
                        continue
                    if int(row[3]) != seq:
                        raise PersistenceError(f"session {session_id!r} misses event {seq}")
                    line = bytes(row[4])
                    events.append(decode_event_line(line, seq))
                    sizes.append(len(line) + 1)
                    seq += 1
                if seq != length:
                    raise PersistenceError(f"session {session_id!r} misses event {seq}")
                entry.feed(events, sizes, line)
            self._cache.settle(session_id, entry)
        return entry

    @contextmanager
    def _connection(self, what: str, *, create: str | None = None, schema: bool = True,
                    writes: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit) for the block; every PostgreSQL failure is a
        ``PersistenceError`` (``create``: the id whose creation a unique key may refuse;
        ``schema``: make sure of the schema first; ``writes``: whether the block writes,
        for the outage's end)."""
        if schema:
            self._ensure_schema()
        down = self._reach.unreachable
        try:
            with self._pool.connection(
                    timeout=min(self._timeout_s, DOWN_TIMEOUT_S) if down else self._timeout_s
            ) as conn:
                yield conn
        except pg_errors.UniqueViolation as exc:
            if create is not None:
                raise SessionExists(create) from exc
            raise PersistenceError(f"cannot {what}") from exc
        except psycopg.Error as exc:
            failure = PersistenceError(f"cannot {what}: {type(exc).__name__}")
            failure.errno = outage_errno(exc)
            if failure.errno is not None:
                self._reach.failed(failure.errno, exc)
                failure.outage_said = True
                if isinstance(exc, psycopg.OperationalError) and not down:
                    # The server went away: the idle connections it held are dead too.
                    self._pool.check()
            raise failure from exc
        if self._reach.succeeded(wrote=writes):
            self._after_outage()

    def _after_outage(self) -> None:
        """Called when an outage ends (nothing of its own to do: the appending store
        repairs what the server lost, ``PostgresAppending._after_outage``)."""
