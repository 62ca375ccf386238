"""A number beyond the range of a double in a log line (docs/decisions.md, "Two
differences from the reference implementation"): the line is malformed, so the whole log
is unreadable, where the reference reads the number as infinity. Pinned here so that a
change to it is a decision, not an accident."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsh_schedule.cli import main
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import Event, SessionHeader
from dsh_schedule.shared.store.codec import decode_event_line, encode_event
from dsh_schedule.shared.store.jsonl import JsonlStore


def line(number: str) -> bytes:
    return b'{"type":"tool/result","seq":0,"time":0,"data":{"value":%s}}' % number.encode()


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1E+400", "1.8e308"])
def test_a_number_beyond_double_range_makes_its_line_malformed(number: str) -> None:
    with pytest.raises(ScheduleLogError, match="log line 2 malformed"):
        decode_event_line(line(number), 0)


@pytest.mark.parametrize(("number", "read"), [
    ("1.7976931348623157e308", 1.7976931348623157e308),  # the largest double
    ("1e-400", 0.0),  # too small for a double: zero, not an error
    ("123456789012345678901234567890", 123456789012345678901234567890),  # an exact integer
])
def test_numbers_within_range_or_below_it_are_read(number: str, read: float) -> None:
    assert decode_event_line(line(number), 0).data["value"] == read


def test_what_the_store_writes_never_holds_such_a_number() -> None:
    """An infinity or a NaN a host records is written as null."""
    event = Event(type="tool/result", seq=0, time=0,
                  data={"value": float("inf"), "low": float("-inf"), "nan": float("nan")})
    assert json.loads(encode_event(event))["data"] == {"value": None, "low": None, "nan": None}


def test_the_whole_log_is_unreadable_and_check_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = JsonlStore(tmp_path)
    store.create(SessionHeader(id="s", createdAt=0))
    with store.path("s").open("ab") as log:
        log.write(line("1e400") + b"\n")
    with pytest.raises(ScheduleLogError, match="log line 2 malformed"):
        store.read("s")
    assert main(["check", str(store.path("s"))]) == 1
    assert "log line 2 malformed" in capsys.readouterr().out
