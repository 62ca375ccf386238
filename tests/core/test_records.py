"""Strict ``schedule/change`` v1 records: every shape rule
(docs/architecture.md#schedule-records)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.instant import MAX_SAFE_INTEGER
from dsh_schedule.shared.core.records import (
    MAX_EVERY_SECONDS,
    AfterSchedule,
    CreateChange,
    DispatchChange,
    EverySchedule,
    decode_change,
    encode_change,
    js_trim,
)

# The six documented examples, exactly as docs/architecture.md#schedule-records writes them.
EXAMPLES: dict[str, str] = {
    "after": '{"version":1,"operation":"create","schedule":{"id":"schedule-1","kind":"after",'
    '"prompt":"stretch","afterSeconds":600,"scheduledAt":"2026-12-01T09:10:00.000Z"}}',
    "at": '{"version":1,"operation":"create","schedule":{"id":"schedule-2","kind":"at",'
    '"prompt":"call Ana","scheduledAt":"2026-12-01T16:00:00.000Z"}}',
    "every": '{"version":1,"operation":"create","schedule":{"id":"schedule-3","kind":"every",'
    '"prompt":"check CI","everySeconds":3600,"scheduledAt":"2026-12-01T10:00:00.000Z"}}',
    "delete": '{"version":1,"operation":"delete","id":"schedule-1"}',
    "dispatch": '{"version":1,"operation":"dispatch","id":"schedule-2"}',
    "dispatch-every": '{"version":1,"operation":"dispatch","id":"schedule-3",'
    '"acceptedAt":"2026-12-01T10:00:00.413Z"}',
}
CREATES = ("after", "at", "every")
Mutation = Callable[[dict[str, Any]], Any]


def base(name: str) -> dict[str, Any]:
    return copy.deepcopy(json.loads(EXAMPLES[name]))


def put(*path: str, value: Any) -> Mutation:
    """Set the key at ``path`` (creating it when absent)."""

    def mutate(data: dict[str, Any]) -> Any:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return data

    return mutate


def drop(*path: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> Any:
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return data

    return mutate


def whole(value: Any) -> Mutation:
    return lambda _data: value


def context_for(name: str) -> list[dict[str, Any]]:
    """The records that make example ``name`` valid in a log: creates need none, the rest
    need the three documented creates before them."""
    return [] if name in CREATES else [base(n) for n in CREATES]


def log_of(datas: list[Any]) -> list[Event]:
    return [Event(type=SCHEDULE_CHANGE, seq=i, time=0, data=d) for i, d in enumerate(datas)]


def row(name: str, mutation: Mutation, rule: str) -> Any:
    return pytest.param(name, mutation, id=f"{name}: {rule}")


INSTANTS_NOT_CANONICAL = [
    ("no millis", "2026-12-01T10:00:00Z"),
    ("one fraction digit", "2026-12-01T10:00:00.4Z"),
    ("four fraction digits", "2026-12-01T10:00:00.4130Z"),
    ("lowercase z", "2026-12-01T10:00:00.000z"),
    ("lowercase t", "2026-12-01t10:00:00.000Z"),
    ("offset +00:00", "2026-12-01T10:00:00.000+00:00"),
    ("space for T", "2026-12-01 10:00:00.000Z"),
    ("year 0000", "0000-12-01T10:00:00.000Z"),
    ("five-digit year", "12026-12-01T10:00:00.000Z"),
    ("impossible date 2027-02-30", "2027-02-30T10:00:00.000Z"),
    ("hour 24", "2026-12-01T24:00:00.000Z"),
    ("second 60", "2026-12-01T10:00:60.000Z"),
    ("non-ASCII digit", "2026-12-01T10:00:0\u0661.000Z"),
    ("empty", ""),
]

PROMPTS_REJECTED = [
    ("empty", ""),
    ("only spaces", "   "),
    ("leading space", " stretch"),
    ("trailing space", "stretch "),
    ("trailing newline", "stretch\n"),
    ("leading U+FEFF (JS-only whitespace)", "\ufeffstretch"),
    ("trailing U+00A0", "stretch\u00a0"),
    ("leading U+3000", "\u3000stretch"),
    ("trailing U+2028", "stretch\u2028"),
    ("lone surrogate", "stretch \ud800"),
]

IDS_REJECTED = [
    ("empty", ""),
    ("leading space", " schedule-1"),
    ("trailing space", "schedule-1 "),
    ("U+00A0 padded", "\u00a0schedule-1"),
    ("U+FEFF padded", "schedule-1\ufeff"),
    ("lone surrogate", "schedule-\udc01"),
]

SHAPE_REJECTIONS = [
    # unknown version
    row("after", put("version", value=2), "unknown version 2"),
    row("delete", put("version", value=0), "unknown version 0"),
    row("dispatch", put("version", value="1"), "version as a string"),
    row("dispatch-every", put("version", value=True), "version as a bool"),
    row("after", put("version", value=1.0), "version as a float"),
    # unknown operation or kind
    row("delete", put("operation", value="update"), "unknown operation"),
    row("delete", put("operation", value="Delete"), "operation with another case"),
    row("dispatch", put("operation", value=None), "null operation"),
    row("after", put("schedule", "kind", value="cron"), "unknown kind cron"),
    row("at", put("schedule", "kind", value="AT"), "kind with another case"),
    row("every", put("schedule", "kind", value=1), "kind not a string"),
    # missing keys at any level
    row("after", drop("version"), "missing version"),
    row("delete", drop("operation"), "missing operation"),
    row("after", drop("schedule"), "missing schedule"),
    row("after", drop("schedule", "id"), "missing schedule id"),
    row("at", drop("schedule", "kind"), "missing kind"),
    row("every", drop("schedule", "prompt"), "missing prompt"),
    row("after", drop("schedule", "afterSeconds"), "missing afterSeconds"),
    row("every", drop("schedule", "everySeconds"), "missing everySeconds"),
    row("at", drop("schedule", "scheduledAt"), "missing scheduledAt"),
    row("delete", drop("id"), "missing delete id"),
    row("dispatch", drop("id"), "missing dispatch id"),
    # extra keys at any level
    row("after", put("note", value="x"), "extra top-level key on create"),
    row("delete", put("acceptedAt", value="2026-12-01T10:00:00.413Z"), "delete with acceptedAt"),
    row("dispatch-every", put("batch", value=1), "extra top-level key on dispatch"),
    row("every", put("schedule", "anchor", value="2026-12-01T10:00:00.000Z"), "stored anchor"),
    row("at", put("schedule", "timeZone", value="UTC"), "at storing its zone"),
    row("at", put("schedule", "afterSeconds", value=600), "at with afterSeconds"),
    row("after", put("schedule", "everySeconds", value=600), "after with everySeconds"),
    row("every", put("schedule", "afterSeconds", value=600), "every with afterSeconds"),
    # wrong types
    row("after", put("schedule", "afterSeconds", value=True), "bool for afterSeconds"),
    row("after", put("schedule", "afterSeconds", value=600.0), "float for afterSeconds"),
    row("after", put("schedule", "afterSeconds", value="600"), "string for afterSeconds"),
    row("every", put("schedule", "everySeconds", value=True), "bool for everySeconds"),
    row("every", put("schedule", "everySeconds", value=3600.0), "float for everySeconds"),
    row("every", put("schedule", "everySeconds", value="3600"), "string for everySeconds"),
    row("at", put("schedule", "prompt", value=7), "prompt not a string"),
    row("at", put("schedule", "id", value=2), "schedule id not a string"),
    row("at", put("schedule", "scheduledAt", value=1796140800000), "scheduledAt as epoch ms"),
    row("delete", put("id", value=["schedule-1"]), "delete id not a string"),
    row("dispatch-every", put("acceptedAt", value=None), "null acceptedAt"),
    row("dispatch-every", put("acceptedAt", value=1796133600413), "acceptedAt as epoch ms"),
    row("after", put("schedule", value=[]), "schedule not an object"),
    row("after", whole([]), "data not an object"),
    row("after", whole(None), "data null"),
    row("after", whole(EXAMPLES["after"]), "data a JSON string"),
    # non-canonical instants
    *(
        row("at", put("schedule", "scheduledAt", value=v), f"scheduledAt {r}")
        for r, v in INSTANTS_NOT_CANONICAL
    ),
    *(
        row("dispatch-every", put("acceptedAt", value=v), f"acceptedAt {r}")
        for r, v in INSTANTS_NOT_CANONICAL
    ),
    # untrimmed, empty or unstorable prompt
    *(row("after", put("schedule", "prompt", value=v), f"prompt {r}") for r, v in PROMPTS_REJECTED),
    # out-of-range numbers
    row("after", put("schedule", "afterSeconds", value=0), "afterSeconds 0"),
    row("after", put("schedule", "afterSeconds", value=-600), "afterSeconds negative"),
    row("after", put("schedule", "afterSeconds", value=2**53), "afterSeconds 2**53"),
    row("every", put("schedule", "everySeconds", value=299), "everySeconds 299"),
    row("every", put("schedule", "everySeconds", value=0), "everySeconds 0"),
    row(
        "every",
        put("schedule", "everySeconds", value=MAX_EVERY_SECONDS + 1),
        "everySeconds whose milliseconds are unsafe",
    ),
    row("every", put("schedule", "everySeconds", value=2**53), "everySeconds 2**53"),
    # empty or padded id
    *(row("every", put("schedule", "id", value=v), f"create id {r}") for r, v in IDS_REJECTED),
    *(row("delete", put("id", value=v), f"delete id {r}") for r, v in IDS_REJECTED),
    *(row("dispatch", put("id", value=v), f"dispatch id {r}") for r, v in IDS_REJECTED),
]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_documented_example_is_valid_in_its_context(name: str) -> None:
    """The rejection rows below mutate these, so each unmutated base must be valid."""
    # given the documented record after the records it needs
    events = log_of([*context_for(name), base(name)])

    # when it is decoded and folded
    decode_change(base(name))
    state = fold(events)

    # then nothing is rejected and the creates are kept
    expected = {"after": {"schedule-1"}, "at": {"schedule-2"}, "every": {"schedule-3"}}
    assert state.created == expected.get(name, {"schedule-1", "schedule-2", "schedule-3"})


@pytest.mark.parametrize(("name", "mutation"), SHAPE_REJECTIONS)
def test_a_shape_error_is_rejected_and_corrupts_the_whole_log(
    name: str, mutation: Mutation
) -> None:
    # given a documented record broken by one rule
    data = mutation(base(name))
    events = log_of([*context_for(name), data])

    # when it is decoded, and when a log holding it is folded, then both reject it
    with pytest.raises(ScheduleLogError):
        decode_change(data)
    with pytest.raises(ScheduleLogError) as caught:
        fold(events)
    assert caught.value.seq == len(events) - 1


@pytest.mark.parametrize(
    ("name", "mutation"),
    [
        row("after", put("schedule", "prompt", value="\u001cstretch"), "U+001C is no JS space"),
        row("after", put("schedule", "prompt", value="stretch\u001f"), "U+001F is no JS space"),
        row("after", put("schedule", "prompt", value="\u0085stretch"), "U+0085 is no JS space"),
        row("after", put("schedule", "prompt", value="stretch\u200b"), "U+200B is no JS space"),
        row("at", put("schedule", "prompt", value="two  inner\u00a0 spaces"), "inner spaces"),
        row("at", put("schedule", "prompt", value="\U0001f600"), "astral character"),
        row("after", put("schedule", "afterSeconds", value=1), "afterSeconds 1"),
        row("after", put("schedule", "afterSeconds", value=MAX_SAFE_INTEGER), "afterSeconds max"),
        row("every", put("schedule", "everySeconds", value=300), "everySeconds 300"),
        row(
            "every",
            put("schedule", "everySeconds", value=MAX_EVERY_SECONDS),
            "largest everySeconds with safe milliseconds",
        ),
        row("at", put("schedule", "scheduledAt", value="0001-01-01T00:00:00.000Z"), "year 1"),
        row("at", put("schedule", "scheduledAt", value="9999-12-31T23:59:59.999Z"), "last ms"),
        row("at", put("schedule", "scheduledAt", value="2028-02-29T00:00:00.000Z"), "leap day"),
        row("every", put("schedule", "id", value="check\u00a0ci"), "id with inner space"),
    ],
)
def test_a_valid_variant_is_accepted(name: str, mutation: Mutation) -> None:
    # given a documented record changed in a way the rules allow
    data = mutation(base(name))

    # when it is decoded and folded, then it is kept as written
    change = decode_change(data)
    fold(log_of([*context_for(name), data]))
    assert encode_change(change) == data


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_encoding_writes_the_documented_key_order(name: str) -> None:
    # given the decoded documented record
    change = decode_change(base(name))

    # when it is encoded as compact JSON
    text = json.dumps(encode_change(change), separators=(",", ":"), ensure_ascii=False)

    # then it is the documented line, byte for byte
    assert text == EXAMPLES[name]


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_keys_are_accepted_in_any_order(name: str) -> None:
    # given the documented record with every object's keys reversed
    def reverse(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reverse(value[k]) for k in reversed(list(value))}
        return value

    reversed_data = reverse(base(name))

    # when it is decoded, then it equals the documented record
    assert decode_change(reversed_data) == decode_change(base(name))


def test_decoding_gives_the_typed_records() -> None:
    assert decode_change(base("after")) == CreateChange(
        schedule=AfterSchedule(
            id="schedule-1",
            prompt="stretch",
            afterSeconds=600,
            scheduledAt="2026-12-01T09:10:00.000Z",
        )
    )
    every = decode_change(base("every"))
    assert isinstance(every, CreateChange) and isinstance(every.schedule, EverySchedule)
    assert decode_change(base("dispatch")) == DispatchChange(id="schedule-2")
    assert decode_change(base("dispatch-every")) == DispatchChange(
        id="schedule-3", acceptedAt="2026-12-01T10:00:00.413Z"
    )


@pytest.mark.parametrize(
    ("text", "trimmed"),
    [
        pytest.param(" \t\n\u000b\u000c\rx\r\n", "x", id="ASCII whitespace"),
        pytest.param("\u00a0\u1680x\u2000\u200a", "x", id="no-break and en spaces"),
        pytest.param("\u2028\u2029\u202f\u205f\u3000x", "x", id="separators and ideographic"),
        pytest.param("\ufeffx\ufeff", "x", id="U+FEFF is trimmed (JS, not Python)"),
        pytest.param("\u001cx\u001f", "\u001cx\u001f", id="U+001C-U+001F kept (Python strips)"),
        pytest.param("\u0085x", "\u0085x", id="U+0085 kept (Python strips)"),
        pytest.param("\u200bx", "\u200bx", id="zero-width space kept"),
    ],
)
def test_js_trim_is_exactly_the_javascript_set(text: str, trimmed: str) -> None:
    assert js_trim(text) == trimmed
