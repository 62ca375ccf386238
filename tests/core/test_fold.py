"""Replay of ``schedule/change`` records: the transition rules and effects of
docs/architecture.md#replay-rules."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, Event
from dsh_schedule.shared.core.fold import (
    EMPTY,
    FoldState,
    allocate_id,
    check_candidate,
    fold,
    fold_events,
    occurrence_at,
)
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.records import EverySchedule

T = "2026-12-01T12:00:00.000Z"


def ms(text: str) -> int:
    return parse_instant(text)


def plus(text: str, seconds: float) -> str:
    return format_instant(ms(text) + round(seconds * 1000))


def after(sid: str, at: str = T, seconds: int = 600, prompt: str = "stretch") -> dict[str, Any]:
    schedule = {"id": sid, "kind": "after", "prompt": prompt, "afterSeconds": seconds,
                "scheduledAt": at}
    return {"version": 1, "operation": "create", "schedule": schedule}


def at(sid: str, when: str = T, prompt: str = "call") -> dict[str, Any]:
    schedule = {"id": sid, "kind": "at", "prompt": prompt, "scheduledAt": when}
    return {"version": 1, "operation": "create", "schedule": schedule}


def every(sid: str, first: str = T, seconds: int = 300, prompt: str = "check") -> dict[str, Any]:
    schedule = {"id": sid, "kind": "every", "prompt": prompt, "everySeconds": seconds,
                "scheduledAt": first}
    return {"version": 1, "operation": "create", "schedule": schedule}


def delete(sid: str) -> dict[str, Any]:
    return {"version": 1, "operation": "delete", "id": sid}


def dispatch(sid: str, accepted: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1, "operation": "dispatch", "id": sid}
    if accepted is not None:
        data["acceptedAt"] = accepted
    return data


def note(text: str = "hello") -> tuple[str, Any]:
    """A non-Schedule event."""
    return (USER_MESSAGE, {"content": [{"type": "text", "text": text}]})


def log(*items: dict[str, Any] | tuple[str, Any]) -> list[Event]:
    events = []
    for seq, item in enumerate(items):
        kind, data = item if isinstance(item, tuple) else (SCHEDULE_CHANGE, item)
        events.append(Event(type=kind, seq=seq, time=seq, data=data))
    return events


TRANSITION_REJECTIONS = [
    pytest.param([after("schedule-1"), at("schedule-1")], id="create of an active id"),
    pytest.param([after("schedule-1"), delete("schedule-1"), after("schedule-1")],
                 id="create of a deleted id"),
    pytest.param([at("schedule-1"), dispatch("schedule-1"), at("schedule-1")],
                 id="create of a dispatched one-shot id"),
    pytest.param([every("schedule-1"), every("schedule-1")], id="create of an active every id"),
    pytest.param([after("schedule-1"), delete("schedule-2")], id="delete of a never-created id"),
    pytest.param([after("schedule-1"), delete("schedule-1"), delete("schedule-1")],
                 id="delete of a deleted id"),
    pytest.param([after("schedule-1"), dispatch("schedule-1"), delete("schedule-1")],
                 id="delete of a dispatched one-shot"),
    pytest.param([dispatch("schedule-1")], id="dispatch of a never-created id"),
    pytest.param([every("schedule-1"), delete("schedule-1"), dispatch("schedule-1", T)],
                 id="dispatch of a deleted id"),
    pytest.param([at("schedule-1"), dispatch("schedule-1"), dispatch("schedule-1")],
                 id="dispatch of a one-shot already dispatched"),
    pytest.param([after("schedule-1"), dispatch("schedule-1", T)],
                 id="after dispatch with acceptedAt"),
    pytest.param([at("schedule-1"), dispatch("schedule-1", plus(T, 1))],
                 id="at dispatch with acceptedAt"),
    pytest.param([every("schedule-1"), dispatch("schedule-1")],
                 id="every dispatch without acceptedAt"),
    pytest.param([every("schedule-1"), dispatch("schedule-1", plus(T, -0.001))],
                 id="every dispatch accepted 1 ms before the record's target"),
    pytest.param([every("schedule-1"), dispatch("schedule-1", plus(T, 299.999)),
                  dispatch("schedule-1", plus(T, 299.999))],
                 id="every dispatch before the record's moved target (same batch time)"),
    pytest.param([every("schedule-1"), every("schedule-2"), dispatch("schedule-1", T),
                  dispatch("schedule-2", plus(T, 299.999))],
                 id="recurring batches 299.999 s apart"),
    pytest.param([every("schedule-1"), every("schedule-2"), dispatch("schedule-1", plus(T, 60)),
                  dispatch("schedule-2", plus(T, 30))],
                 id="recurring dispatch earlier than the previous one"),
    pytest.param([every("schedule-1"), every("schedule-2"), dispatch("schedule-1", plus(T, 600)),
                  dispatch("schedule-2", plus(T, 100))],
                 id="recurring dispatch more than 300 s earlier than the previous one"),
    pytest.param([every("schedule-1"), dispatch("schedule-1", plus(T, 299.999)),
                  dispatch("schedule-1", plus(T, 300))],
                 id="same record at its next target but 1 ms after the previous batch"),
    pytest.param([every("schedule-1", "9999-12-31T23:55:00.000Z"),
                  dispatch("schedule-1", "9999-12-31T23:55:00.000Z"),
                  dispatch("schedule-1", "9999-12-31T23:59:59.999Z")],
                 id="dispatch of a record ended beyond 9999"),
]


@pytest.mark.parametrize("datas", TRANSITION_REJECTIONS)
def test_a_transition_rule_break_corrupts_the_log_at_that_event(
    datas: list[dict[str, Any]],
) -> None:
    # given a log whose records are each well-formed but whose last breaks a rule
    events = log(*datas)
    fold(events[:-1])

    # when it is folded, then the whole log is rejected at the offending event
    with pytest.raises(ScheduleLogError) as caught:
        fold(events)
    assert caught.value.seq == len(events) - 1


@pytest.mark.parametrize(
    "datas",
    [
        pytest.param([every("schedule-1"), every("schedule-2"), dispatch("schedule-1", T),
                      dispatch("schedule-2", T)], id="equal acceptedAt is one batch"),
        pytest.param([every("schedule-1"), every("schedule-2"), dispatch("schedule-1", T),
                      dispatch("schedule-2", plus(T, 300))], id="batches exactly 300 s apart"),
        pytest.param([every("schedule-1"), dispatch("schedule-1", T), at("schedule-2"),
                      dispatch("schedule-2"), every("schedule-3", plus(T, 1)),
                      dispatch("schedule-3", plus(T, 300))],
                     id="a one-shot dispatch between batches needs no gap"),
        pytest.param([at("schedule-1"), dispatch("schedule-1"), at("schedule-2"),
                      dispatch("schedule-2")], id="one-shots need no gap"),
        pytest.param([every("schedule-1"), dispatch("schedule-1", plus(T, 3 * 3600))],
                     id="a late dispatch long after the target"),
        pytest.param([at("schedule-1", plus(T, 3600)), dispatch("schedule-1")],
                     id="a one-shot dispatch does not check its time"),
    ],
)
def test_a_valid_log_folds(datas: list[dict[str, Any]]) -> None:
    fold(log(*datas))


def test_rule_equal_accepted_at_is_allowed_but_a_later_batch_at_it_is_not() -> None:
    """Equal ``acceptedAt`` joins the previous batch, wherever it appears in the log."""
    # given two records dispatched in one batch with a create between them
    events = log(every("schedule-1"), dispatch("schedule-1", T), every("schedule-2"),
                 dispatch("schedule-2", T))

    # when folded, then both advanced and the batch time is that acceptedAt
    state = fold(events)
    assert [r.scheduledAt for r in state.active] == [plus(T, 300), plus(T, 300)]
    assert state.last_batch_ms == ms(T)


@pytest.mark.parametrize("seed_length", [-1, 4])
def test_a_seed_length_outside_the_log_is_corrupt(seed_length: int) -> None:
    events = log(after("schedule-1"), note(), at("schedule-2"))
    with pytest.raises(ScheduleLogError):
        fold(events, seed_length)


@pytest.mark.parametrize("seed_length", [0, 1, 2, 3])
def test_every_seed_length_inside_the_log_is_accepted(seed_length: int) -> None:
    events = log(after("schedule-1"), note(), at("schedule-2"))
    state = fold(events, seed_length)
    assert len(state.active) == (2 if seed_length == 0 else 1 if seed_length < 3 else 0)


def test_fixed_rate_progression_stays_on_the_anchor() -> None:
    # given a 300 s record created at 12:00:00.000, so its first target is 12:05:00.000
    created = log(every("schedule-1", "2026-12-01T12:05:00.000Z", 300))
    record = fold(created).active[0]
    assert record.scheduledAt == "2026-12-01T12:05:00.000Z"

    # when a batch is accepted late, at 12:17:30.000
    assert isinstance(record, EverySchedule)
    occurrence = occurrence_at(record, ms("2026-12-01T12:17:30.000Z"))
    accepted = log(*[e.data for e in created], dispatch("schedule-1", "2026-12-01T12:17:30.000Z"))
    state = fold(accepted)

    # then it delivered 12:15:00.000 only, and the target moved to 12:20:00.000
    assert format_instant(occurrence) == "2026-12-01T12:15:00.000Z"
    assert state.active[0].scheduledAt == "2026-12-01T12:20:00.000Z"
    assert state.last_batch_ms == ms("2026-12-01T12:17:30.000Z")


@pytest.mark.parametrize(
    ("accepted", "occurrence", "next_target"),
    [
        pytest.param("12:05:00.000", "12:05:00.000", "12:10:00.000", id="exactly on target"),
        pytest.param("12:05:00.413", "12:05:00.000", "12:10:00.000", id="a little late"),
        pytest.param("12:09:59.999", "12:05:00.000", "12:10:00.000", id="just before the next"),
        pytest.param("12:10:00.000", "12:10:00.000", "12:15:00.000", id="on the next occurrence"),
        pytest.param("12:17:30.000", "12:15:00.000", "12:20:00.000", id="backlog is skipped"),
    ],
)
def test_occurrence_is_the_latest_anchor_aligned_one_not_after_accepted_at(
    accepted: str, occurrence: str, next_target: str
) -> None:
    day = "2026-12-01T"
    record = EverySchedule(id="schedule-1", prompt="p", everySeconds=300,
                           scheduledAt=f"{day}12:05:00.000Z")
    assert format_instant(occurrence_at(record, ms(f"{day}{accepted}Z"))) == f"{day}{occurrence}Z"
    state = fold(log(every("schedule-1", f"{day}12:05:00.000Z"),
                     dispatch("schedule-1", f"{day}{accepted}Z")))
    assert state.active[0].scheduledAt == f"{day}{next_target}Z"


@pytest.mark.parametrize(
    ("first", "accepted", "remains"),
    [
        pytest.param("9999-12-31T23:55:00.000Z", "9999-12-31T23:59:59.999Z", None,
                     id="next target beyond 9999-12-31T23:59:59.999Z ends the record"),
        pytest.param("9999-12-31T23:54:59.999Z", "9999-12-31T23:54:59.999Z",
                     "9999-12-31T23:59:59.999Z", id="next target exactly at the last ms stays"),
    ],
)
def test_the_end_of_representable_time_ends_a_record(
    first: str, accepted: str, remains: str | None
) -> None:
    state = fold(log(every("schedule-1", first), dispatch("schedule-1", accepted)))
    assert [r.scheduledAt for r in state.active] == ([] if remains is None else [remains])
    assert state.created == {"schedule-1"}
    assert state.last_batch_ms == ms(accepted)


def test_effects_keep_create_order_every_id_and_the_last_batch() -> None:
    # given creates of four records, a delete, a one-shot dispatch and a recurring batch
    events = log(
        every("schedule-1", T),
        at("schedule-2", T),
        note(),
        after("schedule-3", plus(T, 60)),
        every("schedule-4", plus(T, -600), 600),
        delete("schedule-3"),
        dispatch("schedule-2"),
        dispatch("schedule-4", plus(T, 10)),
        dispatch("schedule-1", plus(T, 10)),
    )

    # when folded
    state = fold(events)

    # then the active records keep create order, ended ones are gone, ids are remembered
    assert [r.id for r in state.active] == ["schedule-1", "schedule-4"]
    assert [r.scheduledAt for r in state.active] == [plus(T, 300), plus(T, 600)]
    assert state.created == {"schedule-1", "schedule-2", "schedule-3", "schedule-4"}
    assert state.last_batch_ms == ms(T) + 10_000
    assert state.find("schedule-4") == state.active[1]
    assert state.find("schedule-3") is None


def test_an_empty_log_and_a_log_without_schedule_events_fold_to_nothing() -> None:
    assert fold([]) == EMPTY
    assert fold(log(note(), ("custom/unknown", {"version": 9}), note())) == EMPTY
    assert EMPTY == FoldState(active=(), created=frozenset(), last_batch_ms=None)


def test_other_event_types_are_ignored_even_when_they_look_like_records() -> None:
    events = log(after("schedule-1"), ("schedule/other", delete("schedule-1")))
    assert [r.id for r in fold(events).active] == ["schedule-1"]


def test_fork_folds_only_its_own_suffix() -> None:
    # given a parent with two reminders, a one-shot and a recurring one
    parent: list[dict[str, Any] | tuple[str, Any]] = [
        at("schedule-1", T, "parent call"),
        every("schedule-2", T),
        note(),
    ]

    # when a child forked after them creates its own reminder
    events = log(*parent, at("schedule-1", T, "child call"))
    child = fold(events, seed_length=len(parent))

    # then the child does not inherit the parent's reminders and its ids restart
    assert [(r.id, r.prompt) for r in child.active] == [("schedule-1", "child call")]
    assert child.created == {"schedule-1"}
    assert child.last_batch_ms is None
    assert allocate_id(fold(events[: len(parent)], seed_length=len(parent))) == "schedule-1"
    assert allocate_id(child) == "schedule-2"


def test_fork_cannot_touch_inherited_reminders() -> None:
    parent = [every("schedule-1", T)]
    events = log(*parent, dispatch("schedule-1", T))
    with pytest.raises(ScheduleLogError) as caught:
        fold(events, seed_length=len(parent))
    assert caught.value.seq == 1


def test_fork_ignores_what_the_inherited_prefix_holds() -> None:
    # given an inherited prefix that would not pass the fold on its own
    events = log(dispatch("schedule-9"), {"version": 2}, after("schedule-1"))

    # when the fork folds from its seed length, then only its own suffix counts
    assert [r.id for r in fold(events, seed_length=2).active] == ["schedule-1"]


@pytest.mark.parametrize(
    ("datas", "allocated"),
    [
        pytest.param([], "schedule-1", id="first id"),
        pytest.param([after("schedule-1"), at("schedule-2")], "schedule-3", id="count + 1"),
        pytest.param([after("schedule-1"), at("schedule-2"), delete("schedule-2")], "schedule-3",
                     id="a deleted id is never reused"),
        pytest.param([at("schedule-1"), dispatch("schedule-1")], "schedule-2",
                     id="a dispatched id is never reused"),
        pytest.param([after("schedule-2")], "schedule-3", id="upward past a taken id"),
        pytest.param([after("schedule-2"), after("schedule-3"), after("a")], "schedule-4",
                     id="upward past several taken ids"),
        pytest.param([after("x"), after("y")], "schedule-3", id="starts at count + 1, not 1"),
    ],
)
def test_id_allocation(datas: list[dict[str, Any]], allocated: str) -> None:
    assert allocate_id(fold(log(*datas))) == allocated


def test_folding_continues_from_a_state() -> None:
    # given a log cut in two
    events = log(every("schedule-1"), at("schedule-2"), dispatch("schedule-1", T), note(),
                 dispatch("schedule-2"), after("schedule-3"), delete("schedule-3"))

    # when the second half continues the fold of the first, at every cut
    # then it equals the fold of the whole log
    for cut in range(len(events) + 1):
        assert fold_events(fold(events[:cut]), events[cut:]) == fold(events)


def test_the_invariant_companion_checks_candidates_against_the_existing_fold() -> None:
    # given an existing log holding one active every record
    existing = log(every("schedule-1"))
    state = fold(existing)

    # when candidate events are checked
    good = log(every("schedule-1"), dispatch("schedule-1", T))[1:]
    bad = log(every("schedule-1"), dispatch("schedule-1"))[1:]

    # then a valid candidate gives the continued fold, a bad one is rejected at its seq
    assert check_candidate(state, good) == fold([*existing, *good])
    with pytest.raises(ScheduleLogError) as caught:
        check_candidate(state, bad)
    assert caught.value.seq == 1
    assert fold(existing) == state


def test_a_late_dispatch_moves_to_the_first_strictly_future_aligned_target() -> None:
    events = log(every("schedule-1", T, 3600), dispatch("schedule-1", plus(T, 7201.5)))
    assert fold(events).active[0].scheduledAt == plus(T, 3 * 3600)
