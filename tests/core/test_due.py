"""The live owner's decision from the fold and ``now``
(docs/architecture.md#the-due-transaction)."""

from __future__ import annotations

import pytest

from dsh_schedule.shared.core.due import (
    DispatchBatch,
    DispatchOne,
    Wait,
    due_decision,
    gate_opens_ms,
    next_due_moment_ms,
    next_wake_ms,
)
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.records import AfterSchedule, AtSchedule, EverySchedule, Schedule

T = parse_instant("2026-12-01T12:00:00.000Z")
S = 1000


def one(sid: str, target: int) -> AtSchedule:
    return AtSchedule(id=sid, prompt=f"prompt {sid}", scheduledAt=format_instant(target))


def delay(sid: str, target: int) -> AfterSchedule:
    return AfterSchedule(id=sid, prompt=f"prompt {sid}", afterSeconds=600,
                         scheduledAt=format_instant(target))


def rec(sid: str, target: int) -> EverySchedule:
    return EverySchedule(id=sid, prompt=f"prompt {sid}", everySeconds=300,
                         scheduledAt=format_instant(target))


def state(*active: Schedule, last_batch: int | None = None) -> FoldState:
    return FoldState(active=active, created=frozenset(r.id for r in active),
                     last_batch_ms=last_batch)


A1, A2, A3 = one("schedule-1", T), one("schedule-2", T - 5 * S), one("schedule-3", T)
D4 = delay("schedule-4", T - 1)
E5, E6, E7 = rec("schedule-5", T), rec("schedule-6", T - 60 * S), rec("schedule-7", T)
E8 = rec("schedule-8", T + 60 * S)
LATER = one("schedule-9", T + 90 * S)

DECISIONS = [
    pytest.param(state(), T, Wait(until_ms=None), id="nothing active: wait for nothing"),
    pytest.param(state(A1), T, DispatchOne(record=A1), id="a one-shot due exactly now"),
    pytest.param(state(D4), T, DispatchOne(record=D4), id="an after record 1 ms overdue"),
    pytest.param(state(A1, A2), T, DispatchOne(record=A2),
                 id="earliest target first, not create order"),
    pytest.param(state(A1, A3), T, DispatchOne(record=A1), id="equal targets: create order"),
    pytest.param(state(A3, A1), T, DispatchOne(record=A3), id="equal targets: create order (2)"),
    pytest.param(state(E6, A1), T, DispatchOne(record=A1),
                 id="a due one-shot goes alone, before an earlier due every record"),
    pytest.param(state(E6, A1, last_batch=T - 10 * S), T, DispatchOne(record=A1),
                 id="one-shots bypass the recurring gate"),
    pytest.param(state(E5), T, DispatchBatch(records=(E5,), accepted_ms=T),
                 id="every due, no previous batch: a batch accepted now"),
    pytest.param(state(E5, E6, E7), T + 1, DispatchBatch(records=(E6, E5, E7), accepted_ms=T + 1),
                 id="every due every record, in target then create order"),
    pytest.param(state(E5, E8), T, DispatchBatch(records=(E5,), accepted_ms=T),
                 id="only due records join the batch"),
    pytest.param(state(E5, last_batch=T - 300 * S), T, DispatchBatch(records=(E5,), accepted_ms=T),
                 id="gate open exactly 300 s after the last batch"),
    pytest.param(state(E5, last_batch=T - 299_999), T, Wait(until_ms=T + 1),
                 id="gated: wait until the gate"),
    pytest.param(state(E5, last_batch=T + 10 * S), T, Wait(until_ms=T + 310 * S),
                 id="clock rolled back behind the last batch: still gated"),
    pytest.param(state(E5, LATER, last_batch=T - 250 * S), T, Wait(until_ms=T + 50 * S),
                 id="gated: the gate before a later one-shot"),
    pytest.param(state(E5, one("schedule-9", T + 10 * S), last_batch=T - 250 * S), T,
                 Wait(until_ms=T + 10 * S), id="gated: a one-shot before the gate"),
    pytest.param(state(E8, LATER), T, Wait(until_ms=T + 60 * S),
                 id="future only: wait until the earliest target"),
    pytest.param(state(LATER, E8, last_batch=T - 10 * S), T, Wait(until_ms=T + 60 * S),
                 id="future only: a closed gate does not matter"),
    pytest.param(state(A1), T - 1, Wait(until_ms=T), id="early sample: no one-shot"),
    pytest.param(state(E5), T - 1, Wait(until_ms=T), id="early sample: no batch"),
]


@pytest.mark.parametrize(("fold_state", "now", "expected"), DECISIONS)
def test_due_decision(fold_state: FoldState, now: int, expected: object) -> None:
    assert due_decision(fold_state, now) == expected


@pytest.mark.parametrize(
    ("fold_state", "now", "expected"),
    [
        pytest.param(state(), T, None, id="nothing active: no wake"),
        pytest.param(state(A1), T, T, id="something due: wake now"),
        pytest.param(state(E5, last_batch=T - 299_999), T, T + 1, id="gated: the gate time"),
        pytest.param(state(LATER), T, T + 90 * S, id="future: the earliest target"),
    ],
)
def test_next_wake(fold_state: FoldState, now: int, expected: int | None) -> None:
    assert next_wake_ms(fold_state, now) == expected


def test_the_gate_opens_300_seconds_after_the_last_batch() -> None:
    assert gate_opens_ms(state()) is None
    assert gate_opens_ms(state(last_batch=T)) == T + 300 * S


@pytest.mark.parametrize(("fold_state", "expected"), [
    (state(), None),
    (state(A1, A2), T - 5 * S),
    (state(E6, last_batch=T - 100 * S), T + 200 * S),  # the gate opens after the target
    (state(E6, A1, last_batch=T - 100 * S), T),
    (state(E6, last_batch=T - 400 * S), T - 60 * S),
], ids=["nothing", "earliest one-shot", "gate", "one-shot before the gate", "gate open"])
def test_the_next_due_moment_needs_no_now(fold_state: FoldState, expected: int | None) -> None:
    assert next_due_moment_ms(fold_state) == expected
    if expected is not None:
        assert not isinstance(due_decision(fold_state, expected), Wait)
        assert isinstance(due_decision(fold_state, expected - 1), Wait)
