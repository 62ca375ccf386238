"""The SessionStore contract (docs/architecture.md#session-logs), one suite every store runs:
the in-memory fake, the JSONL store and the PostgreSQL store (a database of the test run's
own, tests/postgres_server.py)."""

from __future__ import annotations

import errno
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.store import many
from dsh_schedule.shared.store.ids import escape_session_id
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.store.port import DueEntry, SessionExists, SessionStore, append_durably
from dsh_schedule.shared.store.postgres import PostgresStore
from tests.postgres_server import require_postgres

T0 = 1_764_579_600_000  # 2025-12-01T09:00:00.000Z
WHEN = "2026-12-01T16:00:00.000Z"
HOSTILE_IDS = ["../x", "a/b", "é", "%2F", ".", "..", "A", "a", " padded ", "line\nbreak", "\u2603"]


def at_create(schedule_id: str, prompt: str = "call back", when: str = WHEN) -> NewEvent:
    schedule = {"id": schedule_id, "kind": "at", "prompt": prompt, "scheduledAt": when}
    data = {"version": 1, "operation": "create", "schedule": schedule}
    return NewEvent(type=SCHEDULE_CHANGE, time=T0, data=data)


def delete(schedule_id: str) -> NewEvent:
    data = {"version": 1, "operation": "delete", "id": schedule_id}
    return NewEvent(type=SCHEDULE_CHANGE, time=T0, data=data)


def dispatch(schedule_id: str, accepted_at: str | None = None) -> NewEvent:
    data: dict[str, Any] = {"version": 1, "operation": "dispatch", "id": schedule_id}
    if accepted_at is not None:
        data["acceptedAt"] = accepted_at
    return NewEvent(type=SCHEDULE_CHANGE, time=T0, data=data)


def message(text: str) -> NewEvent:
    data = {"content": [{"type": "text", "text": text}], "source": {"kind": "user"}}
    return NewEvent(type=USER_MESSAGE, time=T0, data=data)


def header(session_id: str = "s1", time_zone: str | None = "Europe/Berlin") -> SessionHeader:
    return SessionHeader(id=session_id, createdAt=T0, timeZone=time_zone)


class FaultyJsonlStore(JsonlStore):
    """The JSONL store with its two I/O primitives made to fail on demand."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.write_failures = 0
        self.fsync_failures = 0
        self.log_opens = 0

    def _open_locked(self, session_id: str, flags: int, operation: int) -> tuple[int, Any]:
        self.log_opens += 1  # every read of a log that is not answered from the cache
        return super()._open_locked(session_id, flags, operation)

    def _write(self, fd: int, data: bytes, offset: int) -> None:
        if self.write_failures:
            self.write_failures -= 1
            os.pwrite(fd, data[: len(data) // 2], offset)  # part of it reached the file
            raise OSError(errno.ENOSPC, "injected: no space left")
        super()._write(fd, data, offset)

    def _fsync(self, fd: int) -> None:
        if self.fsync_failures:
            self.fsync_failures -= 1
            raise OSError(errno.EIO, "injected: fsync failed")
        super()._fsync(fd)


class FaultyPostgresStore(PostgresStore):
    """The PostgreSQL store with its append statement and its flush made to fail on demand:
    the statement is replaced by one the server refuses (so it answers, and nothing is
    written)."""

    write_failures = 0
    flush_failures = 0

    def _execute_append(self, conn: Any, params: dict[str, Any]) -> int:
        if self.write_failures:
            self.write_failures -= 1
            conn.execute("SELECT 1 / 0")
        return super()._execute_append(conn, params)

    def _flush_primitive(self, session_id: str) -> None:
        if self.flush_failures:
            self.flush_failures -= 1
            raise PersistenceError(f"injected: flush of session {session_id!r} failed")
        super()._flush_primitive(session_id)


@dataclass
class Harness:
    store: SessionStore
    break_next_write: Callable[[], None]
    break_next_flush: Callable[[], None]


@dataclass
class IndexHarness(Harness):
    """A store whose index of next due moments is written apart from its logs, so a crash
    can part them: keep a session's entry and put it back later (a crash between the log's
    write and the index's), drop the whole index, count log reads."""

    keep_due_entry: Callable[[str], object]
    put_back_due_entry: Callable[[str, object], None]
    drop_due_index: Callable[[], None]
    log_reads: Callable[[], int]


def _memory_harness(_: Path) -> IndexHarness:
    store = MemoryStore()

    def drop() -> None:
        for session_id in store.sessions():
            store.set_due_entry(session_id, None)

    return IndexHarness(
        store, store.fail_next_append, store.fail_next_flush,
        lambda session_id: store.due_entries()[session_id],
        lambda session_id, kept: store.set_due_entry(session_id, kept),  # type: ignore[arg-type]
        drop, lambda: store.log_reads,
    )


def _jsonl_harness(root: Path) -> IndexHarness:
    store = FaultyJsonlStore(root / "sessions")

    def break_write() -> None:
        store.write_failures += 1

    def break_flush() -> None:
        store.fsync_failures += 1

    def entry_path(session_id: str) -> Path:
        return store.root / ".due" / (escape_session_id(session_id) + ".due")

    def put_back(session_id: str, kept: object) -> None:
        assert isinstance(kept, bytes)
        entry_path(session_id).write_bytes(kept)

    return IndexHarness(
        store, break_write, break_flush,
        lambda session_id: entry_path(session_id).read_bytes(), put_back,
        lambda: shutil.rmtree(store.root / ".due"), lambda: store.log_opens,
    )


def _postgres_harness(_: Path) -> Harness:
    from tests.postgres_server import empty_database

    url = require_postgres()
    empty_database(url)
    store = FaultyPostgresStore(url)

    def break_write() -> None:
        store.write_failures += 1

    def break_flush() -> None:
        store.flush_failures += 1

    return Harness(store, break_write, break_flush)


@pytest.fixture(params=[
    _memory_harness, _jsonl_harness, pytest.param(_postgres_harness, marks=pytest.mark.postgres),
], ids=["memory", "jsonl", "postgres"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    made = request.param(tmp_path)
    try:
        yield made
    finally:
        if isinstance(made.store, PostgresStore):
            made.store.close()


@pytest.fixture(params=[_memory_harness, _jsonl_harness], ids=["memory", "jsonl"])
def apart(request: pytest.FixtureRequest, tmp_path: Path) -> IndexHarness:
    """The stores whose index is written apart from the log (the PostgreSQL store writes
    it in the append's own transaction: nothing can part them)."""
    made: IndexHarness = request.param(tmp_path)
    return made


@pytest.fixture
def store(harness: Harness) -> SessionStore:
    return harness.store


# -- create, exists, sessions, ids --------------------------------------------------------


@pytest.mark.parametrize("time_zone", ["Europe/Berlin", None], ids=["zoned", "headerless"])
def test_a_created_session_reads_back_its_header_and_no_events(
    store: SessionStore, time_zone: str | None
) -> None:
    # given / when
    store.create(header("s1", time_zone))
    # then
    session = store.read("s1")
    assert session.header == header("s1", time_zone)
    assert session.events == ()
    assert store.exists("s1")
    assert not store.exists("s2")
    assert store.sessions() == ["s1"]


def test_creating_an_existing_session_fails_and_keeps_the_first(store: SessionStore) -> None:
    store.create(header("s1", "Europe/Berlin"))
    store.append("s1", [message("hi")], 0)
    with pytest.raises(SessionExists):
        store.create(header("s1", None))
    assert store.read("s1").header.timeZone == "Europe/Berlin"
    assert len(store.read("s1").events) == 1


def test_hostile_session_ids_round_trip_without_collisions(store: SessionStore) -> None:
    # given: ids that are paths, escapes, dots, case twins and non-ASCII
    for session_id in HOSTILE_IDS:
        store.create(header(session_id))
    # when
    listed = store.sessions()
    # then
    assert listed == sorted(HOSTILE_IDS)
    for session_id in HOSTILE_IDS:
        assert store.exists(session_id)
        assert store.read(session_id).header.id == session_id


@pytest.mark.parametrize("bad_id", ["", "\ud800", "x" * 250], ids=["empty", "surrogate", "long"])
def test_an_unusable_session_id_is_a_value_error(store: SessionStore, bad_id: str) -> None:
    with pytest.raises(ValueError):
        store.create(header(bad_id))
    with pytest.raises(ValueError):
        store.exists(bad_id)
    assert store.sessions() == []


# -- append and fencing -------------------------------------------------------------------


def test_append_numbers_the_events_from_the_expected_seq(store: SessionStore) -> None:
    store.create(header())
    first = store.append("s1", [message("a"), message("b")], 0)
    second = store.append("s1", [message("c")], 2)
    assert [e.seq for e in first] == [0, 1]
    assert [e.seq for e in second] == [2]
    assert store.read("s1").events == first + second


def test_append_keeps_unknown_event_types_and_their_data(store: SessionStore) -> None:
    data = {"nested": [1, 2.5, "é", None, True, {"k": []}]}
    store.create(header())
    store.append("s1", [NewEvent(type="tool/call", time=T0 + 1, data=data)], 0)
    (event,) = store.read("s1").events
    assert (event.type, event.seq, event.time, event.data) == ("tool/call", 0, T0 + 1, data)
    assert store.load("s1")[1].active == ()


def test_a_message_holding_a_lone_surrogate_is_kept_and_forked(store: SessionStore) -> None:
    # given: text another host took from a UTF-16 string, cut inside a pair
    data = {"content": [{"type": "text", "text": "cut \ud83d"}], "source": {"kind": "user"}}
    store.create(header("parent"))
    # when it is appended, read back and forked
    store.append("parent", [NewEvent(type=USER_MESSAGE, time=T0, data=data)], 0)
    store.append("parent", [at_create("schedule-1")], 1)
    store.fork("parent", "child", created_at_ms=T0)
    # then both sessions read it back unchanged and still fold
    for session_id in ("parent", "child"):
        session, _ = store.load(session_id)
        assert session.events[0].data == data
    assert [r.id for r in store.load("parent")[1].active] == ["schedule-1"]


@pytest.mark.parametrize("expected", [1, 3], ids=["stale", "ahead"])
def test_a_fenced_append_at_the_wrong_length_conflicts_and_writes_nothing(
    store: SessionStore, expected: int
) -> None:
    # given: a log of length 2
    store.create(header())
    store.append("s1", [message("a"), message("b")], 0)
    before = store.read("s1")
    # when / then
    with pytest.raises(FenceConflict) as caught:
        store.append("s1", [message("late")], expected)
    assert (caught.value.expected, caught.value.actual) == (expected, 2)
    assert store.read("s1") == before


def test_appends_to_many_sessions_are_each_fenced_at_their_own_length(
    store: SessionStore
) -> None:
    # given three sessions of lengths 1, 1 and 2
    for session_id in ("s1", "s2", "s3"):
        store.create(header(session_id))
        store.append(session_id, [message("a")], 0)
    store.append("s3", [message("b")], 1)
    before = store.read("s3")
    # when appended to together (in one round trip where the store can), one of them at a
    # length it no longer has
    appended = many.append(store, [("s1", [message("b"), message("c")], 1),
                                   ("s2", [at_create("schedule-1")], 1),
                                   ("s3", [message("late")], 1)])
    # then each one whose fence held holds its events, numbered from there, and the other
    # conflicts and is unchanged
    s1, s2, s3 = appended["s1"], appended["s2"], appended["s3"]
    assert not isinstance(s1, Exception) and [e.seq for e in s1] == [1, 2]
    assert not isinstance(s2, Exception) and [e.seq for e in s2] == [1]
    assert isinstance(s3, FenceConflict) and (s3.expected, s3.actual) == (1, 2)
    assert [e.data["content"][0]["text"] for e in store.read("s1").events] == ["a", "b", "c"]
    assert [r.id for r in store.load("s2")[1].active] == ["schedule-1"]
    assert store.read("s3") == before
    for session_id in ("s1", "s2", "s3"):
        store.flush(session_id)
    assert [entry.session_id for entry in store.due_index()] == ["s2"]


def test_an_empty_append_is_fenced_and_writes_nothing(store: SessionStore) -> None:
    store.create(header())
    store.append("s1", [message("a")], 0)
    assert store.append("s1", [], 1) == ()
    with pytest.raises(FenceConflict):
        store.append("s1", [], 0)
    assert len(store.read("s1").events) == 1


def test_threads_appending_with_retries_lose_nothing(store: SessionStore) -> None:
    # given
    store.create(header())
    threads, per_thread = 4, 25

    def appender(tag: int) -> None:
        for i in range(per_thread):
            while True:
                length = len(store.read("s1").events)
                try:
                    store.append("s1", [NewEvent(type="t", time=i, data=[tag, i])], length)
                    break
                except FenceConflict:
                    continue

    # when
    workers = [threading.Thread(target=appender, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # then
    events = store.read("s1").events
    assert [e.seq for e in events] == list(range(threads * per_thread))
    for tag in range(threads):
        assert [e.data[1] for e in events if e.data[0] == tag] == list(range(per_thread))


# -- missing sessions ---------------------------------------------------------------------


MISSING_OPERATIONS: dict[str, Callable[[SessionStore], object]] = {
    "read": lambda s: s.read("ghost"),
    "load": lambda s: s.load("ghost"),
    "append": lambda s: s.append("ghost", [message("a")], 0),
    "flush": lambda s: s.flush("ghost"),
    "fork": lambda s: s.fork("ghost", "child", created_at_ms=T0),
}


@pytest.mark.parametrize("operation", MISSING_OPERATIONS.values(), ids=MISSING_OPERATIONS.keys())
def test_a_missing_session_is_a_persistence_failure_never_an_empty_log(
    store: SessionStore, operation: Callable[[SessionStore], object]
) -> None:
    with pytest.raises(PersistenceError):
        operation(store)
    assert not store.exists("ghost")
    assert store.sessions() == []


# -- fold and invariant -------------------------------------------------------------------


def test_load_folds_the_log_and_follows_its_growth(store: SessionStore) -> None:
    # given
    store.create(header())
    store.append("s1", [at_create("schedule-1"), message("x"), at_create("schedule-2")], 0)
    # when
    session, state = store.load("s1")
    # then
    assert [r.id for r in state.active] == ["schedule-1", "schedule-2"]
    # when: the log grows
    store.append("s1", [delete("schedule-1")], len(session.events))
    session, state = store.load("s1")
    # then
    assert len(session.events) == 4
    assert [r.id for r in state.active] == ["schedule-2"]
    assert state.created == {"schedule-1", "schedule-2"}


def test_loading_many_sessions_reads_each_as_its_own_load_does(store: SessionStore) -> None:
    # given three sessions, one cached at a length it has grown past, and one missing
    for session_id in ("s1", "s2", "s3"):
        store.create(header(session_id))
    store.append("s1", [at_create("schedule-1"), message("x")], 0)
    store.append("s2", [message("y")], 0)
    store.load("s1")
    store.append("s1", [delete("schedule-1")], 2)
    # when they are loaded together (a batch's reads: one round trip where the store can)
    loaded = many.load(store, ["s1", "s2", "ghost", "s3", "s1"])
    # then each reads as its own load, and the missing one fails alone
    assert list(loaded) == ["s1", "s2", "ghost", "s3"]
    assert isinstance(loaded["ghost"], PersistenceError)
    for session_id in ("s1", "s2", "s3"):
        found = loaded[session_id]
        assert isinstance(found, tuple), found
        session, state = store.load(session_id)
        assert list(found[0].events) == list(session.events)
        assert found[0].header == session.header
        assert found[1] == state
    s1 = loaded["s1"]
    assert isinstance(s1, tuple) and s1[1].active == () and s1[1].created == {"schedule-1"}


CORRUPTING_BATCHES: dict[str, list[NewEvent]] = {
    "delete of an unknown id": [delete("schedule-9")],
    "create of a used id": [at_create("schedule-1")],
    "one-shot dispatch with acceptedAt": [dispatch("schedule-1", WHEN)],
    "valid message before a bad record": [message("fine"), delete("schedule-9")],
    "valid record before a bad one": [delete("schedule-1"), delete("schedule-1")],
    "shape error": [NewEvent(type=SCHEDULE_CHANGE, time=T0, data={"version": 2})],
    "a prompt holding a lone surrogate": [at_create("schedule-2", "call \ud800")],
}


@pytest.mark.parametrize("batch", CORRUPTING_BATCHES.values(), ids=CORRUPTING_BATCHES.keys())
def test_the_invariant_rejects_a_corrupting_append_and_writes_nothing(
    store: SessionStore, batch: list[NewEvent]
) -> None:
    # given: schedule-1 is active
    store.create(header())
    store.append("s1", [at_create("schedule-1")], 0)
    before = store.load("s1")
    # when / then
    with pytest.raises(ScheduleLogError):
        store.append("s1", batch, 1)
    assert store.load("s1") == before
    assert store.append("s1", [dispatch("schedule-1")], 1)[0].seq == 1


# -- fork ---------------------------------------------------------------------------------


def test_a_fork_copies_the_parent_and_starts_its_own_schedule_suffix(store: SessionStore) -> None:
    # given: a parent with one active schedule
    store.create(header("parent", "Asia/Tokyo"))
    store.append("parent", [message("hi"), at_create("schedule-1"), message("bye")], 0)
    # when
    child = store.fork("parent", "child", created_at_ms=T0 + 5)
    # then
    assert child == SessionHeader(
        id="child", createdAt=T0 + 5, timeZone="Asia/Tokyo", parentSession="parent", seedLength=3
    )
    session, state = store.load("child")
    assert session.header == child
    assert session.events == store.read("parent").events
    assert state.active == ()


def test_a_fork_appends_after_its_seed_and_owns_only_its_suffix(store: SessionStore) -> None:
    # given
    store.create(header("parent"))
    store.append("parent", [at_create("schedule-1")], 0)
    store.fork("parent", "child", created_at_ms=T0)
    # when: the child may not touch the parent's record, but may reuse its id
    with pytest.raises(ScheduleLogError):
        store.append("child", [delete("schedule-1")], 1)
    appended = store.append("child", [at_create("schedule-1"), delete("schedule-1")], 1)
    # then
    assert [e.seq for e in appended] == [1, 2]
    assert store.load("child")[1].active == ()
    assert [r.id for r in store.load("parent")[1].active] == ["schedule-1"]
    assert len(store.read("parent").events) == 1


def test_forking_onto_an_existing_session_fails(store: SessionStore) -> None:
    store.create(header("parent"))
    store.create(header("child"))
    with pytest.raises(SessionExists):
        store.fork("parent", "child", created_at_ms=T0)
    assert store.read("child").header.parentSession is None


# -- failures -----------------------------------------------------------------------------


def test_a_failed_write_is_reported_and_leaves_nothing(harness: Harness) -> None:
    # given
    store = harness.store
    store.create(header())
    store.append("s1", [at_create("schedule-1")], 0)
    before = store.load("s1")
    # when
    harness.break_next_write()
    with pytest.raises(PersistenceError):
        store.append("s1", [message("lost"), dispatch("schedule-1")], 1)
    # then: nothing of it remains, and the same fence works again
    assert store.load("s1") == before
    assert [e.seq for e in store.append("s1", [message("kept")], 1)] == [1]


def test_a_failed_flush_is_reported_and_keeps_the_events(harness: Harness) -> None:
    # given
    store = harness.store
    store.create(header())
    appended = store.append("s1", [message("a")], 0)
    # when
    harness.break_next_flush()
    with pytest.raises(PersistenceError):
        store.flush("s1")
    # then: the events stay, and a later flush confirms them
    assert store.read("s1").events == appended
    store.flush("s1")
    assert store.read("s1").events == appended


def test_an_append_made_durable_with_it_answers_its_flush(harness: Harness) -> None:
    # given (a store that cannot make the append itself durable appends, then flushes)
    store = harness.store
    store.create(header())
    # when the write fails, then it is raised and nothing of it remains
    harness.break_next_write()
    with pytest.raises(PersistenceError):
        append_durably(store, "s1", [message("lost")], 0)
    assert store.read("s1").events == ()
    # when the flush fails, then it is answered, the events stay and a later flush confirms
    harness.break_next_flush()
    appended, unconfirmed = append_durably(store, "s1", [message("a")], 0)
    assert isinstance(unconfirmed, PersistenceError)
    assert store.read("s1").events == appended
    store.flush("s1")
    # when both succeed, then the events are appended and durable
    appended, unconfirmed = append_durably(store, "s1", [message("b")], 1)
    assert ([e.seq for e in appended], unconfirmed) == ([1], None)
    with pytest.raises(FenceConflict):
        append_durably(store, "s1", [message("stale")], 1)
    assert len(store.read("s1").events) == 2


# -- the fake's own fault switches --------------------------------------------------------


def test_the_fake_counts_flush_attempts_and_tracks_unflushed_events() -> None:
    store = MemoryStore()
    store.create(header())
    store.append("s1", [message("a")], 0)
    assert store.flush_count("s1") == 0
    assert [e.seq for e in store.unflushed("s1")] == [0]
    store.fail_next_flush()
    with pytest.raises(PersistenceError):
        store.flush("s1")
    assert [e.seq for e in store.unflushed("s1")] == [0]
    store.flush("s1")
    assert store.unflushed("s1") == ()
    assert (store.flush_count("s1"), store.flush_calls) == (2, ["s1", "s1"])


def test_the_fake_fails_every_flush_while_the_switch_is_on() -> None:
    store = MemoryStore()
    store.create(header())
    store.fail_flushes = True
    for _ in range(3):
        with pytest.raises(PersistenceError):
            store.flush("s1")
    store.fail_flushes = False
    store.flush("s1")
    assert store.flush_count("s1") == 4


def test_the_fake_fails_reads_while_the_switch_is_on() -> None:
    store = MemoryStore()
    store.create(header())
    store.fail_reads = True
    with pytest.raises(PersistenceError):
        store.read("s1")
    with pytest.raises(PersistenceError):
        store.load("s1")
    store.fail_reads = False
    assert store.read("s1").events == ()


def test_the_fake_checks_the_fence_and_invariant_before_an_injected_write_failure() -> None:
    store = MemoryStore()
    store.create(header())
    store.fail_next_append(2)
    with pytest.raises(FenceConflict):
        store.append("s1", [message("a")], 5)
    with pytest.raises(ScheduleLogError):
        store.append("s1", [delete("schedule-1")], 0)
    for _ in range(2):
        with pytest.raises(PersistenceError):
            store.append("s1", [message("a")], 0)
    assert store.append("s1", [message("a")], 0)[0].seq == 0


# -- the index of next due moments ----------------------------------------------------------

EARLIER = "2026-06-01T08:00:00.000Z"


def all_due(store: SessionStore, **kwargs: Any) -> list[DueEntry]:
    return store.due_index(**kwargs)


def test_the_due_index_follows_creates_deletes_and_dispatches(store: SessionStore) -> None:
    # given: a reminder, one deleted, one dispatched, a session with none and a fork
    for session_id in ["a", "b", "c", "d"]:
        store.create(header(session_id))
    store.append("a", [at_create("r1")], 0)
    store.append("b", [at_create("r1")], 0)
    store.append("b", [delete("r1")], 1)
    store.append("c", [at_create("r1", when=EARLIER), at_create("r2")], 0)
    store.append("c", [dispatch("r1")], 2)
    store.append("d", [message("hi")], 0)
    store.fork("a", "e", created_at_ms=T0)
    # when / then: each session's next due moment and the length it was derived from
    assert all_due(store) == [DueEntry("a", parse_instant(WHEN), 1),
                              DueEntry("c", parse_instant(WHEN), 3)]
    # and: a later append is followed, the dispatch of the last reminder removes it
    store.append("c", [dispatch("r2")], 3)
    store.append("a", [at_create("r0", when=EARLIER)], 1)
    assert all_due(store) == [DueEntry("a", parse_instant(EARLIER), 2)]


def test_the_due_index_pages_and_filters_by_the_due_moment(store: SessionStore) -> None:
    ids = [f"s{i}" for i in range(5)]
    for i, session_id in enumerate(ids):
        store.create(header(session_id))
        store.append(session_id, [at_create("r1", when=EARLIER if i % 2 else WHEN)], 0)
    # when: paged two at a time
    pages: list[list[DueEntry]] = []
    after: str | None = None
    while True:
        page = store.due_index(after=after, limit=2)
        pages.append(page)
        if len(page) < 2:
            break
        after = page[-1].session_id
    # then: every session once, in order; a short page is the last
    assert [[e.session_id for e in page] for page in pages] == [["s0", "s1"], ["s2", "s3"], ["s4"]]
    # and: before_ms keeps the moments strictly before it
    assert [e.session_id for e in store.due_index(before_ms=parse_instant(WHEN))] == ["s1", "s3"]
    assert store.due_index(before_ms=parse_instant(EARLIER)) == []
    with pytest.raises(ValueError):
        store.due_index(limit=0)


def test_the_due_index_pages_through_hostile_ids_in_escaped_order(store: SessionStore) -> None:
    for session_id in HOSTILE_IDS:
        store.create(header(session_id))
        store.append(session_id, [at_create("r1")], 0)
    seen: list[str] = []
    after: str | None = None
    while page := store.due_index(after=after, limit=3):
        seen.extend(entry.session_id for entry in page)
        after = page[-1].session_id
    assert seen == sorted(HOSTILE_IDS, key=escape_session_id)


def test_a_log_grown_after_its_due_entry_is_folded_again(apart: IndexHarness) -> None:
    # given: the entry of a reminder due at WHEN
    harness = apart
    store = harness.store
    store.create(header("s1"))
    store.append("s1", [at_create("r1")], 0)
    kept = harness.keep_due_entry("s1")
    # when: an earlier reminder is appended and the entry written before it comes back
    # (a crash between the append and the index write)
    store.append("s1", [at_create("r0", when=EARLIER)], 1)
    harness.put_back_due_entry("s1", kept)
    reads = harness.log_reads()
    # then: the log is folded again: the earlier moment, never the stale later one
    assert all_due(store) == [DueEntry("s1", parse_instant(EARLIER), 2)]
    assert harness.log_reads() > reads
    # and: the entry was written again, so the next answer reads no log
    reads = harness.log_reads()
    assert all_due(store) == [DueEntry("s1", parse_instant(EARLIER), 2)]
    assert harness.log_reads() == reads


def test_a_dropped_due_index_is_rebuilt_by_one_scan_and_then_reads_no_logs(
    apart: IndexHarness,
) -> None:
    # given: ten sessions, six with a reminder, and their index
    harness = apart
    store = harness.store
    for i in range(10):
        store.create(header(f"s{i}"))
        store.append(f"s{i}", [at_create("r1") if i < 6 else message("hi")], 0)
    expected = [DueEntry(f"s{i}", parse_instant(WHEN), 1) for i in range(6)]
    assert all_due(store) == expected
    # when: the index is current, it is answered without reading any log
    reads = harness.log_reads()
    assert all_due(store) == expected
    assert harness.log_reads() == reads
    # when: the whole index is lost
    harness.drop_due_index()
    # then: one scan reads each log once and answers the same
    assert all_due(store) == expected
    assert harness.log_reads() == reads + 10
    # and: after it, no log is read again
    assert all_due(store) == expected
    assert harness.log_reads() == reads + 10
