"""Which reminders the log says were dispatched, and which were delivered
(docs/architecture.md#hosts-followups-and-rebuild)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import pytest

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    USER_MESSAGE,
    Event,
    Session,
    SessionHeader,
)
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.ledger import (
    DispatchGroup,
    Ledger,
    LedgerView,
    Pair,
    Undelivered,
    ledger_of,
    reminder_source,
)

DAY = "2026-12-01T"


def t(clock: str) -> str:
    return f"{DAY}{clock}Z"


def at(sid: str, clock: str) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "at", "prompt": "p", "scheduledAt": t(clock)}
    return {"version": 1, "operation": "create", "schedule": schedule}


def every(sid: str, clock: str, seconds: int = 300) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "every", "prompt": "p", "everySeconds": seconds,
                "scheduledAt": t(clock)}
    return {"version": 1, "operation": "create", "schedule": schedule}


def dispatch(sid: str, clock: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1, "operation": "dispatch", "id": sid}
    if clock is not None:
        data["acceptedAt"] = t(clock)
    return data


def pair(sid: str, clock: str) -> Pair:
    return Pair(scheduleId=sid, occurrenceAt=t(clock))


def delivered(*pairs: Pair, plugin: str = "tool-schedule") -> tuple[str, Any]:
    source = reminder_source(pairs)
    source["plugin"] = plugin
    return (USER_MESSAGE, {"content": [], "source": source})


def note() -> tuple[str, Any]:
    return (USER_MESSAGE, {"content": [{"type": "text", "text": "hi"}]})


def log(*items: dict[str, Any] | tuple[str, Any]) -> list[Event]:
    events = []
    for seq, item in enumerate(items):
        kind, data = item if isinstance(item, tuple) else (SCHEDULE_CHANGE, item)
        events.append(Event(type=kind, seq=seq, time=seq, data=data))
    return events


DISPATCHES = log(
    every("schedule-1", "10:00:00.000"),
    every("schedule-2", "09:58:00.000", seconds=600),
    at("schedule-3", "10:00:00.000"),
    dispatch("schedule-3"),                      # 3 a one-shot alone
    dispatch("schedule-1", "10:01:00.000"),      # 4 a batch ...
    note(),
    dispatch("schedule-2", "10:01:00.000"),      # 6 ... across a message
)
ONE_SHOT = DispatchGroup(seqs=(3,), pairs=(pair("schedule-3", "10:00:00.000"),))
BATCH = DispatchGroup(
    seqs=(4, 6),
    pairs=(pair("schedule-1", "10:00:00.000"), pair("schedule-2", "09:58:00.000")),
    accepted_at=t("10:01:00.000"),
)


def test_dispatches_group_as_delivered_and_a_batch_names_its_time() -> None:
    ledger = Ledger(0).extend(DISPATCHES)
    assert ledger.view().undelivered() == [ONE_SHOT, BATCH]
    assert ledger.dispatched == 2


def test_the_ledger_keeps_the_prompts_of_undelivered_groups_only() -> None:
    # given both groups undelivered: each keeps its records' prompts as dispatched
    ledger = Ledger(0).extend(DISPATCHES)
    assert ledger.view() == LedgerView(pending=(
        Undelivered(group=ONE_SHOT, prompts=("p",)),
        Undelivered(group=BATCH, prompts=("p", "p")),
    ))
    assert ledger.view().prompts(BATCH) == ("p", "p")
    # when the batch is delivered, then only the one-shot is kept
    ledger.extend([Event(type=USER_MESSAGE, seq=7, time=7, data=delivered(*BATCH.pairs)[1])])
    assert ledger.view().pending == (Undelivered(group=ONE_SHOT, prompts=("p",)),)
    assert ledger.view().prompts(BATCH) is None
    assert ledger.dispatched == 2


def test_a_view_does_not_change_as_the_ledger_continues() -> None:
    ledger = Ledger(0).extend(DISPATCHES[:4])
    before = ledger.view()
    ledger.extend(DISPATCHES[4:])
    assert before.undelivered() == [ONE_SHOT]
    assert ledger.view().undelivered() == [ONE_SHOT, BATCH]


def test_the_ledger_replays_what_the_fold_does() -> None:
    ledger = Ledger(0).extend(DISPATCHES)
    assert ledger.state() == fold(DISPATCHES)
    assert Ledger(2).extend(DISPATCHES[:3]).state() == fold(DISPATCHES[:3], 2)


def test_a_batch_member_after_its_delivered_group_stays_covered() -> None:
    # given a batch delivered after its first dispatch, then a late dispatch of the batch
    events = [*DISPATCHES[:5], Event(type=USER_MESSAGE, seq=5, time=5,
                                     data=delivered(BATCH.pairs[0])[1]), DISPATCHES[6]]
    ledger = Ledger(0).extend(events)
    # then the batch is one group, delivered as a whole: the late member opens no group
    assert ledger.dispatched == 2
    assert ledger.view().undelivered() == [ONE_SHOT]
    assert not ledger.view().deliverable(BATCH.pairs[1:])


@pytest.mark.parametrize(
    ("message", "undelivered"),
    [
        pytest.param(delivered(*BATCH.pairs), [ONE_SHOT], id="a delivered batch is covered"),
        pytest.param(delivered(*ONE_SHOT.pairs), [BATCH], id="a delivered one-shot is covered"),
        pytest.param(
            delivered(*BATCH.pairs, plugin="time-context"),
            [ONE_SHOT, BATCH],
            id="another plugin's message covers nothing",
        ),
        pytest.param(
            (USER_MESSAGE, {"source": {"plugin": "tool-schedule", "reminders": [{"x": 1}]}}),
            [ONE_SHOT, BATCH],
            id="a reminder that is no pair is ignored",
        ),
        pytest.param(
            (USER_MESSAGE, "not an object"), [ONE_SHOT, BATCH], id="odd message data is ignored"
        ),
        pytest.param(
            (USER_MESSAGE, {"source": {"plugin": "tool-schedule", "reminders": 5}}),
            [ONE_SHOT, BATCH],
            id="reminders that are no list are ignored",
        ),
    ],
)
def test_a_delivered_message_covers_the_groups_it_names(
    message: tuple[str, Any], undelivered: list[DispatchGroup]
) -> None:
    events = [*DISPATCHES, Event(type=message[0], seq=7, time=7, data=message[1])]
    assert Ledger(0).extend(events).view().undelivered() == undelivered


@pytest.mark.parametrize(
    ("pairs", "deliverable"),
    [
        pytest.param(BATCH.pairs, True, id="the complete batch the log recorded"),
        pytest.param(reversed(BATCH.pairs), True, id="in any order"),
        pytest.param(BATCH.pairs[:1], False, id="part of a batch"),
        pytest.param((*BATCH.pairs, *ONE_SHOT.pairs), False, id="two groups at once"),
        pytest.param((), False, id="no pairs"),
        pytest.param((pair("schedule-9", "10:00:00.000"),), False, id="a pair never dispatched"),
        pytest.param(ONE_SHOT.pairs, False, id="a group already delivered"),
    ],
)
def test_only_one_complete_undelivered_group_is_deliverable(pairs: Any, deliverable: bool) -> None:
    message = delivered(*ONE_SHOT.pairs)[1]
    events = [*DISPATCHES, Event(type=USER_MESSAGE, seq=7, time=7, data=message)]
    assert Ledger(0).extend(events).view().deliverable(pairs) is deliverable


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        pytest.param(log(every("schedule-1", "10:00:00.000"), dispatch("schedule-1")),
                     "recurring dispatch lacks acceptedAt", id="a recurring dispatch, no time"),
        pytest.param(log(dispatch("schedule-1")), "inactive", id="a dispatch of nothing active"),
        pytest.param(log(at("schedule-1", "10:00:00.000"), dispatch("schedule-1", "10:00:00.000")),
                     "carries acceptedAt", id="a one-shot dispatch with a time"),
    ],
)
def test_a_record_that_breaks_the_replay_rules_is_corrupt_at_its_seq(
    events: list[Event], reason: str
) -> None:
    with pytest.raises(ScheduleLogError, match=reason) as caught:
        Ledger(0).extend(events)
    assert caught.value.seq == len(events) - 1


class Recorded(Sequence[Event]):
    """Events that remember which of them were read."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.read: set[int] = set()

    def __len__(self) -> int:
        return len(self.events)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        indices = range(len(self.events))[index]
        self.read.update([indices] if isinstance(indices, int) else indices)
        return self.events[index]


def test_a_ledger_continued_with_a_grown_log_reads_only_the_new_tail() -> None:
    ledger = Ledger(0).extend(DISPATCHES[:4])
    assert ledger.view().undelivered() == [ONE_SHOT]

    # the same agent's log grew: only the new tail is read
    grown = Recorded(DISPATCHES)
    assert ledger.extend(grown[4:]).view().undelivered() == [ONE_SHOT, BATCH]
    assert grown.read == {4, 5, 6}


def test_a_session_without_a_kept_ledger_is_replayed_from_its_own_suffix() -> None:
    header = SessionHeader(id="s1", createdAt=0)
    shorter = Recorded(DISPATCHES[:4])
    assert ledger_of(Session(header=header, events=shorter)).undelivered() == [ONE_SHOT]
    assert shorter.read == {0, 1, 2, 3}
    assert ledger_of(Session(header=header, events=DISPATCHES)).undelivered() == [
        ONE_SHOT, BATCH]
    forked = SessionHeader(id="s1", createdAt=0, seedLength=len(DISPATCHES))
    assert ledger_of(Session(header=forked, events=DISPATCHES)).undelivered() == []


def test_the_ledger_a_session_carries_is_answered_and_no_event_read() -> None:
    # given a session whose store kept its ledger
    header = SessionHeader(id="s1", createdAt=0)
    kept = Ledger(0).extend(DISPATCHES).view()
    events = Recorded(DISPATCHES)
    # when / then
    assert ledger_of(Session(header=header, events=events, ledger=kept)) is kept
    assert events.read == set()
