"""Calendar-rule records through replay (docs/architecture.md#schedule-records,
docs/decisions.md#calendar-rules): the version-2 create, its strict decoding, the
dispatch that delivers the latest occurrence not after its acceptance, the recurring gate
it shares with ``every``, views, receipts, frames and the due decision, over tables and
over logs an owner writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.cron import parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after
from dsh_schedule.shared.core.dispatch import pending_frame, plan_dispatch
from dsh_schedule.shared.core.due import (
    DispatchBatch,
    DispatchOne,
    Wait,
    due_decision,
    next_wake_ms,
)
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    Event,
    Session,
    SessionHeader,
)
from dsh_schedule.shared.core.fold import EMPTY, allocate_id, check_candidate, fold, fold_events
from dsh_schedule.shared.core.instant import MAX_MS, format_instant, parse_instant
from dsh_schedule.shared.core.ledger import Ledger
from dsh_schedule.shared.core.presentation import reminder_presentation
from dsh_schedule.shared.core.records import (
    CronSchedule,
    DispatchChange,
    decode_change,
    encode_change,
)
from dsh_schedule.shared.core.timesel import load_zone
from dsh_schedule.shared.core.views import list_value
from tests.core.test_dispatch import frame_from_log
from tests.core.test_presentation import own_batches

T = "2026-12-01T12:00:00.000Z"  # a Tuesday
WEEKDAYS_9 = "0 9 * * MON-FRI"


def cron(sid: str, first: str = "2026-12-02T08:00:00.000Z", rule: str = WEEKDAYS_9,
         zone: str = "Europe/Berlin", prompt: str = "stand-up") -> dict[str, Any]:
    schedule = {"id": sid, "kind": "cron", "prompt": prompt, "cron": rule, "timeZone": zone,
                "scheduledAt": first}
    return {"version": 2, "operation": "create", "schedule": schedule}


def every(sid: str, first: str = T, seconds: int = 300) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "every", "prompt": "check", "everySeconds": seconds,
                "scheduledAt": first}
    return {"version": 1, "operation": "create", "schedule": schedule}


def dispatch(sid: str, accepted: str | None = None, version: int = 1) -> dict[str, Any]:
    data: dict[str, Any] = {"version": version, "operation": "dispatch", "id": sid}
    if accepted is not None:
        data["acceptedAt"] = accepted
    return data


def log(*datas: dict[str, Any]) -> list[Event]:
    return [Event(type=SCHEDULE_CHANGE, seq=i, time=i, data=d) for i, d in enumerate(datas)]


def with_schedule(**changes: Any) -> dict[str, Any]:
    data = cron("schedule-1")
    data["schedule"].update(changes)
    return data


def without(key: str) -> dict[str, Any]:
    data = cron("schedule-1")
    del data["schedule"][key]
    return data


# ---------------------------------------------------------------- the record


def test_a_cron_create_is_version_2_with_the_documented_key_order() -> None:
    data = cron("schedule-1")
    change = decode_change(data)
    assert change.version == 2
    assert isinstance(change.schedule, CronSchedule)
    encoded = encode_change(change)
    assert json.dumps(encoded) == json.dumps(data)
    assert list(encoded["schedule"]) == ["id", "kind", "prompt", "cron", "timeZone",
                                         "scheduledAt"]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({**every("schedule-1"), "version": 2}, id="v2-every"),
        pytest.param({**cron("schedule-1"), "version": 1}, id="v1-cron"),
        pytest.param({**cron("schedule-1"), "version": 3}, id="v3"),
        pytest.param({**cron("schedule-1"), "version": 2.0}, id="float-version"),
        pytest.param({**cron("schedule-1"), "version": True}, id="bool-version"),
        pytest.param(dispatch("schedule-1", T, version=2), id="v2-dispatch"),
        pytest.param({"version": 2, "operation": "delete", "id": "schedule-1"}, id="v2-delete"),
        pytest.param(with_schedule(cron="0 9 * * MON-SUN"), id="descending-days"),
        pytest.param(with_schedule(cron="*/4 * * * *"), id="too-frequent"),
        pytest.param(with_schedule(cron="0 9 * *"), id="four-fields"),
        pytest.param(with_schedule(cron="@daily"), id="macro"),
        pytest.param(with_schedule(cron="0 0 30 2 *"), id="no-date-matches"),
        pytest.param(with_schedule(cron=" 0 9 * * MON-FRI"), id="untrimmed-rule"),
        pytest.param(with_schedule(cron="0  9 * * MON-FRI"), id="double-space"),
        pytest.param(with_schedule(cron="0\t9 * * MON-FRI"), id="tab"),
        pytest.param(with_schedule(cron=5), id="rule-not-a-string"),
        pytest.param(with_schedule(timeZone="EST"), id="zone-no-area"),
        pytest.param(with_schedule(timeZone="Mars/Olympus"), id="zone-unknown"),
        pytest.param(with_schedule(timeZone="europe/berlin"), id="zone-wrong-case"),
        pytest.param(with_schedule(timeZone=None), id="zone-null"),
        pytest.param(with_schedule(scheduledAt="2026-12-02T08:00:00Z"), id="target-not-canonical"),
        pytest.param(with_schedule(prompt=" x"), id="prompt-untrimmed"),
        pytest.param(with_schedule(everySeconds=300), id="extra-key"),
        pytest.param(without("timeZone"), id="no-zone"),
        pytest.param(without("cron"), id="no-rule"),
    ],
)
def test_a_malformed_calendar_record_corrupts_the_log(data: dict[str, Any]) -> None:
    with pytest.raises(ScheduleLogError) as caught:
        fold(log(every("schedule-0"), data))
    assert caught.value.seq == 1


@pytest.mark.parametrize("zone", ["UTC", "Australia/Lord_Howe", "America/Argentina/Salta"])
def test_any_valid_zone_and_names_in_the_rule_are_accepted(zone: str) -> None:
    state = fold(log(with_schedule(timeZone=zone, cron="0,30 9-17/2 1,15 jan-DEC sun,SAT")))
    assert state.find("schedule-1") is not None


# ---------------------------------------------------------------- the dispatch


def test_a_dispatch_delivers_the_latest_occurrence_and_moves_to_the_next_after_it() -> None:
    # given a weekday 09:00 Berlin rule due Wednesday, dispatched only on Friday at 10:00
    events = log(cron("schedule-1"), dispatch("schedule-1", "2026-12-04T09:00:00.000Z"))
    state = fold(events)
    # then Friday's 09:00 (08:00 UTC) is delivered and Monday's is the next target
    presentation = reminder_presentation(events, 1, 0)
    assert presentation is not None
    assert presentation.occurrenceAt == "2026-12-04T08:00:00.000Z"
    record = state.find("schedule-1")
    assert isinstance(record, CronSchedule)
    assert record.scheduledAt == "2026-12-07T08:00:00.000Z"
    assert record.cron == WEEKDAYS_9 and record.timeZone == "Europe/Berlin"
    assert state.last_batch_ms == parse_instant("2026-12-04T09:00:00.000Z")


@pytest.mark.parametrize(
    "datas",
    [
        pytest.param([cron("schedule-1"), dispatch("schedule-1")], id="no-acceptedAt"),
        pytest.param(
            [cron("schedule-1"), dispatch("schedule-1", "2026-12-02T07:59:59.999Z")],
            id="before-target",
        ),
        pytest.param(
            [every("schedule-1"), cron("schedule-2"),
             dispatch("schedule-1", "2026-12-02T08:00:00.000Z"),
             dispatch("schedule-2", "2026-12-02T08:04:59.999Z")],
            id="gate-shared-with-every",
        ),
    ],
)
def test_a_recurring_rule_break_corrupts_the_log(datas: list[dict[str, Any]]) -> None:
    with pytest.raises(ScheduleLogError):
        fold(log(*datas))


def test_cron_and_every_dispatched_in_one_batch_are_one_group() -> None:
    accepted = "2026-12-02T08:00:00.000Z"
    events = log(every("schedule-1"), cron("schedule-2"), dispatch("schedule-1", accepted),
                 dispatch("schedule-2", accepted))
    assert own_batches(events, 0) == [(2, 3)]
    assert fold(events).last_batch_ms == parse_instant(accepted)


def test_replay_does_not_depend_on_zone_data_agreeing_with_the_log() -> None:
    # given a log written when the zone said another offset: its target is no occurrence
    # under today's zone data, and the dispatch came right at that target
    events = log(cron("schedule-1", first="2026-12-02T07:30:00.000Z"),
                 dispatch("schedule-1", "2026-12-02T07:30:00.000Z"))
    # then the log still folds: the delivered occurrence is never before the target, and
    # the record moves on to the rule's next occurrence after the acceptance
    presentation = reminder_presentation(events, 1, 0)
    assert presentation is not None
    assert presentation.occurrenceAt == "2026-12-02T07:30:00.000Z"
    record = fold(events).find("schedule-1")
    assert record is not None and record.scheduledAt == "2026-12-02T08:00:00.000Z"


def test_the_last_occurrence_before_9999_ends_the_record() -> None:
    last = "9999-12-31T23:59:00.000Z"
    events = log(cron("schedule-1", first=last, rule="59 23 31 12 *", zone="UTC"),
                 dispatch("schedule-1", last))
    assert fold(events).active == ()


def test_the_view_shows_the_rule_and_the_gate() -> None:
    # given an every batch accepted a minute ago and a cron rule due since then
    accepted = "2026-12-02T07:59:00.000Z"
    state = fold(log(every("schedule-1", first=accepted), cron("schedule-2"),
                     dispatch("schedule-1", accepted)))
    now = parse_instant("2026-12-02T08:01:00.000Z")
    views = list_value(state, now)
    assert list(views[1]) == ["id", "kind", "prompt", "cron", "timeZone", "scheduledAt", "state",
                              "deliveryMode", "deliveryNotBefore"]
    assert views[1] == {
        "id": "schedule-2", "kind": "cron", "prompt": "stand-up", "cron": WEEKDAYS_9,
        "timeZone": "Europe/Berlin", "scheduledAt": "2026-12-02T08:00:00.000Z",
        "state": "overdue", "deliveryMode": "session-local",
        "deliveryNotBefore": "2026-12-02T08:04:00.000Z",
    }
    # and before the target it is scheduled, with no gate
    assert list(list_value(state, parse_instant(T))[1]) == [
        "id", "kind", "prompt", "cron", "timeZone", "scheduledAt", "state", "deliveryMode"]


def test_the_due_decision_batches_cron_with_every_after_the_one_shots() -> None:
    at = {"version": 1, "operation": "create",
          "schedule": {"id": "schedule-3", "kind": "at", "prompt": "call",
                       "scheduledAt": "2026-12-02T08:00:00.000Z"}}
    state = fold(log(every("schedule-1"), cron("schedule-2"), at))
    now = parse_instant("2026-12-02T08:00:00.000Z")
    first = due_decision(state, now)
    assert isinstance(first, DispatchOne) and first.record.id == "schedule-3"
    state = fold(log(every("schedule-1"), cron("schedule-2")))
    batch = due_decision(state, now)
    assert isinstance(batch, DispatchBatch)
    assert [r.id for r in batch.records] == ["schedule-1", "schedule-2"]
    plan = plan_dispatch(batch)
    assert [encode_change(c) for c in plan.changes] == [
        dispatch("schedule-1", format_instant(now)), dispatch("schedule-2", format_instant(now))]
    assert [p.occurrenceAt for p in plan.pairs] == [
        "2026-12-02T08:00:00.000Z", "2026-12-02T08:00:00.000Z"]
    waiting = due_decision(fold(log(cron("schedule-2"))), now - 1)
    assert waiting == Wait(until_ms=now)


# ---------------------------------------------------------------- logs an owner writes

PROPERTY = settings(deadline=None, max_examples=120)
RULES = [WEEKDAYS_9, "30 2 * * *", "*/5 * * * *", "0 0 29 2 *", "15 1,2,3 * * SUN",
         "0 9 1 * MON", "*/30 */3 31 * *", "0 12 * JAN,JUL 5-7", "45 23 * * *"]
ZONES = ["UTC", "Europe/Berlin", "Australia/Lord_Howe", "America/Santiago", "Pacific/Apia",
         "America/New_York", "Asia/Tehran", "Europe/Dublin"]


@dataclass
class Owner:
    """The tool and the live owner writing one log, as the real ones do."""

    now: int

    def __post_init__(self) -> None:
        self.events: list[Event] = []
        self.state = EMPTY
        self.occurrences: dict[int, int] = {}
        self.plans: dict[tuple[int, ...], Any] = {}

    def append(self, data: Any) -> int:
        event = Event(type=SCHEDULE_CHANGE, seq=len(self.events), time=self.now, data=data)
        self.state = check_candidate(self.state, [event])
        self.events.append(event)
        return event.seq

    def create(self, kind: str, rule: str, zone: str, seconds: int) -> None:
        sid = allocate_id(self.state)
        if kind == "every":
            if self.now + seconds * 1000 <= MAX_MS:
                self.append(every(sid, format_instant(self.now + seconds * 1000), seconds))
            return
        target = next_after(parse_rule(rule), load_zone(zone), self.now)
        if target is not None:
            self.append(cron(sid, format_instant(target), rule, zone))

    def wake(self) -> None:
        while not isinstance(decision := due_decision(self.state, self.now), Wait):
            plan = plan_dispatch(decision)
            first = len(self.events)
            records = [decision.record] if isinstance(decision, DispatchOne) else decision.records
            for record in records:
                seq = self.append(encode_change(DispatchChange(
                    id=record.id, acceptedAt=format_instant(self.now))))
                if isinstance(record, CronSchedule):
                    latest = latest_at_or_before(
                        parse_rule(record.cron), load_zone(record.timeZone), self.now)
                    assert latest is not None
                    self.occurrences[seq] = latest
            self.plans[tuple(range(first, len(self.events)))] = plan


steps = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(["cron", "cron", "every"]),
              st.sampled_from(RULES), st.sampled_from(ZONES), st.integers(300, 7200)),
    st.tuples(st.just("wait"), st.integers(0, 40 * 86_400_000) | st.sampled_from([299_999])),
    st.tuples(st.just("wake")),
    st.tuples(st.just("sleep"), st.sampled_from([0, 1, 299_999]) | st.integers(0, 9 * 86_400_000)),
    st.tuples(st.just("sleep"), st.integers(0, 1000)),
    st.tuples(st.just("delete"), st.integers(0, 9)),
)


@st.composite
def owners(draw: st.DrawFn) -> Owner:
    start = draw(st.sampled_from([parse_instant(T), parse_instant("2027-03-27T23:00:00.000Z")])
                 | st.integers(0, 4_000_000_000_000))
    owner = Owner(now=start)
    # the owner always ends by sleeping through a few decision times
    tail = [("sleep", 0), ("sleep", draw(st.integers(0, 86_400_000))), ("sleep", 0)]
    for step in [*draw(st.lists(steps, min_size=3, max_size=30)), *tail]:
        match step:
            case ("create", kind, rule, zone, seconds):
                owner.create(kind, rule, zone, seconds)
            case ("wait", delta):
                owner.now = min(owner.now + delta, MAX_MS)
            case ("wake",):
                owner.wake()
            case ("sleep", lateness):
                # wake at the next decision time, a little or a lot late
                until = next_wake_ms(owner.state, owner.now)
                if until is not None:
                    owner.now = max(owner.now, min(until + lateness, MAX_MS))
                owner.wake()
            case ("delete", pick) if owner.state.active:
                sid = owner.state.active[pick % len(owner.state.active)].id
                owner.append({"version": 1, "operation": "delete", "id": sid})
    return owner


@PROPERTY
@given(owners(), st.data())
def test_an_owners_log_folds_and_continues_at_any_cut(owner: Owner, data: st.DataObject) -> None:
    assert fold(owner.events) == owner.state
    cut = data.draw(st.integers(0, len(owner.events)))
    assert fold_events(fold(owner.events[:cut]), owner.events[cut:]) == owner.state
    # every record round-trips through a log line unchanged, and only cron creates are v2
    for event in owner.events:
        line = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
        assert json.dumps(encode_change(decode_change(json.loads(line))),
                          ensure_ascii=False, separators=(",", ":")) == line
        kind = event.data.get("schedule", {}).get("kind")
        assert event.data["version"] == (2 if kind == "cron" else 1)


@PROPERTY
@given(owners())
def test_each_cron_dispatch_delivers_the_latest_occurrence_then_the_next(owner: Owner) -> None:
    state = EMPTY
    for event in owner.events:
        before, state = state, fold_events(state, [event])
        change = decode_change(event.data)
        if not isinstance(change, DispatchChange):
            continue
        record = before.find(change.id)
        if not isinstance(record, CronSchedule):
            continue
        assert change.acceptedAt is not None
        accepted = parse_instant(change.acceptedAt)
        rule, zone = parse_rule(record.cron), load_zone(record.timeZone)
        occurrence = owner.occurrences[event.seq]
        # the occurrence is the target or later, not after the acceptance, and no
        # occurrence lies between it and the acceptance
        assert parse_instant(record.scheduledAt) <= occurrence <= accepted
        following = next_after(rule, zone, occurrence)
        assert following is None or following > accepted
        after = state.find(change.id)
        expected = next_after(rule, zone, accepted)
        assert (after is None) == (expected is None)
        if after is not None:
            assert parse_instant(after.scheduledAt) == expected


@PROPERTY
@given(owners())
def test_receipts_frames_and_the_ledger_agree_with_what_the_owner_planned(owner: Owner) -> None:
    for seq, occurrence in owner.occurrences.items():
        presentation = reminder_presentation(owner.events, seq, 0)
        assert presentation is not None
        assert presentation.occurrenceAt == format_instant(occurrence)
    session = Session(header=SessionHeader(id="s1", createdAt=0), events=tuple(owner.events))
    ledger = Ledger(0).extend(owner.events)
    groups = ledger.view().undelivered()
    assert [g.seqs for g in groups] == list(owner.plans)
    for group in groups:
        plan = owner.plans[group.seqs]
        assert frame_from_log(session, group) == plan.text
        assert pending_frame(ledger.view(), group) == plan.text
        assert group.pairs == plan.pairs
    assert ledger.state() == owner.state


@PROPERTY
@given(owners(), st.integers(-86_400_000, 86_400_000))
def test_a_decision_never_dispatches_early_and_a_view_names_every_rule(
    owner: Owner, offset: int
) -> None:
    now = max(0, min(MAX_MS, owner.now + offset))
    targets = {r.id: parse_instant(r.scheduledAt) for r in owner.state.active}
    decision = due_decision(owner.state, now)
    if isinstance(decision, DispatchBatch):
        assert all(targets[r.id] <= now for r in decision.records)
        last = owner.state.last_batch_ms
        assert last is None or now >= last + 300_000
    elif isinstance(decision, Wait):
        assert decision.until_ms is None or decision.until_ms > now
    for view, record in zip(list_value(owner.state, now), owner.state.active, strict=True):
        if isinstance(record, CronSchedule):
            assert (view["cron"], view["timeZone"]) == (record.cron, record.timeZone)
