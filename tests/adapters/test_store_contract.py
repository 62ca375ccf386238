"""The SessionStore contract (docs/architecture.md#session-logs), one suite every store runs:
the in-memory fake, the JSONL store and the PostgreSQL store (a database of the test run's
own, tests/postgres_server.py)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, NewEvent, SessionHeader
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.store.port import SessionExists, SessionStore
from dsh_schedule.shared.store.postgres import PostgresStore
from tests.postgres_server import require_postgres

T0 = 1_764_579_600_000  # 2025-12-01T09:00:00.000Z
WHEN = "2026-12-01T16:00:00.000Z"
HOSTILE_IDS = ["../x", "a/b", "é", "%2F", ".", "..", "A", "a", " padded ", "line\nbreak", "\u2603"]


def at_create(schedule_id: str, prompt: str = "call back") -> NewEvent:
    schedule = {"id": schedule_id, "kind": "at", "prompt": prompt, "scheduledAt": WHEN}
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


def _memory_harness(_: Path) -> Harness:
    store = MemoryStore()
    return Harness(store, store.fail_next_append, store.fail_next_flush)


def _jsonl_harness(root: Path) -> Harness:
    store = FaultyJsonlStore(root / "sessions")

    def break_write() -> None:
        store.write_failures += 1

    def break_flush() -> None:
        store.fsync_failures += 1

    return Harness(store, break_write, break_flush)


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
