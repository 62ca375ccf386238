"""The JSONL store's own promises (docs/architecture.md#session-logs): file layout, escaping,
torn lines,
corruption, rollback, fsync failures, the incremental cache and multi-process appends."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    USER_MESSAGE,
    Event,
    NewEvent,
    SessionHeader,
)
from dsh_schedule.shared.store.codec import decode_event_line, decode_header_line, encode_event
from dsh_schedule.shared.store.ids import escape_session_id, unescape_session_id
from dsh_schedule.shared.store.jsonl import JsonlStore, read_session_file
from dsh_schedule.shared.store.port import SessionExists

T0 = 1_764_579_600_000
WHEN = "2026-12-01T16:00:00.000Z"
WORKER = Path(__file__).with_name("_append_worker.py")


def at_create(schedule_id: str) -> NewEvent:
    schedule = {"id": schedule_id, "kind": "at", "prompt": "call back", "scheduledAt": WHEN}
    data = {"version": 1, "operation": "create", "schedule": schedule}
    return NewEvent(type=SCHEDULE_CHANGE, time=T0, data=data)


def delete(schedule_id: str) -> NewEvent:
    data = {"version": 1, "operation": "delete", "id": schedule_id}
    return NewEvent(type=SCHEDULE_CHANGE, time=T0, data=data)


def message(text: str) -> NewEvent:
    return NewEvent(type=USER_MESSAGE, time=T0, data={"content": text})


def header(session_id: str = "s1", time_zone: str | None = None) -> SessionHeader:
    return SessionHeader(id=session_id, createdAt=T0, timeZone=time_zone)


@pytest.fixture
def store(tmp_path: Path) -> JsonlStore:
    return JsonlStore(tmp_path / "sessions")


def write_lines(store: JsonlStore, session_id: str, *lines: str, end: str = "\n") -> Path:
    path = store.path(session_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\n".join(lines) + end).encode())
    return path


def event_line(seq: int, data: Any = None, kind: str = "note") -> str:
    return json.dumps({"type": kind, "seq": seq, "time": T0, "data": data})


HEADER_LINE = '{"type":"session","version":0,"id":"s1","createdAt":1764579600000}'


# -- layout -------------------------------------------------------------------------------


def test_the_file_is_a_header_line_then_one_event_per_line(store: JsonlStore) -> None:
    # given / when
    store.create(header("s1", "Europe/Berlin"))
    store.append("s1", [message("hi"), NewEvent(type="x", time=5, data=None)], 0)
    # then
    assert store.path("s1").read_bytes() == (
        b'{"type":"session","version":0,"id":"s1","createdAt":1764579600000,'
        b'"timeZone":"Europe/Berlin"}\n'
        b'{"type":"user/message","seq":0,"time":1764579600000,"data":{"content":"hi"}}\n'
        b'{"type":"x","seq":1,"time":5,"data":null}\n'
    )


def test_a_fork_header_names_its_parent_and_seed_length(store: JsonlStore) -> None:
    store.create(header("p"))
    store.append("p", [message("hi")], 0)
    store.fork("p", "c", created_at_ms=7)
    first = store.path("c").read_bytes().split(b"\n")[0]
    assert first == (
        b'{"type":"session","version":0,"id":"c","createdAt":7,"parentSession":"p","seedLength":1}'
    )


def test_a_fork_copies_the_parents_committed_lines_as_written(store: JsonlStore) -> None:
    # given a long parent, one line written by another host's encoder, and a torn tail
    store.create(header("p"))
    store.append("p", [message(f"m{i}") for i in range(300)], 0)
    path = store.path("p")
    with path.open("ab") as f:
        f.write(b'{"type": "note", "seq": 300, "time": 1, "data": [1, 2]}\n{"type":"no')
    # when it is forked
    child = store.fork("p", "c", created_at_ms=7)
    # then the child holds the parent's complete lines, byte for byte, and reads back alike
    assert child.seedLength == 301
    parent_lines = path.read_bytes().split(b"\n")[1:-1]
    assert store.path("c").read_bytes().split(b"\n")[1:] == [*parent_lines, b""]
    assert JsonlStore(store.root).read("c").events == store.read("p").events


def test_create_and_fork_leave_only_session_files(store: JsonlStore) -> None:
    store.create(header("p"))
    store.fork("p", "c", created_at_ms=T0)
    with pytest.raises(SessionExists):
        store.create(header("c"))
    assert sorted(os.listdir(store.root)) == ["c.jsonl", "p.jsonl"]


# -- escaping -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "segment"),
    [
        ("agent-1_x", "agent-1_x"),
        ("../x", "%2E%2E%2Fx"),
        ("a/b", "a%2Fb"),
        ("é", "%C3%A9"),
        ("%2F", "%252%46"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("Ab", "%41b"),
    ],
)
def test_a_session_id_becomes_one_safe_file_name(
    store: JsonlStore, session_id: str, segment: str
) -> None:
    assert escape_session_id(session_id) == segment
    store.create(header(session_id))
    assert os.listdir(store.root) == [segment + ".jsonl"]
    assert store.path(session_id).parent == store.root


# 20 characters of at most 4 UTF-8 bytes escape to at most 240 bytes: always a file name.
@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20))
def test_escaping_round_trips_into_a_plain_segment(session_id: str) -> None:
    segment = escape_session_id(session_id)
    assert re.fullmatch(r"(?:[a-z0-9_-]|%[0-9A-F]{2})+", segment, re.ASCII)
    assert unescape_session_id(segment) == session_id


def test_an_id_too_long_for_a_file_name_is_refused() -> None:
    with pytest.raises(ValueError):
        escape_session_id("\U00010000" * 21)  # 21 x 12 escaped bytes > 249


@pytest.mark.parametrize("segment", ["%2f", "%4", "A", "%41%", ".", "%2", "%FF", "%61", ""])
def test_a_segment_no_id_escapes_to_is_rejected(segment: str) -> None:
    with pytest.raises(ValueError):
        unescape_session_id(segment)


def test_sessions_ignores_files_it_did_not_write(store: JsonlStore) -> None:
    store.create(header("s1"))
    for name in ["README", ".x.staging", "UPPER.jsonl", "%2f.jsonl", "s2.json"]:
        (store.root / name).write_text("")
    assert store.sessions() == ["s1"]


def test_sessions_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert JsonlStore(tmp_path / "nowhere").sessions() == []


# -- torn lines and corruption ------------------------------------------------------------


def test_a_torn_final_line_is_ignored_and_cut_by_the_next_append(store: JsonlStore) -> None:
    # given: a crash left half a line behind
    store.create(header())
    store.append("s1", [message("a"), message("b")], 0)
    path = store.path("s1")
    with path.open("ab") as f:
        f.write(b'{"type":"user/message","seq":2,"ti')
    # when / then: readers ignore it
    assert len(store.read("s1").events) == 2
    assert len(JsonlStore(store.root).read("s1").events) == 2
    # when: the next appender cuts it
    store.append("s1", [message("c")], 2)
    # then
    assert path.read_bytes().endswith(b'"data":{"content":"c"}}\n')
    fresh = JsonlStore(store.root).read("s1")
    assert [e.data["content"] for e in fresh.events] == ["a", "b", "c"]


@pytest.mark.parametrize("content", ["", HEADER_LINE], ids=["empty", "torn header"])
def test_a_file_without_a_complete_header_is_a_persistence_failure(
    store: JsonlStore, content: str
) -> None:
    write_lines(store, "s1", content, end="")
    with pytest.raises(PersistenceError):
        store.read("s1")
    with pytest.raises(SessionExists):
        store.create(header("s1"))


CORRUPT_FILES: dict[str, tuple[list[str], str]] = {
    "garbage middle line": ([HEADER_LINE, event_line(0), "{not json", event_line(2)], "line 3"),
    "garbage last complete line": ([HEADER_LINE, event_line(0), "[]"], "line 3"),
    "empty middle line": ([HEADER_LINE, "", event_line(0)], "line 2"),
    "seq gap": ([HEADER_LINE, event_line(0), event_line(2)], "line 3"),
    "seq not from 0": ([HEADER_LINE, event_line(1)], "line 2"),
    "event without data": ([HEADER_LINE, '{"type":"x","seq":0,"time":1}'], "line 2"),
    "another session's header": ([HEADER_LINE.replace('"s1"', '"s2"')], "line 1"),
    "header not a session": ([HEADER_LINE.replace('"session"', '"note"')], "line 1"),
    "header not an object": (["[1]"], "line 1"),
}


@pytest.mark.parametrize(
    ("lines", "where"), CORRUPT_FILES.values(), ids=CORRUPT_FILES.keys()
)
def test_a_malformed_line_is_corruption(store: JsonlStore, lines: list[str], where: str) -> None:
    write_lines(store, "s1", *lines)
    with pytest.raises(ScheduleLogError, match=f"log {where} malformed"):
        store.read("s1")
    with pytest.raises(ScheduleLogError):
        store.append("s1", [message("x")], 0)


def test_corruption_after_the_cached_prefix_is_found(store: JsonlStore) -> None:
    store.create(header())
    store.append("s1", [message("a")], 0)
    store.read("s1")
    with store.path("s1").open("a") as f:
        f.write("garbage\n" + event_line(2) + "\n")
    with pytest.raises(ScheduleLogError, match="log line 3 malformed"):
        store.read("s1")


def test_a_log_with_corrupt_schedule_records_reads_but_does_not_load(store: JsonlStore) -> None:
    # given: a delete of an id that was never created, written by someone else
    write_lines(store, "s1", HEADER_LINE, event_line(0, delete("x").data, SCHEDULE_CHANGE))
    # then
    assert len(store.read("s1").events) == 1
    with pytest.raises(ScheduleLogError):
        store.load("s1")
    with pytest.raises(ScheduleLogError):
        store.append("s1", [at_create("schedule-1")], 1)
    assert store.append("s1", [message("still a log")], 1)[0].seq == 1


def test_a_session_that_is_not_a_file_is_a_persistence_failure(store: JsonlStore) -> None:
    store.path("s1").mkdir(parents=True)
    with pytest.raises(PersistenceError):
        store.read("s1")
    with pytest.raises(PersistenceError):
        store.append("s1", [message("x")], 0)


def test_a_seed_length_beyond_the_log_reads_but_does_not_load(store: JsonlStore) -> None:
    forked = HEADER_LINE.replace("}", ',"parentSession":"p","seedLength":2}')
    write_lines(store, "s1", forked, event_line(0))
    assert store.read("s1").seed_length == 2
    with pytest.raises(ScheduleLogError, match="seedLength"):
        store.load("s1")


def test_any_session_file_can_be_read_by_its_path(store: JsonlStore, tmp_path: Path) -> None:
    # given: a session file under a name that is not its id, with a torn tail
    path = tmp_path / "copy.log"
    path.write_text(HEADER_LINE + "\n" + event_line(0, "x") + "\n" + '{"ty')
    # when / then
    session = read_session_file(path)
    assert (session.header.id, [e.data for e in session.events]) == ("s1", ["x"])
    with pytest.raises(PersistenceError):
        read_session_file(tmp_path / "missing.jsonl")
    with pytest.raises(PersistenceError):
        read_session_file(tmp_path)
    path.write_text(HEADER_LINE + "\nnope\n")
    with pytest.raises(ScheduleLogError):
        read_session_file(path)


# -- text that is not valid Unicode -------------------------------------------------------

# Lines as another host may write them: JSON allows a \uD800-\uDFFF escape on its own.
LONE_SURROGATE_LINES = [
    pytest.param(
        rb'{"type":"user/message","seq":0,"time":1,"data":{"content":"hi \ud800"}}',
        {"content": "hi \ud800"},
        id="a lone high surrogate in a user message is kept as written",
    ),
    pytest.param(
        rb'{"type":"user/message","seq":0,"time":1,"data":["\uDC00 \u00e9"]}',
        ["\udc00 \u00e9"],
        id="a lone low surrogate, in upper case, next to other escapes",
    ),
    pytest.param(
        rb'{"type":"note","seq":0,"time":1,"data":{"k\udfff":1}}',
        {"k\udfff": 1},
        id="a lone surrogate in a key",
    ),
    pytest.param(
        rb'{"type":"note","seq":0,"time":1,"data":"\ud83d\ude00 \ud83d"}',
        "\U0001f600 \ud83d",
        id="a pair is one character and a lone one beside it stays lone",
    ),
    pytest.param(
        rb'{"type":"note","seq":0,"time":1,"data":"\\ud800"}',
        "\\ud800",
        id="an escaped backslash before ud800 is plain text",
    ),
]


@pytest.mark.parametrize(("line", "data"), LONE_SURROGATE_LINES)
def test_a_line_holding_a_lone_surrogate_escape_decodes(line: bytes, data: Any) -> None:
    event = decode_event_line(line, 0)
    assert event.data == data
    assert decode_event_line(encode_event(event)[:-1], 0) == event


MALFORMED_SURROGATE_LINES = [
    pytest.param(rb'{"type":"x","seq":0,"time":1,"data":"\ud800"', "", id="a truncated line"),
    pytest.param(
        rb'{"type":"x","seq":0,"time":1,"data":["\ud800",NaN]}', "", id="NaN is not JSON"
    ),
    pytest.param(rb'{"type":1,"seq":0,"time":1,"data":"\ud800"}', "", id="a type not a string"),
    pytest.param(rb'{"type":"x","seq":0,"time":1,"d":"\ud800"}', "", id="an event without data"),
    pytest.param(
        b'{"type":"x","seq":0,"time":1,"data":"\\ud800 \xff"}', "", id="bytes not UTF-8"
    ),
    pytest.param(
        rb'{"type":"x","seq":1,"time":1,"data":"\ud800"}',
        ": seq 1 where 0 was expected",
        id="the wrong seq",
    ),
    pytest.param(
        rb'{"type":"x","seq":0,"time":1,"data":"\ud800"} x', "", id="text after the object"
    ),
]


@pytest.mark.parametrize(("line", "why"), MALFORMED_SURROGATE_LINES)
def test_a_malformed_line_stays_malformed_with_a_lone_surrogate(line: bytes, why: str) -> None:
    with pytest.raises(ScheduleLogError, match=f"^log line 2 malformed{re.escape(why)}$"):
        decode_event_line(line, 0)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param("\ud800", id="a lone surrogate alone"),
        pytest.param({"k\udc00": ["\u00e9\ud800", 1.5, None, True]}, id="nested, beside non-ASCII"),
    ],
)
def test_a_value_holding_a_lone_surrogate_is_written_as_an_escape(data: Any) -> None:
    line = encode_event(Event(type="note", seq=0, time=1, data=data))
    line.decode("utf-8")  # valid UTF-8 on disk
    assert b"\\ud800" in line or b"\\udc00" in line
    assert decode_event_line(line[:-1], 0).data == data


def test_a_header_holding_a_lone_surrogate_decodes() -> None:
    line = rb'{"type":"session","version":0,"id":"s\ud800","createdAt":1}'
    assert decode_header_line(line, None).id == "s\ud800"
    with pytest.raises(ScheduleLogError, match="line 1 malformed"):
        decode_header_line(line, "s1")


def test_another_hosts_message_with_a_lone_surrogate_leaves_the_session_readable(
    store: JsonlStore,
) -> None:
    # given a session where another host wrote a user message holding a lone surrogate
    lines = [HEADER_LINE, event_line(0, {"content": "hi \ud800"}, USER_MESSAGE)]
    write_lines(store, "s1", *lines, event_line(1, at_create("schedule-1").data, SCHEDULE_CHANGE))

    # when it is read, folded, appended to and forked
    session, state = store.load("s1")
    store.append("s1", [message("after")], 2)
    store.fork("s1", "child", created_at_ms=T0)

    # then the message reads back as written, and nothing about the schedule changed
    assert session.events[0].data == {"content": "hi \ud800"}
    assert [r.id for r in state.active] == ["schedule-1"]
    assert store.read("child").events[0].data == {"content": "hi \ud800"}
    assert JsonlStore(store.root).read("s1").events[2].data == {"content": "after"}


def test_a_schedule_change_with_a_lone_surrogate_prompt_stays_corruption(
    store: JsonlStore,
) -> None:
    # given another host's create whose prompt holds a lone surrogate
    create = at_create("schedule-1").data
    create["schedule"]["prompt"] = "call \ud800"
    write_lines(store, "s1", HEADER_LINE, event_line(0, create, SCHEDULE_CHANGE))

    # then the log reads, but its schedule records are corrupt
    assert store.read("s1").events[0].data == create
    with pytest.raises(ScheduleLogError, match="lone surrogate") as caught:
        store.load("s1")
    assert caught.value.seq == 0


# -- write and fsync failures -------------------------------------------------------------


def test_a_failed_write_is_truncated_back(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given
    store.create(header())
    store.append("s1", [message("a")], 0)
    before = store.path("s1").read_bytes()

    def half_then_fail(fd: int, data: bytes, offset: int) -> None:
        os.pwrite(fd, data[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, "no space left")

    monkeypatch.setattr(store, "_write", half_then_fail)
    # when
    with pytest.raises(PersistenceError):
        store.append("s1", [message("b"), message("c")], 1)
    # then
    assert store.path("s1").read_bytes() == before
    monkeypatch.undo()
    assert store.append("s1", [message("b")], 1)[0].seq == 1


def test_a_failed_fsync_is_reported_and_the_bytes_stay(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given
    store.create(header())
    store.append("s1", [message("a")], 0)
    size = store.path("s1").stat().st_size

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(store, "_fsync", failing_fsync)
    # when / then
    with pytest.raises(PersistenceError):
        store.flush("s1")
    assert store.path("s1").stat().st_size == size
    assert len(JsonlStore(store.root).read("s1").events) == 1


def test_a_create_whose_file_fsync_fails_creates_nothing(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(store, "_fsync", failing_fsync)
    with pytest.raises(PersistenceError):
        store.create(header())
    assert not store.exists("s1")
    assert os.listdir(store.root) == []


def test_a_create_whose_directory_fsync_fails_is_reported_but_kept(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def second_fsync_fails(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.EIO, "I/O error")
        os.fsync(fd)

    monkeypatch.setattr(store, "_fsync", second_fsync_fails)
    with pytest.raises(PersistenceError):
        store.create(header())
    assert store.read("s1").header == header()


# -- the incremental cache ----------------------------------------------------------------


def test_load_parses_only_what_another_process_appended(store: JsonlStore) -> None:
    # given: a long session this store has loaded once
    store.create(header())
    store.append("s1", [message(f"m{i}") for i in range(500)] + [at_create("schedule-1")], 0)
    reader = JsonlStore(store.root)
    reader.load("s1")
    parsed = reader.parsed_bytes("s1")
    assert parsed == store.path("s1").stat().st_size
    # when: someone else appends
    size = store.path("s1").stat().st_size
    store.append("s1", [delete("schedule-1"), at_create("schedule-2")], 501)
    session, state = reader.load("s1")
    # then: only the new tail was read, and the fold continued
    assert reader.parsed_bytes("s1") - parsed == store.path("s1").stat().st_size - size
    assert len(session.events) == 503
    assert [r.id for r in state.active] == ["schedule-2"]


def test_a_store_does_not_reread_its_own_appends(store: JsonlStore) -> None:
    store.create(header())
    store.load("s1")
    parsed = store.parsed_bytes("s1")
    store.append("s1", [at_create("schedule-1")], 0)
    session, state = store.load("s1")
    assert store.parsed_bytes("s1") == parsed
    assert [r.id for r in state.active] == ["schedule-1"]
    assert len(session.events) == 1


def test_a_replaced_file_is_read_from_scratch(store: JsonlStore) -> None:
    # given: a cached session
    store.create(header())
    store.append("s1", [at_create("schedule-1")], 0)
    store.load("s1")
    # when: the file is replaced by a longer, different log (a new inode)
    replacement = store.root / "replacement"
    replacement.write_text(
        "\n".join([HEADER_LINE, event_line(0, "x"), event_line(1, "y"), event_line(2, "z")]) + "\n"
    )
    os.replace(replacement, store.path("s1"))
    # then
    session, state = store.load("s1")
    assert [e.data for e in session.events] == ["x", "y", "z"]
    assert state.active == ()


def test_a_file_that_shrank_is_read_from_scratch(store: JsonlStore) -> None:
    store.create(header())
    store.append("s1", [message("a"), message("b")], 0)
    store.read("s1")
    path = store.path("s1")
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(lines[:2]) + b"\n")  # same inode, one event left
    assert len(store.read("s1").events) == 1


# -- several processes --------------------------------------------------------------------


@pytest.mark.slow
def test_processes_appending_at_once_lose_nothing(store: JsonlStore, tmp_path: Path) -> None:
    # given
    store.create(header())
    workers, per_worker = 4, 50
    go = tmp_path / "go"
    argv = [sys.executable, str(WORKER), str(store.root), "s1"]
    procs = [
        subprocess.Popen([*argv, str(tag), str(per_worker), str(go)], stdout=subprocess.PIPE)
        for tag in range(workers)
    ]
    # when: all of them start appending together
    for tag in range(workers):
        ready = Path(f"{go}.ready.{tag}")
        while not ready.exists() and procs[tag].poll() is None:
            time.sleep(0.005)
    go.touch()
    outputs = [p.communicate(timeout=100)[0] for p in procs]
    # then
    assert [p.returncode for p in procs] == [0] * workers, outputs
    session, state = JsonlStore(store.root).load("s1")
    assert [e.seq for e in session.events] == list(range(workers * per_worker))
    for tag in range(workers):
        mine = [e for e in session.events if e.type != SCHEDULE_CHANGE and e.data["worker"] == tag]
        assert [e.data["i"] for e in mine] == [i for i in range(per_worker) if i % 10]
    assert len(state.active) == workers * per_worker // 10
    assert store.path("s1").read_bytes().endswith(b"\n")


def test_a_flush_with_nothing_new_since_the_last_fsync_skips_it(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a flushed session
    store.create(header())
    store.append("s1", [message("a")], 0)
    calls: list[int] = []
    real = store._fsync
    monkeypatch.setattr(store, "_fsync", lambda fd: (calls.append(fd), real(fd)))
    store.flush("s1")
    # when it is flushed again with nothing written, then no fsync runs
    store.flush("s1")
    assert len(calls) == 1
    # when another writer appends, then the next flush syncs again
    JsonlStore(store.root).append("s1", [message("b")], 1)
    store.flush("s1")
    assert len(calls) == 2


def test_a_flush_after_a_failed_fsync_syncs_again(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create(header())
    store.append("s1", [message("a")], 0)
    outcomes = iter([OSError(errno.EIO, "I/O error"), None])
    calls: list[int] = []

    def flaky(fd: int) -> None:
        calls.append(fd)
        failure = next(outcomes)
        if failure is not None:
            raise failure

    monkeypatch.setattr(store, "_fsync", flaky)
    with pytest.raises(PersistenceError):
        store.flush("s1")
    store.flush("s1")
    assert len(calls) == 2


def _fsync_failing_once(store: JsonlStore) -> tuple[list[int], Any]:
    """An fsync that fails once; later ones succeed."""
    calls: list[int] = []
    real = store._fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "I/O error")
        real(fd)

    return calls, fsync


def _drop_unwritten_pages(store: JsonlStore, confirmed: int) -> None:
    """What Linux may do after a failed fsync: the pages it could not write are dropped
    (here: the file falls back to the length last confirmed)."""
    os.truncate(store.path("s1"), confirmed)


def test_a_flush_after_a_failed_fsync_writes_the_unconfirmed_bytes_again(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later fsync's success does not confirm bytes an earlier failed one dropped."""
    # given a flushed session, then an append whose fsync fails and loses its bytes
    store.create(header())
    store.append("s1", [message("a")], 0)
    store.flush("s1")
    confirmed = store.path("s1").stat().st_size
    store.append("s1", [message("b"), message("c")], 1)
    written = store.path("s1").read_bytes()
    calls, fsync = _fsync_failing_once(store)
    monkeypatch.setattr(store, "_fsync", fsync)
    with pytest.raises(PersistenceError):
        store.flush("s1")
    _drop_unwritten_pages(store, confirmed)
    # when a later flush succeeds
    store.flush("s1")
    # then what it confirmed is on disk: the bytes were written again before the fsync
    assert len(calls) == 2
    assert store.path("s1").read_bytes() == written
    assert [e.data for e in JsonlStore(store.root).read("s1").events] == [
        {"content": t} for t in "abc"]


def test_a_flush_after_a_failed_fsync_keeps_another_writers_later_lines(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an fsync that failed (its bytes kept), then another writer's append
    store.create(header())
    store.append("s1", [message("a")], 0)
    store.flush("s1")
    outcomes = iter([OSError(errno.EIO, "I/O error"), None])
    real = store._fsync

    def flaky(fd: int) -> None:
        failure = next(outcomes)
        if failure is not None:
            raise failure
        real(fd)

    monkeypatch.setattr(store, "_fsync", flaky)
    store.append("s1", [message("b")], 1)
    with pytest.raises(PersistenceError):
        store.flush("s1")
    JsonlStore(store.root).append("s1", [message("c")], 2)
    # when flushed again, then it succeeds and every line stays as written
    store.flush("s1")
    assert [e.data for e in JsonlStore(store.root).read("s1").events] == [
        {"content": t} for t in "abc"]


def test_a_flush_refuses_to_confirm_a_file_that_no_longer_holds_its_unconfirmed_bytes(
    store: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an fsync that failed and lost its bytes, then another writer appending
    # something else where they were
    store.create(header())
    store.flush("s1")
    confirmed = store.path("s1").stat().st_size
    store.append("s1", [message("a")], 0)
    _calls, fsync = _fsync_failing_once(store)
    monkeypatch.setattr(store, "_fsync", fsync)
    with pytest.raises(PersistenceError):
        store.flush("s1")
    _drop_unwritten_pages(store, confirmed)
    JsonlStore(store.root).append("s1", [message("other")], 0)
    # when flushed again, then nothing is confirmed
    with pytest.raises(PersistenceError, match="no longer holds"):
        store.flush("s1")
