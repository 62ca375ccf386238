"""The PostgreSQL store's own promises (docs/architecture.md#session-logs): the exact lines of
the JSONL store, the versioned schema, the fence backed by the unique key, the next due
moment kept beside a session, the cache within its budget and paged listing.

The contract every store keeps is tests/adapters/test_store_contract.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.store import postgres, postgres_schema
from dsh_schedule.shared.store.codec import MAX_LINE_DEPTH
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.postgres import EVENTS, SCHEMA_VERSION, SESSIONS, PostgresStore
from tests.adapters.test_store_contract import (
    WHEN,
    at_create,
    delete,
    dispatch,
    header,
    message,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(postgres_store: PostgresStore) -> PostgresStore:
    return postgres_store


@pytest.fixture
def schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose tables live in a schema of their own (created, then dropped)."""
    schema = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        yield f"{postgres_url}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


def rows(url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def test_events_are_kept_as_the_exact_lines_of_the_jsonl_store(
    store: PostgresStore, postgres_url: str, tmp_path: Path
) -> None:
    # given: the same session written to both stores, a lone surrogate included
    jsonl = JsonlStore(tmp_path)
    odd = message("cut \ud83d and \u2603")
    batches = [[message("hi"), at_create("schedule-1")], [odd], [dispatch("schedule-1")]]
    for target in (jsonl, store):
        target.create(header("s1"))
        length = 0
        for batch in batches:
            length += len(target.append("s1", batch, length))
    # when
    stored = rows(postgres_url, f"SELECT line FROM {EVENTS} WHERE session_id = 's1' ORDER BY seq")
    (head,) = rows(postgres_url, f"SELECT header FROM {SESSIONS} WHERE id = 's1'")
    # then: header and event lines byte for byte, and the same events read back
    lines = jsonl.path("s1").read_bytes().split(b"\n")
    assert [bytes(head[0])] + [bytes(r[0]) for r in stored] + [b""] == lines
    assert store.read("s1").events == jsonl.read("s1").events
    fresh = PostgresStore(postgres_url)
    try:
        assert fresh.load("s1") == jsonl.load("s1")
    finally:
        fresh.close()


def test_the_store_creates_its_schema_one_version_at_a_time(schema_url: str) -> None:
    # given: an empty schema, and a store that must not migrate
    unmigrated = PostgresStore(schema_url, migrate=False)
    try:
        assert unmigrated.schema_version() == 0
        with pytest.raises(PersistenceError, match="store migrate"):
            unmigrated.create(header())
        # when
        assert unmigrated.migrate() == (0, SCHEMA_VERSION)
        # then: a second migration changes nothing, and the store works
        assert unmigrated.migrate() == (SCHEMA_VERSION, SCHEMA_VERSION)
        unmigrated.create(header())
        assert unmigrated.sessions() == ["s1"]
    finally:
        unmigrated.close()


def test_a_database_newer_than_the_release_is_refused(schema_url: str) -> None:
    with PostgresStore(schema_url) as store:
        store.migrate()
    with psycopg.connect(schema_url, autocommit=True) as conn:
        conn.execute("UPDATE dsh_schedule_schema SET version = version + 1")
    with PostgresStore(schema_url) as store, pytest.raises(PersistenceError, match="newer"):
        store.exists("s1")


def test_a_row_slipped_in_without_the_fence_is_a_conflict_never_a_duplicate(
    store: PostgresStore, postgres_url: str
) -> None:
    # given: this store has the session cached at length 1
    store.create(header())
    store.append("s1", [message("a")], 0)
    # when: another writer puts seq 1 in place without moving the session's length
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {EVENTS} VALUES ('s1', 1, %s)",  # type: ignore[arg-type]
                     (b'{"type":"t","seq":1,"time":0,"data":null}',))
    # then: the append at length 1 does not hold, and seq 1 stays one row
    with pytest.raises(FenceConflict):
        store.append("s1", [message("b")], 1)
    assert rows(postgres_url, f"SELECT count(*) FROM {EVENTS} WHERE seq = 1") == [(1,)]


def test_appends_by_another_store_are_caught_up_and_fence_this_one(
    store: PostgresStore, postgres_url: str
) -> None:
    store.create(header())
    store.append("s1", [at_create("schedule-1")], 0)
    with PostgresStore(postgres_url) as other:
        other.append("s1", [message("x"), delete("schedule-1")], 1)
    with pytest.raises(FenceConflict) as caught:
        store.append("s1", [dispatch("schedule-1")], 1)
    assert caught.value.actual == 3
    session, state = store.load("s1")
    assert len(session.events) == 3 and state.active == ()


def test_the_next_due_moment_is_written_with_each_schedule_change(
    store: PostgresStore, postgres_url: str
) -> None:
    def due() -> list[tuple[object, ...]]:
        return rows(postgres_url,
                    f"SELECT next_due_ms, next_due_length FROM {SESSIONS} WHERE id = 's1'")

    store.create(header())
    assert due() == [(None, None)]
    store.append("s1", [at_create("schedule-1")], 0)
    assert due() == [(parse_instant(WHEN), 1)]
    store.append("s1", [message("unrelated")], 1)  # no Schedule record: left as it was
    assert due() == [(parse_instant(WHEN), 1)]
    store.append("s1", [delete("schedule-1")], 2)
    assert due() == [(None, 3)]


def test_a_long_log_is_read_back_from_the_table_within_a_small_budget(
    postgres_url: str,
) -> None:
    # given: a store that may keep almost nothing, and a log longer than the window
    with PostgresStore(postgres_url, cache_mb=0.01) as store:
        for n in range(3):
            store.create(header(f"s{n}"))
        batch = [message(f"m{i}") for i in range(700)]
        store.append("s0", batch, 0)
        for n in (1, 2):
            store.append(f"s{n}", [message("x")], 0)
        # when
        session = store.read("s0")
        # then: every event, in order, though most were fetched on demand
        assert [e.data["content"][0]["text"] for e in session.events] == [
            f"m{i}" for i in range(700)]
        assert session.events[3].seq == 3 and session.events[-1].seq == 699
        entries, accounted = store.cache_stats()
        assert entries < 3 or accounted <= 0.01 * 1024 * 1024


def test_sessions_are_listed_page_by_page(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "PAGE_IDS", 2)
    ids = ["b", "A", "a", "é", "c-1"]
    for session_id in ids:
        store.create(header(session_id))
    assert store.sessions() == sorted(ids)


def test_an_unreachable_server_is_a_persistence_failure() -> None:
    # nothing listens on port 1
    with PostgresStore("postgresql://postgres@127.0.0.1:1/none", timeout_s=1) as store:
        with pytest.raises(PersistenceError):
            store.exists("s1")
        with pytest.raises(PersistenceError):
            store.create(header())


def test_a_row_beyond_the_line_bounds_reads_as_a_corrupt_log(
    store: PostgresStore, postgres_url: str
) -> None:
    # given: a line no append accepts, put in the table by another program
    store.create(header())
    deep = b'{"type":"t","seq":0,"time":0,"data":' + b"[" * MAX_LINE_DEPTH + b"]" * MAX_LINE_DEPTH
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {EVENTS} VALUES ('s1', 0, %s)",  # type: ignore[arg-type]
                     (deep + b"}",))
        conn.execute(f"UPDATE {SESSIONS} SET length = 1")  # type: ignore[arg-type]
    # then
    with PostgresStore(postgres_url) as fresh, pytest.raises(ScheduleLogError, match="deeper"):
        fresh.read("s1")


def test_a_flush_finds_an_append_the_server_lost_and_says_so(
    store: PostgresStore, postgres_url: str
) -> None:
    # given: an append committed without waiting for the server's disk
    store.create(header())
    store.append("s1", [message("a")], 0)
    store.flush("s1")
    store.append("s1", [message("b")], 1)
    # when the server loses it (as a crash before its log reached the disk does)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {EVENTS} WHERE seq = 1")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {SESSIONS} SET length = 1")  # type: ignore[arg-type]
    # then the flush finds it lost and, the log not having moved since, appends it again
    # at the same fence
    store.flush("s1")
    with PostgresStore(postgres_url) as fresh:
        assert [e.data["content"][0]["text"] for e in fresh.read("s1").events] == ["a", "b"]


def test_a_flush_appends_again_only_the_part_a_crash_lost(
    store: PostgresStore, postgres_url: str
) -> None:
    # given two appends no flush confirmed, of which the server kept the first (another
    # session's synchronous commit made it durable) and lost the second
    store.create(header())
    store.append("s1", [message("a"), message("b")], 0)
    store.append("s1", [message("c")], 2)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {EVENTS} WHERE seq = 2")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {SESSIONS} SET length = 2")  # type: ignore[arg-type]
    # when it flushes, then the lost part alone is appended again, after the kept one
    store.flush("s1")
    with PostgresStore(postgres_url) as fresh:
        texts = [e.data["content"][0]["text"] for e in fresh.read("s1").events]
    assert texts == ["a", "b", "c"]


def test_a_read_after_the_server_lost_an_append_and_took_another_reads_the_log_as_it_is(
    store: PostgresStore, postgres_url: str
) -> None:
    # given: this store's append, which the server then loses (a crash before its log
    # reached the disk), and another writer's append at the same seq since
    store.create(header())
    store.append("s1", [message("a")], 0)
    store.append("s1", [message("lost")], 1)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {EVENTS} WHERE seq = 1")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {SESSIONS} SET length = 1")  # type: ignore[arg-type]
    with PostgresStore(postgres_url) as other:
        other.append("s1", [message("other")], 1)
        other.append("s1", [message("next")], 2)
    # when this store reads it, then the log as the server holds it, not what it kept
    texts = [e.data["content"][0]["text"] for e in store.read("s1").events]
    assert texts == ["a", "other", "next"]
    # and its flush says what it lost, which the log has moved on without
    with pytest.raises(PersistenceError, match="lost"):
        store.flush("s1")
    store.flush("s1")  # nothing of this store's is unconfirmed any more


def test_sessions_loaded_together_catch_up_with_other_writers_and_lost_commits(
    store: PostgresStore, postgres_url: str
) -> None:
    # given: three sessions this store has cached; another store appends to one, and the
    # server loses this store's last append to another, which a third writer replaced
    for session_id in ("s1", "s2", "s3"):
        store.create(header(session_id))
        store.append(session_id, [message(f"{session_id} a")], 0)
        store.load(session_id)
    store.append("s2", [message("lost")], 1)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {EVENTS} WHERE session_id = 's2' AND seq = 1")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {SESSIONS} SET length = 1 WHERE id = 's2'")  # type: ignore[arg-type]
    with PostgresStore(postgres_url) as other:
        other.append("s1", [message("s1 b"), message("s1 c")], 1)
        other.append("s2", [message("other")], 1)
    # when this store loads them together (one query)
    loaded = store.load_many(["s1", "s2", "s3"])
    # then each reads as the server holds it
    def texts(session_id: str) -> list[str]:
        found = loaded[session_id]
        assert isinstance(found, tuple), found
        return [e.data["content"][0]["text"] for e in found[0].events]

    assert texts("s1") == ["s1 a", "s1 b", "s1 c"]
    assert texts("s2") == ["s2 a", "other"]
    assert texts("s3") == ["s3 a"]
    # and the next append fences at what it read
    store.append("s1", [message("s1 d")], 3)


def test_one_flush_confirms_a_batch_and_names_a_missing_session(
    store: PostgresStore,
) -> None:
    for n in range(5):
        store.create(header(f"s{n}"))
        store.append(f"s{n}", [message("a")], 0)
    assert store.flush_many([f"s{n}" for n in range(5)] + ["ghost"]).keys() == {"ghost"}
    assert store.flush_many([f"s{n}" for n in range(5)]) == {}  # nothing left: no query


def test_an_append_made_durable_with_it_commits_synchronously(schema_url: str) -> None:
    # given: a trigger noting, for each line the append inserts, how its transaction commits
    with PostgresStore(schema_url) as store:
        store.create(header())
        with psycopg.connect(schema_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE seen (seq bigint, sync text)")
            conn.execute("CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "INSERT INTO seen VALUES (NEW.seq, current_setting('synchronous_commit'));"
                         " RETURN NEW; END $$")
            conn.execute(f"CREATE TRIGGER note AFTER INSERT ON {EVENTS} "  # type: ignore[arg-type]
                         "FOR EACH ROW EXECUTE FUNCTION note()")
        # when: an append the flush confirms later, then appends made durable with it
        store.append("s1", [message("a")], 0)
        appended, unconfirmed = store.append_durably("s1", [message("b"), message("c")], 1)
        assert ([e.seq for e in appended], unconfirmed) == ([1, 2], None)
        assert store.append_durably("s1", [message("d")], 3)[1] is None
        with pytest.raises(FenceConflict):
            store.append_durably("s1", [message("stale")], 3)
    # then those commit synchronously, the others as the connection says, and a stale
    # fence wrote nothing
    assert rows(schema_url, "SELECT seq, sync FROM seen ORDER BY seq") == [
        (0, "off"), (1, "on"), (2, "on"), (3, "on")]
    with PostgresStore(schema_url) as fresh:
        assert len(fresh.read("s1").events) == 4


@pytest.mark.parametrize("query", ["TAIL_MANY", "RANGE"])
def test_reads_find_a_sessions_rows_by_index(
    store: PostgresStore, postgres_url: str, query: str
) -> None:
    # the events' key leads with the session: a collation the query cannot use it with
    # leaves a scan of every session's rows, and a seq the index scan is not bounded by
    # reads every row of the session
    store.create(header())
    params = {"id": "s1", "token": 1, "start": 0, "stop": 9, "ids": ["s1", "s2"],
              "froms": [0, 3]}
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(row[0] for row in conn.execute(
            "EXPLAIN " + getattr(postgres_schema, query), params).fetchall())  # type: ignore[operator]
    assert any("Index Cond" in line and "session_id" in line and "seq >=" in line
               for line in plan.splitlines()), plan


class CountingStore(PostgresStore):
    """Counts the append statements, and cuts the connection around the next statement
    that appends to many sessions (``cut``: True after it commits, False before)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.single = 0
        self.many = 0
        self.cut: bool | None = None

    def _execute_append(self, conn: Any, params: dict[str, Any]) -> int:
        self.single += 1
        return super()._execute_append(conn, params)

    def _execute_append_many(self, conn: Any, params: dict[str, Any]) -> list[str]:
        self.many += 1
        cut, self.cut = self.cut, None
        if cut is None:
            return super()._execute_append_many(conn, params)
        if cut:
            super()._execute_append_many(conn, params)
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        raise AssertionError("the server ended the connection")


def test_appends_to_many_sessions_are_one_statement_fenced_by_the_server(
    postgres_url: str
) -> None:
    # given three sessions this store has read, one of which another store appended to
    with CountingStore(postgres_url) as store:
        for session_id in ("s1", "s2", "s3"):
            store.create(header(session_id))
            store.append(session_id, [message(f"{session_id} a")], 0)
            store.load(session_id)
        with PostgresStore(postgres_url) as other:
            other.append("s3", [message("other")], 1)
        store.single = 0
        # when it appends to the three together
        appended = store.append_many([(session_id, [message(f"{session_id} b")], 1)
                                      for session_id in ("s1", "s2", "s3")])
        # then one statement wrote the two whose fence held; the third conflicts, at the
        # length the server holds, with nothing written for it
        assert (store.many, store.single) == (1, 0)
        conflict = appended["s3"]
        assert isinstance(conflict, FenceConflict) and conflict.actual == 2
        store.flush_many(["s1", "s2", "s3"])
    with PostgresStore(postgres_url) as fresh:
        texts = {sid: [e.data["content"][0]["text"] for e in fresh.read(sid).events]
                 for sid in ("s1", "s2", "s3")}
    assert texts == {"s1": ["s1 a", "s1 b"], "s2": ["s2 a", "s2 b"], "s3": ["s3 a", "other"]}


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_appends_to_many_sessions_whose_reply_was_lost_are_confirmed_once(
    postgres_url: str, committed: bool
) -> None:
    # given two sessions, and a connection cut after (or before) the statement appending
    # to both committed
    with CountingStore(postgres_url) as store:
        for session_id in ("s1", "s2"):
            store.create(header(session_id))
            store.append(session_id, [message("a")], 0)
        store.cut = committed
        # when it appends to both
        appended = store.append_many([(sid, [message("b")], 1) for sid in ("s1", "s2")])
        # then each answer is the events it sent, whose outcome the flush decides: found
        # committed, or committed now at the same fence; either way each is there once
        assert all(not isinstance(found, Exception) for found in appended.values())
        assert store.flush_many(["s1", "s2"]) == {}
    with PostgresStore(postgres_url) as fresh:
        for session_id in ("s1", "s2"):
            texts = [e.data["content"][0]["text"] for e in fresh.read(session_id).events]
            assert texts == ["a", "b"]
