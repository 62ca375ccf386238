"""The PostgreSQL session store (docs/architecture.md#session-logs), for hosts and workers
on many machines over one store.

Two tables the store creates itself (``migrate``; a versioned schema, one step per
version): ``dsh_schedule_sessions`` (one row a session: its escaped id, its header line,
its length, a token drawn when the row was made, and the next due moment of its own
Schedule records with the length it was derived from) and ``dsh_schedule_events`` (one
row an event: the exact line the JSONL store writes, without its newline, keyed by
session and seq). Both stores therefore read back byte-identical events.

An append is one statement, so one transaction: it moves the session's length from
``expected_seq`` on (the fence; a concurrent appender waits for the row lock and then
finds another length) and inserts the lines (the unique key on session and seq backs the
fence). It commits without waiting for the server's disk (``synchronous_commit = off``):
``flush`` is the durability barrier, one synchronously committed transaction that makes
every earlier commit durable (the server's log is one sequence), for a whole batch of
sessions at once, and checks each session still holds this store's last append (a server
that crashed before its log reached the disk lost it: ``PersistenceError``). An append
whose reply was lost (the connection cut after the statement was sent) has an unknown
outcome: it is kept as unconfirmed, and ``flush`` raises ``PersistenceError`` until it
finds the lines committed (or commits them at the same fence). ``create``, ``fork`` and
copies commit synchronously. Every connection is in autocommit, so no transaction is
ever left open.

Per session the store keeps, like the JSONL store and within ``cache_mb``, the header,
the length, the fold and ledger (``LogDigest``) and a window of the latest events, and
continues from there: a read fetches only the rows appended since. Older events are
read back from the table when asked for (``TableEvents``).
"""

from __future__ import annotations

import errno
import functools
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from dsh_schedule.shared.core.due import next_due_moment_ms
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Event, EventSequence, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState, check_candidate
from dsh_schedule.shared.store.codec import (
    decode_event_line,
    decode_header_line,
    encode_event,
    encode_header,
    fork_header,
    number_events,
)
from dsh_schedule.shared.store.foldcache import LogDigest, touches_schedule
from dsh_schedule.shared.store.ids import escape_session_id, unescape_session_id
from dsh_schedule.shared.store.port import DUE_PAGE, DueEntry, SessionExists, missing_session
from dsh_schedule.shared.store.sessioncache import RECENT_BYTES, RECENT_EVENTS
from dsh_schedule.shared.store.transfer import check_lines

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

URL_SCHEMES: Final = ("postgresql://", "postgres://")
DEFAULT_CACHE_MB: Final[int] = 256
DEFAULT_POOL_SIZE: Final[int] = 8
# How long an operation waits for a connection before it is an outage.
DEFAULT_TIMEOUT_S: Final[float] = 5.0
# While the server is known to be out of reach, an operation waits at most this long for
# a connection (else a batch of operations would each wait ``timeout_s``).
DOWN_TIMEOUT_S: Final[float] = 0.5
# Events older than the window are fetched this many at a time.
CHUNK_EVENTS: Final[int] = 256
# sessions() fetches this many ids a query.
PAGE_IDS: Final[int] = 10_000

SESSIONS: Final = "dsh_schedule_sessions"
EVENTS: Final = "dsh_schedule_events"
SCHEMA: Final = "dsh_schedule_schema"
# One advisory lock key serialises migrations (an arbitrary constant of this project).
_MIGRATION_LOCK: Final = 0x647368_7363_6865

# The schema, one step per version: step i brings the database from version i to i + 1.
MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        f"""CREATE TABLE {SESSIONS} (
            id text COLLATE "C" PRIMARY KEY,
            token bigint NOT NULL,
            header bytea NOT NULL,
            length bigint NOT NULL DEFAULT 0 CHECK (length >= 0),
            next_due_ms bigint,
            next_due_length bigint
        )""",
        f"""CREATE TABLE {EVENTS} (
            session_id text COLLATE "C" NOT NULL REFERENCES {SESSIONS} (id),
            seq bigint NOT NULL CHECK (seq >= 0),
            line bytea NOT NULL,
            PRIMARY KEY (session_id, seq)
        )""",
        f"CREATE INDEX {SESSIONS}_next_due ON {SESSIONS} (next_due_ms) "
        "WHERE next_due_ms IS NOT NULL",
    ),
)
SCHEMA_VERSION: Final[int] = len(MIGRATIONS)

# The append: the fence and the lines in one statement, one transaction.
_APPEND: Final = f"""
WITH fenced AS (
    UPDATE {SESSIONS} SET length = %(length)s,
        next_due_ms = CASE WHEN %(schedule)s THEN %(due)s ELSE next_due_ms END,
        next_due_length = CASE WHEN %(schedule)s THEN %(length)s ELSE next_due_length END
    WHERE id = %(id)s AND length = %(expected)s AND token = %(token)s
    RETURNING id
)
INSERT INTO {EVENTS} (session_id, seq, line)
SELECT fenced.id, t.seq, t.line
FROM fenced, unnest(%(seqs)s::bigint[], %(lines)s::bytea[]) AS t (seq, line)
"""
# The session row and the rows from ``from`` on, in one statement (one snapshot).
_TAIL: Final = f"""
SELECT s.token, s.header, s.length, e.seq, e.line
FROM {SESSIONS} s
LEFT JOIN {EVENTS} e ON e.session_id = s.id AND e.seq >= %(from)s AND e.seq < s.length
WHERE s.id = %(id)s
ORDER BY e.seq
"""
_RANGE: Final = f"""
SELECT e.seq, e.line FROM {EVENTS} e JOIN {SESSIONS} s ON s.id = e.session_id
WHERE s.id = %(id)s AND s.token = %(token)s AND e.seq >= %(start)s AND e.seq < %(stop)s
ORDER BY e.seq
"""

# One page of the index of next due moments (``due_index``), in row key order.
_DUE_PAGE_QUERY: Final = f"""
SELECT id, next_due_ms, next_due_length FROM {SESSIONS}
WHERE next_due_ms IS NOT NULL AND next_due_ms < %(before)s AND id > %(after)s
ORDER BY id LIMIT %(limit)s
"""
_NO_LATER_MS: Final = 2**63 - 1

_ENTRY_BYTES: Final = 1024
_EVENT_BYTES: Final = 400
_LINE_FACTOR: Final = 2


def is_postgres_url(name: str) -> bool:
    """Whether a store name is a PostgreSQL URL (else it is a JSONL directory)."""
    return name.startswith(URL_SCHEMES)


@functools.lru_cache(maxsize=65_536)
def _key(session_id: str) -> str:
    """The row key of ``session_id``: its escaped form, as the JSONL file name has it."""
    return escape_session_id(session_id)


def _token() -> int:
    return secrets.randbits(62)


class _Entry:
    """What the store keeps of one session: its row token, header, length (the digest's),
    fold and ledger, and a window of the latest events. Guarded by ``lock``."""

    def __init__(self, token: int, header: SessionHeader) -> None:
        self.lock = threading.Lock()
        self.token = token
        self.header = header
        self.digest = LogDigest(header.seedLength or 0)
        self.recent: list[Event] = []
        self._sizes: list[int] = []
        self.charged = 0
        # The line of the last event fed (None: none yet): a catch-up reads the row at that
        # seq again and starts over when it differs (a server that lost commits on a crash
        # and took other appends in their place since).
        self.last_line: bytes | None = None

    @property
    def length(self) -> int:
        return self.digest.length

    def feed(self, events: Sequence[Event], sizes: Sequence[int], last_line: bytes | None
             ) -> None:
        if events:
            self.last_line = last_line
        self.digest.feed(events)
        recent = self.recent + list(events)
        kept_sizes = self._sizes + list(sizes)
        cut = max(0, len(recent) - RECENT_EVENTS)
        total = sum(kept_sizes[cut:])
        while cut < len(recent) and total > RECENT_BYTES:
            total -= kept_sizes[cut]
            cut += 1
        # New lists: the views handed out keep reading the old ones.
        self.recent = recent[cut:]
        self._sizes = kept_sizes[cut:]

    def cost(self) -> int:
        return (_ENTRY_BYTES + len(self.header.id) + _EVENT_BYTES * len(self.recent)
                + _LINE_FACTOR * sum(self._sizes) + self.digest.cost())


class _Cache:
    """The entries, least recently used first, within ``budget_bytes`` (the entry just
    used is kept even when it alone is larger). Thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._total = 0

    def get(self, session_id: str) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                self._entries.move_to_end(session_id)
            return entry

    def put(self, session_id: str, entry: _Entry) -> None:
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._total -= old.charged
            entry.charged = 0
            self._entries[session_id] = entry

    def drop(self, session_id: str) -> None:
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._total -= old.charged

    def settle(self, session_id: str, entry: _Entry) -> None:
        cost = entry.cost()
        with self._lock:
            if self._entries.get(session_id) is not entry:
                return
            self._total += cost - entry.charged
            entry.charged = cost
            for other in list(self._entries):
                if self._total <= self.budget_bytes:
                    break
                if other != session_id:
                    self._total -= self._entries.pop(other).charged

    def total(self) -> tuple[int, int]:
        with self._lock:
            return len(self._entries), self._total


class TableEvents(EventSequence):
    """The first ``length`` events of one session row, the latest few held in memory and
    older ones fetched from the events table ``CHUNK_EVENTS`` at a time. Rows never
    change once committed; a session whose row was made again since (another token) is
    refused, never read as this log."""

    __slots__ = ("_chunk", "_fetch", "_length", "_recent", "_recent_start")

    def __init__(self, fetch: Callable[[int, int], list[Event]], length: int,
                 recent: list[Event]) -> None:
        self._fetch = fetch
        self._length = length
        self._recent = recent  # never changed in place: the entry makes new lists
        self._recent_start = length - len(recent)
        self._chunk: tuple[int, list[Event]] | None = None

    def __iter__(self) -> Iterator[Event]:
        index = 0
        while index < self._recent_start:
            stop = min(index + CHUNK_EVENTS, self._recent_start)
            yield from self._fetch(index, stop)
            index = stop
        yield from self._recent

    def __repr__(self) -> str:
        return f"TableEvents(length={self._length}, in_memory={len(self._recent)})"

    def _event(self, index: int) -> Event:
        if index >= self._recent_start:
            return self._recent[index - self._recent_start]
        number = index // CHUNK_EVENTS
        cached = self._chunk
        if cached is None or cached[0] != number:
            start = number * CHUNK_EVENTS
            cached = (number, self._fetch(start, min(start + CHUNK_EVENTS, self._recent_start)))
            self._chunk = cached
        return cached[1][index - number * CHUNK_EVENTS]


class _Unflushed:
    """This store's appends to one session that no flush has confirmed yet, contiguous from
    ``first`` (row ``token``), and the outage count (``_Reachability.epoch``) when the first
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
    def after(cls, kept: _Unflushed | None, token: int, events: tuple[Event, ...],
              lines: list[bytes], epoch: int) -> _Unflushed:
        """The record once ``events`` follow what ``kept`` holds (or alone)."""
        if kept is not None and kept.token == token and kept.first + len(kept.events) == \
                events[0].seq:
            return cls(token, kept.events + events, kept.lines + lines, kept.epoch)
        return cls(token, events, lines, epoch)


class _Unconfirmed:
    """An append whose commit's outcome is unknown: the lines sent and where."""

    def __init__(self, token: int, events: tuple[Event, ...], lines: list[bytes]) -> None:
        self.token = token
        self.events = events
        self.lines = lines


class _Reachability:
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


class PostgresStore:
    """``SessionStore`` over a PostgreSQL database (``url``). Thread-safe; one pool of
    ``pool_size`` connections. ``cache_mb`` bounds what the store keeps of the sessions
    it served. ``migrate``: bring the schema to ``SCHEMA_VERSION`` on first use (else a
    database at another version is refused). ``timeout_s``: how long an operation waits
    for a connection before it fails with ``PersistenceError``."""

    def __init__(self, url: str, *, cache_mb: float = DEFAULT_CACHE_MB,
                 pool_size: int = DEFAULT_POOL_SIZE, migrate: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not cache_mb >= 0:
            raise ValueError(f"cache_mb must be a number of MiB >= 0, got {cache_mb!r}")
        self._url = url
        self._cache = _Cache(int(cache_mb * 1024 * 1024))
        self._migrate = migrate
        self._timeout_s = timeout_s
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._unconfirmed: dict[str, _Unconfirmed] = {}
        self._unconfirmed_lock = threading.Lock()
        # The appends of each session this store made and no flush confirmed yet.
        self._unflushed: dict[str, _Unflushed] = {}
        self._reach = _Reachability()
        pool_log = logging.getLogger("psycopg.pool")
        if pool_log.level == logging.NOTSET:
            # The pool says every failed connection attempt; an outage of the store is
            # said once when it starts and once when it ends by the processes instead.
            pool_log.setLevel(logging.ERROR)
        self._pool = ConnectionPool(
            url, min_size=1, max_size=max(1, pool_size), open=False, timeout=timeout_s,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(timeout_s))},
            configure=_configure, name="dsh-schedule-store",
        )
        self._pool.open(wait=False)

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        """Close the pool's connections (the store is unusable afterwards)."""
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cache_stats(self) -> tuple[int, int]:
        """How many sessions the store keeps, and their accounted bytes (diagnostics)."""
        return self._cache.total()

    # -- schema ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        """The database's schema version (0: none yet)."""
        with self._connection("read the schema version", schema=False) as conn:
            return self._version(conn)

    def migrate(self) -> tuple[int, int]:
        """Bring the schema to ``SCHEMA_VERSION``, one step (one transaction) per version;
        the versions before and after. ``PersistenceError`` for a database at a newer
        version than this code knows."""
        with self._connection("migrate the schema", schema=False, writes=True) as conn:
            before = self._version(conn)
            while True:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {SCHEMA} (one boolean PRIMARY KEY "
                        "DEFAULT true CHECK (one), version integer NOT NULL)")
                    version = self._version(conn)
                    if version > SCHEMA_VERSION:
                        raise PersistenceError(
                            f"the database's session schema is version {version}, newer than "
                            f"this release's {SCHEMA_VERSION}")
                    if version == SCHEMA_VERSION:
                        break
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {SCHEMA} (one, version) VALUES (true, %s) "
                        "ON CONFLICT (one) DO UPDATE SET version = excluded.version",
                        (version + 1,))
                    logger.info("session schema migrated to version %d", version + 1)
            self._schema_ready = True
            return before, SCHEMA_VERSION

    def _version(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (SCHEMA,)).fetchone()
        if not row or not row[0]:
            return 0
        found = conn.execute(f"SELECT version FROM {SCHEMA}").fetchone()
        return 0 if found is None else int(found[0])

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

    # -- the SessionStore contract --------------------------------------------------------

    def create(self, header: SessionHeader) -> None:
        key = _key(header.id)
        line = encode_header(header)[:-1]
        with self._connection(f"create session {header.id!r}", create=header.id,
                              writes=True) as conn:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")  # durable on return
                cur = conn.execute(
                    f"INSERT INTO {SESSIONS} (id, token, header) VALUES (%s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING", (key, _token(), line))
                if cur.rowcount != 1:
                    raise SessionExists(header.id)

    def fork(self, parent_id: str, child_id: str, *, created_at_ms: int) -> SessionHeader:
        parent_key, child_key = _key(parent_id), _key(child_id)
        with self._connection(f"fork session {parent_id!r}", create=child_id,
                              writes=True) as conn:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")  # durable on return
                # The parent's row held against appends while its lines are copied.
                row = conn.execute(
                    f"SELECT header, length FROM {SESSIONS} WHERE id = %s FOR SHARE",
                    (parent_key,)).fetchone()
                if row is None:
                    raise missing_session(parent_id)
                parent = decode_header_line(bytes(row[0]), parent_id)
                header = fork_header(parent, child_id, created_at_ms, int(row[1]))
                cur = conn.execute(
                    f"INSERT INTO {SESSIONS} (id, token, header, length) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (id) DO NOTHING",
                    (child_key, _token(), encode_header(header)[:-1], int(row[1])))
                if cur.rowcount != 1:
                    raise SessionExists(child_id)
                conn.execute(
                    f"INSERT INTO {EVENTS} (session_id, seq, line) SELECT %s, seq, line "
                    f"FROM {EVENTS} WHERE session_id = %s AND seq < %s",
                    (child_key, parent_key, int(row[1])))
        return header

    def exists(self, session_id: str) -> bool:
        key = _key(session_id)
        if self._cache.get(session_id) is not None:
            return True  # a session is never removed
        with self._connection(f"look up session {session_id!r}") as conn:
            return conn.execute(
                f"SELECT 1 FROM {SESSIONS} WHERE id = %s", (key,)).fetchone() is not None

    def sessions(self) -> list[str]:
        ids: list[str] = []
        after = ""
        with self._connection("list the sessions") as conn:
            while True:
                rows = conn.execute(f"SELECT id FROM {SESSIONS} WHERE id > %s ORDER BY id LIMIT %s",
                                    (after, PAGE_IDS)).fetchall()
                for (key,) in rows:
                    ids.append(unescape_session_id(key))
                if len(rows) < PAGE_IDS:
                    break
                after = rows[-1][0]
        return sorted(ids)

    def due_index(
        self, *, before_ms: int | None = None, after: str | None = None, limit: int = DUE_PAGE
    ) -> list[DueEntry]:
        # The column is written in the append's own transaction: always current, never
        # folded again here.
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        params = {"before": _NO_LATER_MS if before_ms is None else before_ms,
                  "after": "" if after is None else _key(after), "limit": limit}
        with self._connection("read the index of next due moments") as conn:
            rows = conn.execute(_DUE_PAGE_QUERY, params).fetchall()
        return [DueEntry(unescape_session_id(key), int(due), int(length))
                for key, due, length in rows]

    def read(self, session_id: str) -> Session:
        self._settle(session_id)
        return self._caught_up(session_id, lambda entry: self._session(session_id, entry))

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        self._settle(session_id)
        return self._caught_up(
            session_id, lambda entry: (self._session(session_id, entry), entry.digest.fold()))

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        self._settle(session_id)
        return self._append(session_id, events, expected_seq)

    def _settle(self, session_id: str) -> None:
        """Resolve this store's append of unknown outcome to the session, if any, before
        the log is read or appended to: a log read without it, or an append fenced past
        it, would leave it behind (``_confirm``; ``PersistenceError`` while it cannot)."""
        if not self._unconfirmed and not self._unflushed:  # without the lock
            return
        with self._unconfirmed_lock:
            pending = self._unconfirmed.get(session_id)
            kept = self._unflushed.get(session_id)
        if pending is not None:
            self._confirm(session_id, _key(session_id), pending)
        elif kept is not None and kept.epoch != self._reach.epoch:
            # The server failed since: find out now whether it kept them (and commit them
            # again at the same fence if it did not), before the log moves on without them.
            failure = self.flush_many([session_id]).get(session_id)
            if failure is not None:
                raise failure

    def _append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        candidates = number_events(events, expected_seq)
        lines = [encode_event(e)[:-1] for e in candidates]
        key = _key(session_id)
        for attempt in range(2):
            entry = self._entry_at(session_id, expected_seq)
            with entry.lock:
                if entry.length != expected_seq:
                    raise FenceConflict(expected_seq, entry.length)
                if not candidates:
                    return ()
                schedule = touches_schedule(candidates)
                due = None
                if schedule:
                    due = next_due_moment_ms(check_candidate(entry.digest.fold(), candidates))
                params = {
                    "id": key, "token": entry.token, "expected": expected_seq,
                    "length": expected_seq + len(candidates), "schedule": schedule, "due": due,
                    "seqs": [e.seq for e in candidates], "lines": lines,
                }
                written = self._write_append(session_id, params, entry.token, candidates, lines)
                if written == len(candidates):
                    with self._unconfirmed_lock:
                        self._unflushed[session_id] = _Unflushed.after(
                            self._unflushed.get(session_id), entry.token, candidates, lines,
                            self._reach.epoch)
                    entry.feed(candidates, [len(line) + 1 for line in lines], lines[-1])
                    self._cache.settle(session_id, entry)
                    return candidates
                if written < 0:
                    return candidates  # unknown outcome: kept unconfirmed, flush tells
            # Nothing written: the length moved (or the row was made again) since the entry
            # was caught up; catch up once more and fence against that.
            self._cache.drop(session_id)
            if attempt:
                break
        entry = self._entry_at(session_id, expected_seq)
        raise FenceConflict(expected_seq, entry.length)

    def flush(self, session_id: str) -> None:
        failure = self.flush_many([session_id]).get(session_id)
        if failure is not None:
            raise failure

    def session_lines(self, session_id: str) -> tuple[bytes, list[bytes]]:
        """The session's header line and committed event lines, as the tables hold them
        (``store copy``, ``export``)."""
        key = _key(session_id)
        with self._connection(f"read session {session_id!r}") as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            row = conn.execute(f"SELECT header, length FROM {SESSIONS} WHERE id = %s",
                               (key,)).fetchone()
            if row is None:
                raise missing_session(session_id)
            lines = [bytes(r[0]) for r in conn.execute(
                f"SELECT line FROM {EVENTS} WHERE session_id = %s AND seq < %s ORDER BY seq",
                (key, int(row[1]))).fetchall()]
        if len(lines) != int(row[1]):
            raise PersistenceError(f"session {session_id!r} misses events")
        return bytes(row[0]), lines

    def import_lines(self, session_id: str, header: bytes, lines: Sequence[bytes]) -> None:
        """Create the session holding exactly these lines in one transaction, once they
        read as its log (``store copy``); ``SessionExists`` when it exists."""
        check_lines(session_id, header, lines)
        parsed = decode_header_line(header, session_id)
        digest = LogDigest(parsed.seedLength or 0)
        digest.feed([decode_event_line(line, seq) for seq, line in enumerate(lines)])
        try:
            due: int | None = next_due_moment_ms(digest.fold())
        except ScheduleLogError:
            due = None
        key = _key(session_id)
        with self._connection(f"copy session {session_id!r}", create=session_id,
                              writes=True) as conn:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")  # durable on return
                cur = conn.execute(
                    f"INSERT INTO {SESSIONS} (id, token, header, length, next_due_ms, "
                    "next_due_length) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                    (key, _token(), header, len(lines), due, len(lines)))
                if cur.rowcount != 1:
                    raise SessionExists(session_id)
                for start in range(0, len(lines), CHUNK_EVENTS * 16):
                    part = lines[start:start + CHUNK_EVENTS * 16]
                    conn.execute(
                        f"INSERT INTO {EVENTS} (session_id, seq, line) SELECT %s, t.seq, t.line "
                        "FROM unnest(%s::bigint[], %s::bytea[]) AS t (seq, line)",
                        (key, list(range(start, start + len(part))), part))

    def flush_many(self, session_ids: Sequence[str], *, again: bool = True
                   ) -> dict[str, PersistenceError]:
        """``flush`` for many sessions, the failures by session: the appends of unknown
        outcome resolved one by one, then one synchronously committed transaction for
        all the rest, which makes every earlier commit durable (the server's log is one
        sequence) and checks that each session still holds this store's last append to it
        (a server that crashed before its log reached the disk lost it: appended again
        at the same fence when the log has not moved on since, ``again``) and that the
        sessions not cached exist. No query when nothing was appended or looked up."""
        failed: dict[str, PersistenceError] = {}
        ids = list(dict.fromkeys(session_ids))
        for session_id in ids:
            _key(session_id)
            with self._unconfirmed_lock:
                pending = self._unconfirmed.get(session_id)
            if pending is not None:
                try:
                    self._confirm(session_id, _key(session_id), pending)
                except PersistenceError as exc:
                    failed[session_id] = exc
        rest = [session_id for session_id in ids if session_id not in failed]
        for session_id in rest:
            try:
                self._flush_primitive(session_id)
            except PersistenceError as exc:
                failed[session_id] = exc
        rest = [session_id for session_id in rest if session_id not in failed]
        with self._unconfirmed_lock:
            appended = {sid: self._unflushed[sid] for sid in rest if sid in self._unflushed}
        unknown = [sid for sid in rest if sid not in appended and self._cache.get(sid) is None]
        if not appended and not unknown:
            return failed
        try:
            found, lines = self._sync(unknown, appended)
        except PersistenceError as exc:
            failed.update((sid, exc) for sid in [*appended, *unknown])
            return failed
        for session_id in unknown:
            if session_id not in found:
                failed[session_id] = missing_session(session_id)
        for session_id, record in appended.items():
            with self._unconfirmed_lock:
                if self._unflushed.get(session_id) is record:
                    del self._unflushed[session_id]
            token, line, length = lines.get(session_id, (None, None, None))
            if (token, line) == (record.token, record.lines[-1]):
                continue
            self._cache.drop(session_id)
            stop = record.first + len(record.events)
            if again and token == record.token and length is not None and \
                    record.first <= length < stop:
                failure = self._append_again(session_id, record, length)
                if failure is None:
                    continue
            failed[session_id] = PersistenceError(
                f"session {session_id!r} lost appended events (the server lost commits "
                "that had not reached its disk)")
        return failed

    def _append_again(self, session_id: str, record: _Unflushed, length: int
                      ) -> PersistenceError | None:
        """Append the lines a crashed server lost at the fence they had, and flush them:
        those from ``length`` on, once the server holds the ones before as they were (a
        later synchronous commit of another session made those durable)."""
        kept = length - record.first
        try:
            with self._connection(f"read session {session_id!r}") as conn:
                found = [bytes(r[0]) for r in conn.execute(
                    f"SELECT line FROM {EVENTS} WHERE session_id = %s AND seq >= %s AND "
                    "seq < %s ORDER BY seq", (_key(session_id), record.first, length))]
            if found != record.lines[:kept]:
                raise PersistenceError("the log holds other lines")
            self._append(session_id, [NewEvent(type=e.type, time=e.time, data=e.data)
                                      for e in record.events[kept:]], length)
        except (FenceConflict, ScheduleLogError, PersistenceError) as exc:
            return PersistenceError(f"session {session_id!r}: {exc}")
        logger.warning("session %r: appended again the %d event(s) the server lost in a "
                       "crash", session_id, len(record.events) - kept)
        return self.flush_many([session_id], again=False).get(session_id)

    def _sync(self, unknown: list[str], appended: dict[str, _Unflushed]
              ) -> tuple[set[str], dict[str, tuple[int, bytes | None, int]]]:
        """One synchronously committed transaction: the ids of ``unknown`` that exist, and
        for each of ``appended`` its row token, the line at its last recorded seq (None:
        none) and its length."""
        keys = {_key(sid): sid for sid in unknown}
        wanted = {_key(sid): (sid, record.first + len(record.events) - 1)
                  for sid, record in appended.items()}
        with self._connection("confirm sessions durable", writes=bool(wanted)) as conn, \
                conn.transaction():
            if wanted:  # else nothing to make durable: existence alone
                conn.execute("SET LOCAL synchronous_commit = on")
                conn.execute("SELECT txid_current()")  # a commit record, flushed at commit
            found = {keys[row[0]] for row in conn.execute(
                f"SELECT id FROM {SESSIONS} WHERE id = ANY(%s)", (list(keys),))} if keys else set()
            lines: dict[str, tuple[int, bytes | None, int]] = {}
            if wanted:
                rows = conn.execute(
                    f"SELECT w.id, s.token, e.line, s.length "
                    f"FROM unnest(%s::text[], %s::bigint[]) "
                    f"AS w (id, seq) JOIN {SESSIONS} s ON s.id = w.id LEFT JOIN {EVENTS} e "
                    "ON e.session_id = w.id AND e.seq = w.seq",
                    (list(wanted), [seq for _, seq in wanted.values()])).fetchall()
                for key, token, line, length in rows:
                    lines[wanted[key][0]] = (int(token), None if line is None else bytes(line),
                                             int(length))
        return found, lines

    # -- overridable primitives (tests inject faults here) --------------------------------

    def _execute_append(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        """Run the append statement; the number of lines it inserted."""
        return conn.execute(_APPEND, params).rowcount

    def _flush_primitive(self, session_id: str) -> None:
        """Called for each session a flush confirms, before the synchronous commit
        (nothing of its own to do)."""

    # -- internals ------------------------------------------------------------------------

    def _write_append(self, session_id: str, params: dict[str, Any], token: int,
                      candidates: tuple[Event, ...], lines: list[bytes]) -> int:
        """The append statement: the lines inserted (0: the fence did not hold), or -1
        when its outcome is unknown (recorded for ``flush``)."""
        sent = False
        try:
            with self._connection(f"append to session {session_id!r}", writes=True) as conn:
                try:
                    sent = True
                    return self._execute_append(conn, params)
                except pg_errors.UniqueViolation:
                    return 0  # a writer that did not take the fence got there first
                except psycopg.Error:
                    if conn.broken:
                        raise
                    sent = False  # the server answered: it rolled the statement back
                    raise
        except PersistenceError as exc:
            if not (sent and _connection_lost(exc)):
                raise
            # The connection was lost after the statement was sent: committed or not.
            self._cache.drop(session_id)
            with self._unconfirmed_lock:
                self._unconfirmed[session_id] = _Unconfirmed(token, candidates, lines)
            logger.warning("append to session %r: outcome unknown, the connection was lost "
                           "after the statement was sent", session_id)
            return -1

    def _confirm(self, session_id: str, key: str, pending: _Unconfirmed) -> None:
        """Find out whether an append of unknown outcome committed; commit it at the same
        fence when it did not and the log has not moved since. ``PersistenceError`` unless
        the lines are committed on return (once the log has moved on without them, they
        are forgotten: that flush says so, later ones confirm the rest)."""
        first = pending.events[0].seq
        stop = first + len(pending.events)
        with self._connection(f"confirm session {session_id!r}") as conn:
            row = conn.execute(f"SELECT token, length FROM {SESSIONS} WHERE id = %s",
                               (key,)).fetchone()
            found = [bytes(r[0]) for r in conn.execute(
                f"SELECT line FROM {EVENTS} WHERE session_id = %s AND seq >= %s AND seq < %s "
                "ORDER BY seq", (key, first, stop)).fetchall()]
        if row is not None and int(row[0]) == pending.token:
            if found == pending.lines:
                with self._unconfirmed_lock:  # committed: the flush makes it durable
                    self._unflushed[session_id] = _Unflushed.after(
                        self._unflushed.get(session_id), pending.token, pending.events,
                        pending.lines, self._reach.epoch)
                self._forget(session_id, pending)
                return
            if not found and int(row[1]) == first:
                again = [NewEvent(type=e.type, time=e.time, data=e.data) for e in pending.events]
                try:
                    self._append(session_id, again, first)
                except (FenceConflict, ScheduleLogError):
                    pass  # moved on meanwhile: not kept
                else:
                    with self._unconfirmed_lock:
                        confirmed = self._unconfirmed.get(session_id) is pending
                    if confirmed:
                        self._forget(session_id, pending)
                        return
                    raise PersistenceError(f"session {session_id!r} could not be confirmed "
                                           "durable")
        self._forget(session_id, pending)
        raise PersistenceError(
            f"an append to session {session_id!r} of unknown outcome was not kept")

    def _forget(self, session_id: str, pending: _Unconfirmed) -> None:
        with self._unconfirmed_lock:
            if self._unconfirmed.get(session_id) is pending:
                del self._unconfirmed[session_id]

    def _session(self, session_id: str, entry: _Entry) -> Session:
        token = entry.token
        fetch = functools.partial(self._fetch_range, session_id, token)
        events = TableEvents(fetch, entry.length, entry.recent)
        return Session(header=entry.header, events=events, ledger=entry.digest.ledger())

    def _fetch_range(self, session_id: str, token: int, start: int, stop: int) -> list[Event]:
        with self._connection(f"read session {session_id!r}") as conn:
            rows = conn.execute(_RANGE, {"id": _key(session_id), "token": token,
                                         "start": start, "stop": stop}).fetchall()
        if len(rows) != stop - start:
            raise PersistenceError(f"session {session_id!r} was replaced since it was read")
        return [decode_event_line(bytes(line), int(seq)) for seq, line in rows]

    def _caught_up(self, session_id: str, take: Callable[[_Entry], _T]) -> _T:
        entry = self._catch_up(session_id)
        with entry.lock:
            return take(entry)

    def _entry_at(self, session_id: str, expected_seq: int) -> _Entry:
        """The session's entry; caught up with the table unless it already stands at
        ``expected_seq`` (the append's statement checks the length itself)."""
        entry = self._cache.get(session_id)
        if entry is not None and entry.length == expected_seq:
            return entry
        return self._catch_up(session_id)

    def _catch_up(self, session_id: str) -> _Entry:
        """The session's entry, with every committed row fed to it (one query)."""
        key = _key(session_id)
        entry = self._cache.get(session_id)
        start = entry.length if entry is not None else 0
        last = entry.last_line if entry is not None else None
        with self._connection(f"read session {session_id!r}") as conn:
            rows = conn.execute(_TAIL, {"id": key,
                                        "from": start - 1 if last is not None else start}
                                ).fetchall()
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
            entry = _Entry(token, decode_header_line(header_line, session_id))
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
        """Find out whether the server kept this store's appends it had not confirmed when
        it failed, and append again at the same fence those it lost in a crash: the
        processes that made them have moved on (a turn delivered, a followup acknowledged)
        and may never flush those sessions again."""
        epoch = self._reach.epoch
        with self._unconfirmed_lock:
            ids = [sid for sid, kept in self._unflushed.items() if kept.epoch != epoch]
        for exc in self.flush_many(ids).values():
            if not exc.outage_said:  # else checked again when the next outage ends
                logger.warning("after the outage: %s", exc.reason)


def _configure(conn: psycopg.Connection[Any]) -> None:
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


def _connection_lost(exc: BaseException) -> bool:
    """Whether a ``PersistenceError`` came from a connection lost mid-statement (its
    outcome unknown) rather than from the server's answer."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.OperationalError) and not isinstance(
        cause, pg_errors.QueryCanceled | pg_errors.LockNotAvailable)
