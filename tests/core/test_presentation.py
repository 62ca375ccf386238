"""Receipts: ``reminder_presentation`` and the delivered batches (docs/architecture.md#receipts)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, TURN_START, USER_MESSAGE, Event
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.ledger import Ledger
from dsh_schedule.shared.core.presentation import (
    Presentation,
    receipt_value,
    reminder_presentation,
)

DAY = "2026-12-01T"


def t(clock: str) -> str:
    return f"{DAY}{clock}Z"


def at(sid: str, clock: str, prompt: str) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "at", "prompt": prompt, "scheduledAt": t(clock)}
    return {"version": 1, "operation": "create", "schedule": schedule}


def after(sid: str, clock: str, prompt: str) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "after", "prompt": prompt, "afterSeconds": 600,
                "scheduledAt": t(clock)}
    return {"version": 1, "operation": "create", "schedule": schedule}


def every(sid: str, clock: str, prompt: str, seconds: int = 300) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "every", "prompt": prompt, "everySeconds": seconds,
                "scheduledAt": t(clock)}
    return {"version": 1, "operation": "create", "schedule": schedule}


def delete(sid: str) -> dict[str, Any]:
    return {"version": 1, "operation": "delete", "id": sid}


def dispatch(sid: str, clock: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1, "operation": "dispatch", "id": sid}
    if clock is not None:
        data["acceptedAt"] = t(clock)
    return data


def note() -> tuple[str, Any]:
    return (USER_MESSAGE, {"content": [{"type": "text", "text": "hi"}]})


def log(*items: dict[str, Any] | tuple[str, Any]) -> list[Event]:
    events = []
    for seq, item in enumerate(items):
        kind, data = item if isinstance(item, tuple) else (SCHEDULE_CHANGE, item)
        events.append(Event(type=kind, seq=seq, time=seq, data=data))
    return events


def receipt(sid: str, prompt: str, clock: str) -> Presentation:
    return Presentation(scheduleId=sid, prompt=prompt, occurrenceAt=t(clock))


def test_a_one_shot_receipt_shows_its_target() -> None:
    # given a delivered at reminder and a delivered after reminder
    events = log(at("schedule-1", "16:00:00.000", "call Ana"), note(),
                 after("schedule-2", "09:10:00.000", "stretch"), dispatch("schedule-2"),
                 dispatch("schedule-1"))

    # when their dispatches are presented, then each pairs with its create
    assert reminder_presentation(events, 3, 0) == receipt("schedule-2", "stretch", "09:10:00.000")
    assert reminder_presentation(events, 4, 0) == receipt("schedule-1", "call Ana", "16:00:00.000")


def test_every_receipts_name_the_occurrence_each_dispatch_delivered() -> None:
    # given a 300 s record first due 12:05 and three batches: late, exact and on time
    events = log(
        every("schedule-1", "12:05:00.000", "check CI"),
        dispatch("schedule-1", "12:17:30.000"),
        note(),
        dispatch("schedule-1", "12:22:30.000"),
        every("schedule-2", "12:20:00.000", "other"),
        dispatch("schedule-1", "12:30:00.000"),
        dispatch("schedule-2", "12:30:00.000"),
    )
    fold(events)

    # when each dispatch is presented
    receipts = [reminder_presentation(events, seq, 0) for seq in (1, 3, 5, 6)]

    # then the occurrences are the latest anchor-aligned ones not after each acceptedAt
    assert receipts == [
        receipt("schedule-1", "check CI", "12:15:00.000"),
        receipt("schedule-1", "check CI", "12:20:00.000"),
        receipt("schedule-1", "check CI", "12:30:00.000"),
        receipt("schedule-2", "other", "12:30:00.000"),
    ]


@pytest.mark.parametrize(
    ("item", "why"),
    [
        pytest.param(note(), "a non-Schedule event"),
        pytest.param((TURN_START, {"turn": 1}), "a turn event"),
        pytest.param(at("schedule-2", "16:00:00.000", "p"), "a create"),
        pytest.param(delete("schedule-1"), "a delete"),
    ],
)
def test_an_event_that_is_no_dispatch_has_no_receipt(item: Any, why: str) -> None:
    events = log(at("schedule-1", "16:00:00.000", "p"), item)
    assert reminder_presentation(events, 1, 0) is None, why


ONE = at("schedule-1", "16:00:00.000", "p")
PAIR = log(ONE, dispatch("schedule-1"))
REJECTIONS = [
    pytest.param(PAIR, -1, 0, "no event with seq", id="dispatch seq negative"),
    pytest.param(PAIR, 2, 0, "no event with seq", id="dispatch seq past the end"),
    pytest.param([Event(type=SCHEDULE_CHANGE, seq=0, time=0, data=ONE),
                  Event(type=SCHEDULE_CHANGE, seq=5, time=0, data=dispatch("schedule-1"))],
                 1, 0, "has seq 5", id="seq is not the event's"),
    pytest.param(PAIR, 1, -1, "seedLength", id="seed length negative"),
    pytest.param(PAIR, 1, 3, "seedLength", id="seed length past the end"),
    pytest.param(log(note(), dispatch("schedule-1")), 1, 0, "no preceding create",
                 id="no create at all"),
    pytest.param(log(at("schedule-2", "16:00:00.000", "p"), dispatch("schedule-1")), 1, 0,
                 "no preceding create", id="only another id's create"),
    pytest.param(PAIR, 1, 1,
                 "no preceding create", id="own dispatch whose create is only inherited"),
    pytest.param(log(ONE, {"version": 1, "operation": "dispatch", "id": " schedule-1"}), 1, 0,
                 "empty, padded", id="malformed dispatch"),
    pytest.param(log(ONE, {"version": 2}, dispatch("schedule-1")), 2, 0,
                 "version", id="malformed record between create and dispatch"),
    pytest.param(log({"version": 1, "operation": "create"}, dispatch("schedule-1")), 1, 0,
                 "malformed create", id="malformed create"),
    pytest.param(log(ONE, delete("schedule-1"), dispatch("schedule-1")), 2, 0,
                 "inactive", id="dispatch after a delete"),
    pytest.param(log(ONE, dispatch("schedule-1"), dispatch("schedule-1")), 2, 0,
                 "inactive", id="one-shot dispatched twice"),
    pytest.param(log(ONE, dispatch("schedule-1", "16:00:00.000")), 1, 0,
                 "carries acceptedAt", id="one-shot dispatch with acceptedAt"),
    pytest.param(log(every("schedule-1", "12:05:00.000", "p"), dispatch("schedule-1")), 1, 0,
                 "lacks acceptedAt", id="every dispatch without acceptedAt"),
    pytest.param(log(every("schedule-1", "12:05:00.000", "p"),
                     dispatch("schedule-1", "12:04:59.999")), 1, 0,
                 "before its target", id="every dispatch before its target"),
    pytest.param(log(every("schedule-1", "12:05:00.000", "p"),
                     dispatch("schedule-1", "12:05:00.000"),
                     dispatch("schedule-1", "12:09:59.999")), 2, 0,
                 "before its target", id="every dispatch before its moved target"),
    pytest.param(log(every("schedule-1", "12:05:00.000", "p"), dispatch("schedule-1"),
                     dispatch("schedule-1", "12:10:00.000")), 2, 0,
                 "lacks acceptedAt", id="malformed replay of an earlier dispatch"),
]


@pytest.mark.parametrize(("events", "dispatch_seq", "seed_length", "reason"), REJECTIONS)
def test_a_receipt_that_cannot_be_paired_is_corrupt(
    events: list[Event], dispatch_seq: int, seed_length: int, reason: str
) -> None:
    with pytest.raises(ScheduleLogError, match=reason):
        reminder_presentation(events, dispatch_seq, seed_length)


def test_receipts_across_a_fork() -> None:
    # given a parent that created and delivered schedule-1, forked after four events,
    # and a child that created and delivered its own schedule-1
    events = log(
        at("schedule-1", "10:00:00.000", "parent call"),
        every("schedule-2", "10:00:00.000", "parent check"),
        dispatch("schedule-1"),
        dispatch("schedule-2", "10:07:00.000"),
        at("schedule-1", "11:00:00.000", "child call"),
        dispatch("schedule-1"),
    )
    seed_length = 4

    # when each dispatch is presented from the child
    inherited = reminder_presentation(events, 2, seed_length)
    inherited_every = reminder_presentation(events, 3, seed_length)
    own = reminder_presentation(events, 5, seed_length)

    # then an inherited dispatch pairs with the parent's create, the child's with its own
    assert inherited == receipt("schedule-1", "parent call", "10:00:00.000")
    assert inherited_every == receipt("schedule-2", "parent check", "10:05:00.000")
    assert own == receipt("schedule-1", "child call", "11:00:00.000")
    fold(events, seed_length)


def test_nested_generations_reuse_ids_and_stay_renderable() -> None:
    # given a grandparent, a parent forked after two events and a child after four,
    # each generation creating and delivering its own schedule-1
    events = log(
        every("schedule-1", "10:00:00.000", "grandparent"),
        dispatch("schedule-1", "10:00:00.000"),
        every("schedule-1", "10:02:00.000", "parent"),
        dispatch("schedule-1", "10:03:00.000"),
        every("schedule-1", "10:04:00.000", "child"),
        dispatch("schedule-1", "10:04:00.000"),
    )

    # when every dispatch is presented from the child (seed length 4)
    receipts = [reminder_presentation(events, seq, 4) for seq in (1, 3, 5)]

    # then each pairs with its own generation's nearest create
    assert receipts == [
        receipt("schedule-1", "grandparent", "10:00:00.000"),
        receipt("schedule-1", "parent", "10:02:00.000"),
        receipt("schedule-1", "child", "10:04:00.000"),
    ]


def test_a_child_dispatch_never_pairs_with_an_inherited_create() -> None:
    events = log(every("schedule-1", "10:00:00.000", "parent"), note(),
                 dispatch("schedule-1", "10:00:00.000"))
    with pytest.raises(ScheduleLogError):
        reminder_presentation(events, 2, 2)
    assert reminder_presentation(events, 2, 0) == receipt("schedule-1", "parent", "10:00:00.000")


def test_the_receipt_value_adds_the_session_local_label_last() -> None:
    # given a presentation of a prompt that needs escaping
    presentation = receipt("schedule-2", 'call "Ana" \u00e9', "16:00:00.000")

    # when rendered as the receipt value
    value = receipt_value(presentation)

    # then the keys are in the documented order with the fixed label last
    assert json.dumps(value, separators=(",", ":"), ensure_ascii=False) == (
        '{"scheduleId":"schedule-2","prompt":"call \\"Ana\\" \u00e9",'
        '"occurrenceAt":"2026-12-01T16:00:00.000Z","label":"session-local"}'
    )


def own_batches(events: list[Event], seed_length: int) -> list[tuple[int, ...]]:
    """The seqs of the fork's own dispatches, grouped as they are delivered: the groups its
    ledger holds (these logs deliver none)."""
    return [group.seqs for group in Ledger(seed_length).extend(events).view().undelivered()]


def test_own_dispatches_group_as_delivered() -> None:
    # given an inherited dispatch, then own one-shots and recurring batches
    events = log(
        at("schedule-1", "09:00:00.000", "parent"),
        dispatch("schedule-1"),                          # 1 inherited
        every("schedule-1", "10:00:00.000", "a"),
        every("schedule-2", "10:00:00.000", "b"),
        at("schedule-3", "10:00:00.000", "c"),
        at("schedule-4", "10:00:00.000", "d"),
        dispatch("schedule-3"),                          # 6 one-shot alone
        dispatch("schedule-4"),                          # 7 the next one-shot alone
        dispatch("schedule-1", "10:00:01.000"),          # 8 batch ...
        note(),
        dispatch("schedule-2", "10:00:01.000"),          # 10 ... same acceptedAt
        dispatch("schedule-1", "10:05:01.000"),          # 11 a later batch
        every("schedule-5", "10:05:00.000", "e"),
        dispatch("schedule-5", "10:05:01.000"),          # 13 same time, but a create between
    )
    fold(events, 2)

    # when grouped from the fork's seed length
    batches = own_batches(events, 2)

    # then one-shots stand alone and consecutive same-acceptedAt dispatches group
    assert batches == [(6,), (7,), (8, 10), (11,), (13,)]
    assert own_batches(events[:2], 0) == [(1,)]  # the parent's own view
    assert own_batches(events, len(events)) == []


def test_a_batch_ends_at_a_one_shot_dispatch_between_recurring_ones() -> None:
    events = log(every("schedule-1", "10:00:00.000", "a"), at("schedule-2", "10:00:00.000", "b"),
                 every("schedule-3", "10:00:00.000", "c"), dispatch("schedule-1", "10:00:00.000"),
                 dispatch("schedule-2"), dispatch("schedule-3", "10:00:00.000"))
    assert own_batches(events, 0) == [(3,), (4,), (5,)]


def test_grouping_rejects_a_malformed_record_at_its_seq() -> None:
    with pytest.raises(ScheduleLogError) as caught:
        own_batches(log(ONE, {"version": 1, "operation": "dispatch"}), 0)
    assert caught.value.seq == 1
