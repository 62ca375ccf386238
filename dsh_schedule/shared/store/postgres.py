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

The tables and their migrations are in ``postgres_schema``, the cache in ``postgres_cache``,
the outages in ``postgres_outage``, the pool and reads in ``postgres_reading``, the appends
and their durability in ``postgres_appending``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dsh_schedule.shared.core.due import next_due_moment_ms
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Event, NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.codec import (
    decode_event_line,
    decode_header_line,
    encode_header,
    fork_header,
)
from dsh_schedule.shared.store.foldcache import LogDigest
from dsh_schedule.shared.store.ids import unescape_session_id
from dsh_schedule.shared.store.port import DUE_PAGE, DueEntry, SessionExists, missing_session
from dsh_schedule.shared.store.postgres_appending import PostgresAppending
from dsh_schedule.shared.store.postgres_cache import CHUNK_EVENTS, SessionEntry, TableEvents
from dsh_schedule.shared.store.postgres_outage import outage_errno
from dsh_schedule.shared.store.postgres_reading import (
    DEFAULT_CACHE_MB,
    DEFAULT_POOL_SIZE,
    DEFAULT_TIMEOUT_S,
    DOWN_TIMEOUT_S,
    tail_from,
)
from dsh_schedule.shared.store.postgres_schema import (
    DUE_PAGE_QUERY,
    EVENTS,
    MIGRATIONS,
    NO_LATER_MS,
    SCHEMA,
    SCHEMA_VERSION,
    SESSIONS,
    new_token,
    row_key,
)
from dsh_schedule.shared.store.transfer import check_lines

__all__ = [
    "CHUNK_EVENTS", "DEFAULT_CACHE_MB", "DEFAULT_POOL_SIZE", "DEFAULT_TIMEOUT_S",
    "DOWN_TIMEOUT_S", "EVENTS", "MIGRATIONS", "PAGE_IDS", "SCHEMA", "SCHEMA_VERSION",
    "SESSIONS", "PostgresStore", "TableEvents", "outage_errno",
]

# sessions() fetches this many ids a query.
PAGE_IDS: Final[int] = 10_000


class PostgresStore(PostgresAppending):
    """``SessionStore`` over a PostgreSQL database (``url``). Thread-safe; one pool of
    ``pool_size`` connections. ``cache_mb`` bounds what the store keeps of the sessions
    it served. ``migrate``: bring the schema to ``SCHEMA_VERSION`` on first use (else a
    database at another version is refused). ``timeout_s``: how long an operation waits
    for a connection before it fails with ``PersistenceError``."""

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the SessionStore contract --------------------------------------------------------

    def create(self, header: SessionHeader) -> None:
        key = row_key(header.id)
        line = encode_header(header)[:-1]
        token = new_token()
        with self._connection(f"create session {header.id!r}", create=header.id,
                              writes=True) as conn:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")  # durable on return
                cur = conn.execute(
                    f"INSERT INTO {SESSIONS} (id, token, header) VALUES (%s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING", (key, token, line))
                if cur.rowcount != 1:
                    raise SessionExists(header.id)
        # Kept as a read of the row would keep it: its first flush needs no query.
        entry = SessionEntry(token, decode_header_line(line, header.id))
        self._cache.put(header.id, entry)
        self._cache.settle(header.id, entry)

    def fork(self, parent_id: str, child_id: str, *, created_at_ms: int) -> SessionHeader:
        parent_key, child_key = row_key(parent_id), row_key(child_id)
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
                    (child_key, new_token(), encode_header(header)[:-1], int(row[1])))
                if cur.rowcount != 1:
                    raise SessionExists(child_id)
                conn.execute(
                    f"INSERT INTO {EVENTS} (session_id, seq, line) SELECT %s, seq, line "
                    f"FROM {EVENTS} WHERE session_id = %s AND seq < %s",
                    (child_key, parent_key, int(row[1])))
        return header

    def exists(self, session_id: str) -> bool:
        key = row_key(session_id)
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
        params = {"before": NO_LATER_MS if before_ms is None else before_ms,
                  "after": "" if after is None else row_key(after), "limit": limit}
        with self._connection("read the index of next due moments") as conn:
            rows = conn.execute(DUE_PAGE_QUERY, params).fetchall()
        return [DueEntry(unescape_session_id(key), int(due), int(length))
                for key, due, length in rows]

    def read(self, session_id: str) -> Session:
        self._settle(session_id)
        return self._caught_up(session_id, lambda entry: self._session(session_id, entry))

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        self._settle(session_id)
        return self._caught_up(
            session_id, lambda entry: (self._session(session_id, entry), entry.digest.fold()))

    def load_many(self, session_ids: Sequence[str]
                  ) -> dict[str, tuple[Session, FoldState] | Exception]:
        """``load`` for many sessions, their rows read in one query (``LoadsMany``): each
        one's log and fold, or what failed for it alone (``PersistenceError``, a
        ``ScheduleLogError``)."""
        loaded: dict[str, tuple[Session, FoldState] | Exception] = {}
        ready = []
        for session_id in dict.fromkeys(session_ids):
            try:
                self._settle(session_id)
            except Exception as exc:
                loaded[session_id] = exc
            else:
                ready.append(session_id)
        # ``_catch_up`` for every session at once: one query, each from its cached length.
        cached = {session_id: self._cache.get(session_id) for session_id in ready}
        tails = {session_id: tail_from(entry) for session_id, entry in cached.items()}
        try:
            found = self._read_tails(f"read {len(tails)} sessions", tails)
        except PersistenceError as exc:
            return {**loaded, **dict.fromkeys(ready, exc)}
        for session_id, entry in cached.items():
            try:
                fed = self._feed_tail(session_id, entry, *tails[session_id],
                                      found[session_id])
                with fed.lock:
                    loaded[session_id] = (self._session(session_id, fed), fed.digest.fold())
            except Exception as exc:  # that session's alone (a missing or broken log)
                loaded[session_id] = exc
        return loaded

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        self._settle(session_id)
        return self._append(session_id, events, expected_seq)

    def flush(self, session_id: str) -> None:
        failure = self.flush_many([session_id]).get(session_id)
        if failure is not None:
            raise failure

    def session_lines(self, session_id: str) -> tuple[bytes, list[bytes]]:
        """The session's header line and committed event lines, as the tables hold them
        (``store copy``, ``export``)."""
        key = row_key(session_id)
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
        key = row_key(session_id)
        with self._connection(f"copy session {session_id!r}", create=session_id,
                              writes=True) as conn:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = on")  # durable on return
                cur = conn.execute(
                    f"INSERT INTO {SESSIONS} (id, token, header, length, next_due_ms, "
                    "next_due_length) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                    (key, new_token(), header, len(lines), due, len(lines)))
                if cur.rowcount != 1:
                    raise SessionExists(session_id)
                for start in range(0, len(lines), CHUNK_EVENTS * 16):
                    part = lines[start:start + CHUNK_EVENTS * 16]
                    conn.execute(
                        f"INSERT INTO {EVENTS} (session_id, seq, line) SELECT %s, t.seq, t.line "
                        "FROM unnest(%s::bigint[], %s::bytea[]) AS t (seq, line)",
                        (key, list(range(start, start + len(part))), part))
