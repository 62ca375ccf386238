"""The PostgreSQL session store's tables (shared/store/postgres.py): their schema, one
migration step per version, the statements the store runs over them, and the row key of
a session."""

from __future__ import annotations

import functools
import logging
import secrets
from typing import Any, Final

import psycopg

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.store.ids import escape_session_id

logger = logging.getLogger("dsh_schedule.shared.store.postgres")

SESSIONS: Final = "dsh_schedule_sessions"
EVENTS: Final = "dsh_schedule_events"
SCHEMA: Final = "dsh_schedule_schema"
# One advisory lock key serialises migrations (an arbitrary constant of this project).
MIGRATION_LOCK: Final = 0x647368_7363_6865

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

# The append: the fence and the lines in one statement, one transaction. ``durable``: the
# transaction commits synchronously (``set_config`` local to it, called before a line is
# inserted; nothing inserted, nothing to commit), else as the connection says (off).
APPEND: Final = f"""
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
WHERE CASE WHEN %(durable)s THEN set_config('synchronous_commit', 'on', true) = 'on'
    ELSE true END
"""
# The appends to many sessions, each fenced at its own length, in one statement (one
# transaction, committed as the connection says: off). The rows are locked in id order,
# so two such statements over the same sessions wait for each other, never deadlock; a
# session whose fence does not hold gets no line. The ids of the lines inserted.
APPEND_MANY: Final = f"""
WITH w AS (
    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(expected)s::bigint[],
                         %(lengths)s::bigint[], %(schedule)s::boolean[], %(due)s::bigint[])
        AS w (id, token, expected, length, schedule, due)
), locked AS (
    SELECT s.id FROM {SESSIONS} s JOIN w ON s.id = w.id
    WHERE s.length = w.expected AND s.token = w.token
    ORDER BY s.id FOR UPDATE OF s
), fenced AS (
    UPDATE {SESSIONS} s SET length = w.length,
        next_due_ms = CASE WHEN w.schedule THEN w.due ELSE s.next_due_ms END,
        next_due_length = CASE WHEN w.schedule THEN w.length ELSE s.next_due_length END
    FROM w WHERE s.id = w.id AND s.length = w.expected AND s.token = w.token
        AND s.id IN (SELECT id FROM locked)
    RETURNING s.id
)
INSERT INTO {EVENTS} (session_id, seq, line)
SELECT fenced.id, l.seq, l.line
FROM unnest(%(line_ids)s::text[], %(seqs)s::bigint[], %(lines)s::bytea[]) AS l (id, seq, line)
JOIN fenced ON fenced.id = l.id
RETURNING session_id
"""
# Each session's row and its rows from its own seq on, in one statement (one snapshot),
# the session id first. The events are joined on ``w.id``, not ``s.id``: so the planner
# bounds their index scan by ``w.from_seq`` too, instead of reading every row of a
# session and filtering.
TAIL_MANY: Final = f"""
SELECT s.id, s.token, s.header, s.length, e.seq, e.line
FROM unnest(%(ids)s::text[], %(froms)s::bigint[]) AS w (id, from_seq)
JOIN {SESSIONS} s ON s.id = w.id
LEFT JOIN {EVENTS} e ON e.session_id = w.id AND e.seq >= w.from_seq AND e.seq < s.length
ORDER BY s.id, e.seq
"""
RANGE: Final = f"""
SELECT e.seq, e.line FROM {EVENTS} e JOIN {SESSIONS} s ON s.id = e.session_id
WHERE s.id = %(id)s AND s.token = %(token)s AND e.seq >= %(start)s AND e.seq < %(stop)s
ORDER BY e.seq
"""

# One page of the index of next due moments (``due_index``), in row key order.
DUE_PAGE_QUERY: Final = f"""
SELECT id, next_due_ms, next_due_length FROM {SESSIONS}
WHERE next_due_ms IS NOT NULL AND next_due_ms < %(before)s AND id > %(after)s
ORDER BY id LIMIT %(limit)s
"""
NO_LATER_MS: Final = 2**63 - 1


@functools.lru_cache(maxsize=65_536)
def row_key(session_id: str) -> str:
    """The row key of ``session_id``: its escaped form, as the JSONL file name has it."""
    return escape_session_id(session_id)


def new_token() -> int:
    return secrets.randbits(62)


def migrate_database(conn: psycopg.Connection[Any]) -> int:
    """Bring the schema to ``SCHEMA_VERSION``, one step (one transaction) per version; the
    version before. ``PersistenceError`` for a database at a newer version than this code
    knows."""
    before = database_version(conn)
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {SCHEMA} (one boolean PRIMARY KEY "
                "DEFAULT true CHECK (one), version integer NOT NULL)")
            version = database_version(conn)
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
    return before


def database_version(conn: psycopg.Connection[Any]) -> int:
    """The database's schema version (0: none yet)."""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (SCHEMA,)).fetchone()
    if not row or not row[0]:
        return 0
    found = conn.execute(f"SELECT version FROM {SCHEMA}").fetchone()
    return 0 if found is None else int(found[0])
