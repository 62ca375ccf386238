"""What an append accepts, a read accepts (docs/architecture.md#session-logs): one bound
on how deep a log line nests and on how long it is, refused at append with nothing
written, and a line beyond it in a file another program wrote read as corruption, from
any stack, by the stores, the tools, a wake and the ``check`` and ``fold`` commands."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from dsh_schedule.cli import main
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.errors import EventOutOfBounds, ScheduleLogError
from dsh_schedule.shared.core.events import Event, NewEvent
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.codec import (
    MAX_LINE_BYTES,
    MAX_LINE_DEPTH,
    NESTING_OMITTED,
    clip_nesting,
    decode_event_line,
    encode_event,
    line_fault,
)
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.due import DueOwner
from dsh_schedule.worker.outcome import WakeOutcome
from tests.support import FakeClock, new_session, value

T = TypeVar("T")
# Deeper than any JSON decoder can go on the default recursion limit.
HOSTILE_DEPTH = 5000


def nested(levels: int, inner: Any = 1) -> Any:
    """``inner`` inside ``levels`` arrays."""
    for _ in range(levels):
        inner = [inner]
    return inner


def depth_of(value: Any) -> int:
    """How many arrays and objects nest in ``value`` (0 for a scalar)."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def event(data: Any, kind: str = "tool/call") -> NewEvent:
    return NewEvent(type=kind, time=0, data=data)


def on_a_deep_stack(frames: int, call: Callable[[], T]) -> T:
    """``call()`` from a stack ``frames`` frames deeper than this one."""
    if frames == 0:
        return call()
    return on_a_deep_stack(frames - 1, call)


def write_raw(path: Path, *lines: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(b"".join(line + b"\n" for line in lines))


def raw_event(seq: int, data_json: bytes, kind: bytes = b"tool/call") -> bytes:
    return b'{"type":"' + kind + b'","seq":%d,"time":0,"data":' % seq + data_json + b"}"


@pytest.fixture(params=["memory", "jsonl", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    if request.param == "postgres":
        yield request.getfixturevalue("postgres_store")
        return
    yield MemoryStore() if request.param == "memory" else JsonlStore(tmp_path / "sessions")


# -- the bound itself --------------------------------------------------------------------


@pytest.mark.parametrize(("line", "fault"), [
    # the line's own object is one level: its data may nest one less
    (raw_event(0, json.dumps(nested(MAX_LINE_DEPTH - 1)).encode()), None),
    (raw_event(0, json.dumps(nested(MAX_LINE_DEPTH)).encode()), "nests deeper than 128"),
    # objects count as arrays do
    (raw_event(0, b'{"a":' * (MAX_LINE_DEPTH - 1) + b"1" + b"}" * (MAX_LINE_DEPTH - 1)), None),
    (raw_event(0, b'{"a":' * MAX_LINE_DEPTH + b"1" + b"}" * MAX_LINE_DEPTH),
     "nests deeper than 128"),
    # brackets inside strings are text, with escapes in the line or without
    (raw_event(0, json.dumps(["[" * 300, "{" * 300]).encode()), None),
    (raw_event(0, json.dumps(["[" * 300, '\\"[[[' * 100, "{" * 300]).encode()), None),
    (raw_event(0, json.dumps(nested(MAX_LINE_DEPTH - 1, '"\\[' * 100)).encode()), None),
    (raw_event(0, json.dumps(nested(MAX_LINE_DEPTH, '"\\[' * 100)).encode()),
     "nests deeper than 128"),
    (raw_event(0, json.dumps(nested(MAX_LINE_DEPTH, "\ud800")).encode()),
     "nests deeper than 128"),
    # many shallow arrays are not deep
    (raw_event(0, json.dumps([[i] for i in range(1000)]).encode()), None),
    # a line that is no JSON is as deep as a decoder would go into it
    (b"[" * HOSTILE_DEPTH, "nests deeper than 128"),
    (b"[" * HOSTILE_DEPTH + b"\\", "nests deeper than 128"),
    (raw_event(0, b"[" * HOSTILE_DEPTH + b"}" * HOSTILE_DEPTH), "nests deeper than 128"),
])
def test_a_line_is_measured_outside_its_strings(line: bytes, fault: str | None) -> None:
    found = line_fault(line)
    assert found == fault if fault is None else fault in str(found)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ ,:ab\u00e9'),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet='[]{}"\\ab', max_size=3), inner, max_size=4),
    max_leaves=30,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(value=_JSON, wrap=st.integers(MAX_LINE_DEPTH - 8, MAX_LINE_DEPTH + 2))
def test_the_measured_depth_is_the_values_whatever_its_strings_hold(
        value: Any, wrap: int) -> None:
    data = nested(wrap, value)
    line = encode_event(Event(type="x", seq=0, time=0, data=data))[:-1] \
        if 1 + depth_of(data) <= MAX_LINE_DEPTH else None
    raw = raw_event(0, json.dumps(data, ensure_ascii=False).encode())
    deep = 1 + depth_of(data) > MAX_LINE_DEPTH
    assert (line_fault(raw) is not None) == deep
    if line is not None:
        assert line_fault(line) is None
        assert decode_event_line(line, 0).data == data


def test_a_line_is_bounded_in_bytes_too() -> None:
    # given an event whose line is exactly MAX_LINE_BYTES long, and one a byte longer
    overhead = len(encode_event(Event(type="x", seq=0, time=0, data=""))) - 1
    at_bound = Event(type="x", seq=0, time=0, data="a" * (MAX_LINE_BYTES - overhead))
    beyond = Event(type="x", seq=0, time=0, data="a" * (MAX_LINE_BYTES - overhead + 1))

    line = encode_event(at_bound)
    assert len(line) == MAX_LINE_BYTES + 1  # and its newline
    assert decode_event_line(line[:-1], 0) == at_bound
    with pytest.raises(EventOutOfBounds, match=f"longer than {MAX_LINE_BYTES} bytes"):
        encode_event(beyond)
    with pytest.raises(ScheduleLogError, match="log line 2 malformed: is longer than"):
        decode_event_line(line[:-1] + b" ", 0)


# -- append refuses, and changes nothing -------------------------------------------------


@pytest.mark.parametrize("data", [
    {"a": 1},
    nested(MAX_LINE_DEPTH - 1),  # the line nests exactly MAX_LINE_DEPTH deep
    {"args": nested(MAX_LINE_DEPTH - 3, {"prompt": "x"})},
], ids=["shallow", "arrays", "objects"])
def test_an_event_at_the_bound_is_appended_and_read_back_as_it_was(
        store: SessionStore, data: Any) -> None:
    session = new_session(store)
    assert 1 + depth_of(data) <= MAX_LINE_DEPTH

    appended = store.append(session, [event(data)], expected_seq=0)

    assert [e.data for e in appended] == [data]
    assert [e.data for e in store.read(session).events] == [data]
    if isinstance(store, JsonlStore):
        assert [e.data for e in JsonlStore(store.root).read(session).events] == [data]


# The line of nested(MAX_LINE_DEPTH) nests one level beyond the bound.
@pytest.mark.parametrize("levels", [MAX_LINE_DEPTH, HOSTILE_DEPTH])
def test_an_event_beyond_the_bound_is_refused_and_nothing_is_written(
        store: SessionStore, levels: int) -> None:
    # given a session holding one event
    session = new_session(store)
    store.append(session, [event({"a": 1})], expected_seq=0)
    path = store.path(session) if isinstance(store, JsonlStore) else None
    before = path.read_bytes() if path is not None else b""

    # when a batch with an event whose data nests one level too deep is appended
    with pytest.raises(EventOutOfBounds) as refused:
        store.append(session, [event({"b": 2}), event(nested(levels))], expected_seq=1)

    # then it is refused with a stable message, and the log is as it was
    assert str(refused.value) == (
        "an event of type 'tool/call' cannot be stored in a session log: its line nests "
        "deeper than 128 arrays and objects (docs/architecture.md#session-logs)")
    assert isinstance(refused.value, ValueError)
    assert [e.data for e in store.read(session).events] == [{"a": 1}]
    if path is not None:
        assert path.read_bytes() == before
    assert len(store.append(session, [event({"c": 3})], expected_seq=1)) == 1


def test_an_event_too_long_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    session = new_session(store)
    before = store.path(session).read_bytes()

    with pytest.raises(EventOutOfBounds, match="longer than"):
        store.append(session, [event("a" * MAX_LINE_BYTES)], expected_seq=0)

    assert store.path(session).read_bytes() == before
    assert len(store.read(session).events) == 0


def test_a_log_that_never_met_the_bound_is_written_as_before(tmp_path: Path) -> None:
    # the bound changes what is refused, never how an accepted event is written
    store = JsonlStore(tmp_path)
    session = new_session(store)
    data = {"content": [{"type": "text", "text": "[{\"x\""}], "deep": nested(40)}
    store.append(session, [event(data, "user/message")], expected_seq=0)

    line = store.path(session).read_bytes().splitlines()[1]
    assert line == (b'{"type":"user/message","seq":0,"time":0,"data":'
                    + json.dumps(data, separators=(",", ":")).encode() + b"}")


# -- a line another program wrote is corruption, from any stack --------------------------


def deep_file(root: Path, session: str = "s1", depth: int = 990) -> JsonlStore:
    """A session whose second event nests ``depth`` arrays deep, written by another
    program."""
    store = JsonlStore(root)
    new_session(store, session)
    write_raw(store.path(session), raw_event(0, b"{}", b"user/message"),
              raw_event(1, b"[" * depth + b"]" * depth))
    return store


@pytest.mark.parametrize("depth", [MAX_LINE_DEPTH, 990, HOSTILE_DEPTH])
def test_a_line_beyond_the_bound_reads_as_corruption_from_a_deep_stack(
        tmp_path: Path, depth: int) -> None:
    deep_file(tmp_path, depth=depth)

    for read in (lambda: JsonlStore(tmp_path).read("s1"),
                 lambda: JsonlStore(tmp_path).load("s1")):
        with pytest.raises(ScheduleLogError, match="log line 3 malformed: nests deeper"):
            on_a_deep_stack(800, read)


def test_tools_answer_a_log_with_such_a_line_as_a_corrupt_log(
        tmp_path: Path, coordination: Coordination, settings: Settings) -> None:
    deep_file(tmp_path)
    tools = ScheduleTools(JsonlStore(tmp_path), coordination, settings, FakeClock())

    for tool, args in [("schedule_create", {"prompt": "x", "after_seconds": 60}),
                       ("schedule_list", {}), ("schedule_delete", {"id": "schedule-1"})]:
        result = on_a_deep_stack(700, functools.partial(tools.call, "s1", tool, args))
        assert value(result.content)["code"] == "corrupt_schedule_log"


def test_a_wake_of_a_session_with_such_a_line_ends_as_a_corrupt_log(
        tmp_path: Path, coordination: Coordination, settings: Settings) -> None:
    clock = FakeClock()
    deep_file(tmp_path)
    coordination.leases.grant("s1", settings.queue, now_ms=clock(), ttl_s=60)
    owner = DueOwner(JsonlStore(tmp_path), coordination, settings, clock=clock)

    woken = on_a_deep_stack(700, lambda: owner.wake([("s1", None)]))
    assert woken["s1"] is WakeOutcome.CORRUPT_LOG


def test_check_reports_such_a_file_in_one_line_and_checks_the_next(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = deep_file(tmp_path / "a", depth=HOSTILE_DEPTH).path("s1")
    good = JsonlStore(tmp_path / "b")
    new_session(good, "s2")

    status = main(["check", str(deep), str(good.path("s2"))])

    out, err = capsys.readouterr()
    assert status == 1
    assert out.splitlines() == [
        f"{deep}: log line 3 malformed: nests deeper than 128 arrays and objects",
        f"{good.path('s2')}: ok",
    ]
    assert err == ""


def test_fold_reports_such_a_file_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = deep_file(tmp_path, depth=HOSTILE_DEPTH).path("s1")

    status = main(["fold", str(deep)])

    out, err = capsys.readouterr()
    assert status == 1
    assert out == ""
    assert err == "dsh-schedule: log line 3 malformed: nests deeper than 128 arrays and objects\n"


# -- what a host records as a model gave it ----------------------------------------------


def test_clipping_keeps_data_within_the_bound_and_replaces_only_what_is_deeper() -> None:
    shallow = {"name": "schedule_list", "args": {"a": [1, {"b": None}]}}
    assert clip_nesting(shallow) is shallow

    deep = {"name": "schedule_create", "args": {"prompt": nested(HOSTILE_DEPTH), "at": "x"}}
    clipped = clip_nesting(deep)

    assert 1 + depth_of(clipped) == MAX_LINE_DEPTH  # the line nests exactly to the bound
    assert clipped["args"]["at"] == "x"
    innermost = clipped["args"]["prompt"]
    while isinstance(innermost, list):
        innermost = innermost[0]
    assert innermost == NESTING_OMITTED
    assert line_fault(encode_event(Event(type="tool/call", seq=0, time=0, data=clipped))) is None
