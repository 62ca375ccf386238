"""The lifecycle's pure core (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders):
the version-2 ``update`` record and end conditions, strict replay, the fold, the due
decision, views and receipts, and a property test against a reference model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.dispatch import plan_dispatch
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.fold import fold, fold_events
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.lifecycle import resume_target_ms
from dsh_schedule.shared.core.presentation import reminder_presentation
from dsh_schedule.shared.core.records import (
    Change,
    CreateChange,
    CronSchedule,
    DeleteChange,
    EverySchedule,
    UpdateChange,
    create_change,
    decode_change,
    encode_change,
)
from dsh_schedule.shared.core.views import list_value

T = "2026-12-01T12:00:00.000Z"
MIN = 60_000


def ms(text: str) -> int:
    return parse_instant(text)


def plus(text: str, seconds: int) -> str:
    return format_instant(ms(text) + seconds * 1000)


def every(sid: str, first: str = T, seconds: int = 300, **ends: Any) -> dict[str, Any]:
    schedule = {"id": sid, "kind": "every", "prompt": "check", "everySeconds": seconds,
                "scheduledAt": first, **ends}
    return {"version": 2 if ends else 1, "operation": "create", "schedule": schedule}


def at(sid: str, when: str = T) -> dict[str, Any]:
    return {"version": 1, "operation": "create",
            "schedule": {"id": sid, "kind": "at", "prompt": "call", "scheduledAt": when}}


def update(sid: str, **fields: Any) -> dict[str, Any]:
    return {"version": 2, "operation": "update", "id": sid, **fields}


def dispatch(sid: str, accepted: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"version": 1, "operation": "dispatch", "id": sid}
    if accepted is not None:
        data["acceptedAt"] = accepted
    return data


def log(*items: dict[str, Any]) -> list[Event]:
    return [Event(type=SCHEDULE_CHANGE, seq=n, time=n, data=d) for n, d in enumerate(items)]


# -- records -------------------------------------------------------------------------------


def test_an_update_round_trips_with_only_what_it_carries() -> None:
    data = update("schedule-1", prompt="new", kind="every", everySeconds=600,
                  scheduledAt=plus(T, 600), paused=True, until=plus(T, 6000), count=3)
    change = decode_change(data)
    assert isinstance(change, UpdateChange)
    assert encode_change(change) == data
    assert list(encode_change(UpdateChange(id="schedule-1", paused=False))) == [
        "version", "operation", "id", "paused"]


def test_a_create_with_an_end_condition_is_version_2_and_others_are_unchanged() -> None:
    bounded = EverySchedule(id="schedule-1", prompt="p", everySeconds=300, scheduledAt=T, count=3)
    assert encode_change(create_change(bounded)) == every("schedule-1", count=3) | {
        "schedule": every("schedule-1", count=3)["schedule"] | {"prompt": "p"}}
    plain = EverySchedule(id="schedule-1", prompt="check", everySeconds=300, scheduledAt=T)
    assert encode_change(create_change(plain)) == every("schedule-1")
    assert list(encode_change(create_change(plain))["schedule"]) == [
        "id", "kind", "prompt", "everySeconds", "scheduledAt"]


REJECTED_RECORDS = [
    pytest.param(update("schedule-1"), id="an update with no change"),
    pytest.param(update("schedule-1", paused=True, extra=1), id="an extra field"),
    pytest.param(update("schedule-1", prompt=None), id="a null field"),
    pytest.param(update("schedule-1", prompt=" padded"), id="an untrimmed prompt"),
    pytest.param(update("schedule-1", kind="every", everySeconds=300), id="timing without target"),
    pytest.param(update("schedule-1", kind="every", scheduledAt=T), id="every without seconds"),
    pytest.param(update("schedule-1", kind="at", afterSeconds=5, scheduledAt=T),
                 id="another kind's field"),
    pytest.param(update("schedule-1", scheduledAt=T), id="a target without timing or resume"),
    pytest.param(update("schedule-1", until="2026-12-01T12:00:00Z"), id="non-canonical until"),
    pytest.param(update("schedule-1", count=0), id="count below one"),
    pytest.param({**update("schedule-1", paused=True), "version": 1}, id="a version-1 update"),
    pytest.param(every("schedule-1") | {"version": 2}, id="a version-2 every without an end"),
    pytest.param({"version": 1, "operation": "create", "schedule": every(
        "schedule-1", count=2)["schedule"]}, id="a version-1 create with count"),
    pytest.param(every("schedule-1", paused=True), id="a create carrying paused"),
    pytest.param(every("schedule-1", until=plus(T, -1)), id="until before the first target"),
]


@pytest.mark.parametrize("data", REJECTED_RECORDS)
def test_malformed_lifecycle_records_are_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(ScheduleLogError):
        decode_change(data)


REPLAY_REJECTIONS = [
    pytest.param([update("schedule-1", paused=True)], "inactive", id="an unknown id"),
    pytest.param([at("schedule-1"), dispatch("schedule-1"), update("schedule-1", paused=True)],
                 "inactive", id="an ended record"),
    pytest.param([at("schedule-1"), update("schedule-1", prompt="call")], "unchanged",
                 id="the same prompt"),
    pytest.param([at("schedule-1"), update("schedule-1", paused=False)], "unchanged",
                 id="resuming a running record"),
    pytest.param([at("schedule-1"), update("schedule-1", kind="at", scheduledAt=T)], "unchanged",
                 id="the same timing"),
    pytest.param([every("schedule-1", until=plus(T, 900)),
                  update("schedule-1", until=plus(T, 900))], "unchanged", id="the same until"),
    pytest.param([every("schedule-1", first=plus(T, 600)), update("schedule-1", until=T)],
                 "before", id="until before the current target"),
    pytest.param([at("schedule-1"), update("schedule-1", count=2)], "one-shot",
                 id="an end condition on a one-shot"),
    pytest.param([every("schedule-1"), dispatch("schedule-1", T),
                  update("schedule-1", count=1)], "deliveries", id="count already reached"),
    pytest.param([every("schedule-1"), update("schedule-1", paused=True),
                  dispatch("schedule-1", T)], "paused", id="a dispatch while paused"),
    pytest.param([at("schedule-1"), update("schedule-1", paused=True),
                  dispatch("schedule-1")], "paused", id="a one-shot dispatch while paused"),
    pytest.param([every("schedule-1"), update("schedule-1", paused=True),
                  update("schedule-1", paused=False, scheduledAt=plus(T, 400))], "occurrences",
                 id="a resume off the anchor"),
    pytest.param([every("schedule-1"), update("schedule-1", paused=False, scheduledAt=plus(
        T, 600))], "unchanged", id="moving the target of a running record"),
    pytest.param([every("schedule-1", count=2), dispatch("schedule-1", T),
                  dispatch("schedule-1", plus(T, 300)), update("schedule-1", paused=True)],
                 "inactive", id="a record its count ended"),
]


@pytest.mark.parametrize(("items", "reason"), REPLAY_REJECTIONS)
def test_replay_rejects_an_update_that_breaks_a_rule(items: list[dict[str, Any]],
                                                     reason: str) -> None:
    with pytest.raises(ScheduleLogError, match=reason) as caught:
        fold(log(*items))
    assert caught.value.seq == len(items) - 1


# -- fold, due decision, views -------------------------------------------------------------


def test_a_paused_record_never_fires_nor_joins_a_batch_and_shows_paused() -> None:
    state = fold(log(every("schedule-1"), every("schedule-2"),
                     update("schedule-1", paused=True)))
    decision = due_decision(state, ms(T) + 5 * MIN)
    assert isinstance(decision, DispatchBatch)
    assert [r.id for r in decision.records] == ["schedule-2"]
    assert [v["state"] for v in list_value(state, ms(T) + 5 * MIN)] == ["paused", "overdue"]
    paused_only = fold(log(at("schedule-1"), update("schedule-1", paused=True)))
    assert due_decision(paused_only, ms(T) + MIN) == Wait(until_ms=None)


def test_a_recurring_record_resumes_on_its_first_future_aligned_target() -> None:
    state = fold(log(every("schedule-1"), update("schedule-1", paused=True)))
    record = state.active[0]
    now = ms(T) + 1000 * 1000  # 1000 s later: targets T+300k; the next after now is T+1200
    assert resume_target_ms(record, now) == ms(plus(T, 1200))
    resumed = fold_events(state, [Event(type=SCHEDULE_CHANGE, seq=2, time=2, data=update(
        "schedule-1", paused=False, scheduledAt=plus(T, 1200)))])
    assert due_decision(resumed, now) == Wait(until_ms=ms(plus(T, 1200)))


def test_a_one_shot_whose_target_passed_while_paused_is_overdue_once() -> None:
    items = [at("schedule-1"), update("schedule-1", paused=True)]
    now = ms(T) + 60 * MIN
    assert resume_target_ms(fold(log(*items)).active[0], now) == ms(T)
    state = fold(log(*items, update("schedule-1", paused=False)))
    assert list_value(state, now)[0]["state"] == "overdue"
    decision = due_decision(state, now)
    assert isinstance(decision, DispatchOne)
    resumed = log(*items, update("schedule-1", paused=False), dispatch("schedule-1"))
    assert fold(resumed).active == ()


def test_count_ends_the_record_after_the_dispatch_reaching_it() -> None:
    items = [every("schedule-1", count=2), dispatch("schedule-1", T)]
    view = list_value(fold(log(*items)), ms(T))[0]
    assert (view["count"], view["deliveredCount"]) == (2, 1)
    assert list(view)[4:8] == ["scheduledAt", "count", "deliveredCount", "state"]
    assert fold(log(*items, dispatch("schedule-1", plus(T, 300)))).active == ()


def test_until_ends_the_record_when_the_next_target_would_pass_it() -> None:
    items = [every("schedule-1", until=plus(T, 600)), dispatch("schedule-1", T)]
    assert list_value(fold(log(*items)), ms(T))[0]["until"] == plus(T, 600)
    assert fold(log(*items, dispatch("schedule-1", plus(T, 300)))).active[0].scheduledAt == plus(
        T, 600)
    ended = log(*items, dispatch("schedule-1", plus(T, 300)), dispatch("schedule-1", plus(T, 600)))
    assert fold(ended).active == ()


def test_a_timing_change_keeps_the_id_and_pause_and_only_a_prompt_change_keeps_the_timing() -> None:
    state = fold(log(every("schedule-1"), update("schedule-1", paused=True),
                     update("schedule-1", kind="at", scheduledAt=plus(T, 60))))
    record = state.active[0]
    assert (record.id, record.kind, record.scheduledAt, record.paused) == (
        "schedule-1", "at", plus(T, 60), True)
    prompt_only = fold(log(every("schedule-1"), update("schedule-1", prompt="new"))).active[0]
    assert (prompt_only.prompt, prompt_only.scheduledAt) == ("new", T)


def test_a_cron_resume_lands_on_the_rules_next_occurrence() -> None:
    record = CronSchedule(id="schedule-1", prompt="p", cron="*/15 * * * *", timeZone="UTC",
                          scheduledAt=T, paused=True)
    assert resume_target_ms(record, ms(T) + 20 * MIN) == ms(T) + 30 * MIN


def test_delivery_not_before_reads_updates() -> None:
    # given a batch at T, a record retimed by an update to T + 1 min, and one paused
    # while its target passed
    events = log(every("schedule-1"), every("schedule-2", first=plus(T, 600)),
                 dispatch("schedule-1", T),
                 update("schedule-2", kind="every", everySeconds=300, scheduledAt=plus(T, 60)),
                 every("schedule-3", first=plus(T, 30)), update("schedule-3", paused=True))
    # when listed at T + 2 min
    views = list_value(fold(events), ms(T) + 120_000)
    # then the retimed record is overdue and held back until the gate opens; the paused one
    # is not held back (it is not due at all)
    assert [v["state"] for v in views] == ["scheduled", "overdue", "paused"]
    assert views[1]["deliveryNotBefore"] == plus(T, 300)
    assert "deliveryNotBefore" not in views[2]


def test_a_receipt_shows_the_prompt_in_force_at_its_dispatch() -> None:
    events = log(every("schedule-1"), dispatch("schedule-1", T),
                 update("schedule-1", prompt="edited"), dispatch("schedule-1", plus(T, 300)))
    first = reminder_presentation(events, 1, 0)
    second = reminder_presentation(events, 3, 0)
    assert first is not None and second is not None
    assert (first.prompt, second.prompt) == ("check", "edited")
    assert second.occurrenceAt == plus(T, 300)


# -- the property test against a reference model ------------------------------------------


@dataclass
class Ref:
    """The reference's own picture of one record."""

    kind: str
    target: int
    period: int = 0  # ms for every
    step: int = 0  # minutes for a cron */step rule in UTC
    paused: bool = False
    count: int | None = None
    until: int | None = None
    delivered: int = 0
    prompt: str = "p"

    def next_after(self, t: int) -> int:
        """The first occurrence strictly after ``t``: by interval, or minute by minute."""
        if self.kind == "every":
            n = self.target
            while n <= t:
                n += self.period
            return n
        m = t // MIN * MIN + MIN
        while (m // MIN) % self.step:
            m += MIN
        return m

    def latest_at_or_before(self, t: int) -> int:
        if self.kind == "every":
            n = self.target
            while n + self.period <= t:
                n += self.period
            return n
        m = t // MIN * MIN
        while (m // MIN) % self.step:
            m -= MIN
        return max(m, self.target)


@dataclass
class Sim:
    now: int
    events: list[Event] = field(default_factory=list)
    refs: dict[str, Ref] = field(default_factory=dict)
    created: int = 0

    def write(self, change: Change) -> None:
        self.events.append(Event(type=SCHEDULE_CHANGE, seq=len(self.events), time=self.now,
                                 data=encode_change(change)))


OPS = st.lists(st.tuples(
    st.sampled_from(["create", "pause", "resume", "prompt", "retime", "delete", "until", "wait"]),
    st.integers(0, 5), st.integers(1, 40), st.sampled_from(["at", "every", "cron"]),
    st.one_of(st.none(), st.integers(1, 4))), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_the_fold_agrees_with_a_reference_model(ops: list[tuple[Any, ...]]) -> None:
    sim = Sim(now=ms(T))
    for op, pick, amount, kind, count in ops:
        ids = sorted(sim.refs)
        sid = ids[pick % len(ids)] if ids else None
        state = fold(sim.events)
        if op == "create":
            sim.created += 1
            sid = f"schedule-{sim.created}"
            _create(sim, sid, kind, amount, count)
        elif sid is None:
            pass
        elif op == "pause" and not sim.refs[sid].paused:
            sim.write(UpdateChange(id=sid, paused=True))
            sim.refs[sid].paused = True
        elif op == "resume" and sim.refs[sid].paused:
            _resume(sim, sid, state)
        elif op == "prompt":
            sim.refs[sid].prompt += "!"
            sim.write(UpdateChange(id=sid, prompt=sim.refs[sid].prompt))
        elif op == "retime" and sim.refs[sid].kind == "every":
            ref = sim.refs[sid]
            target = sim.now + amount * MIN
            until = None if ref.until is None or ref.until >= target else format_instant(target)
            sim.write(UpdateChange(id=sid, kind="every", everySeconds=300 + 60 * pick,
                                   scheduledAt=format_instant(target), until=until))
            ref.target, ref.period = target, (300 + 60 * pick) * 1000
            ref.until = ref.until if until is None else target
        elif op == "until" and sim.refs[sid].kind != "at":
            ref = sim.refs[sid]
            until = ref.target + amount * MIN
            if until != ref.until:
                sim.write(UpdateChange(id=sid, until=format_instant(until)))
                ref.until = until
        elif op == "delete":
            sim.write(DeleteChange(id=sid))
            del sim.refs[sid]
        elif op == "wait":
            _run_until(sim, sim.now + amount * 5 * MIN)
        _compare(sim)
    _run_until(sim, sim.now + 120 * MIN)
    _compare(sim)


def _create(sim: Sim, sid: str, kind: str, amount: int, count: int | None) -> None:
    target = sim.now + amount * MIN
    if kind == "at":
        sim.write(CreateChange(schedule=create_change_at(sid, target)))
        sim.refs[sid] = Ref(kind="at", target=target)
        return
    if kind == "every":
        schedule: Any = EverySchedule(id=sid, prompt="p", everySeconds=300 * (1 + amount % 3),
                                      scheduledAt=format_instant(target), count=count)
        sim.refs[sid] = Ref(kind="every", target=target, period=schedule.everySeconds * 1000,
                            count=count)
    else:
        step = (5, 10, 15)[amount % 3]
        ref = Ref(kind="cron", target=0, step=step, count=count)
        ref.target = ref.next_after(sim.now)
        schedule = CronSchedule(id=sid, prompt="p", cron=f"*/{step} * * * *", timeZone="UTC",
                                scheduledAt=format_instant(ref.target), count=count)
        sim.refs[sid] = ref
    sim.write(create_change(schedule))


def create_change_at(sid: str, target: int) -> Any:
    from dsh_schedule.shared.core.records import AtSchedule
    return AtSchedule(id=sid, prompt="p", scheduledAt=format_instant(target))


def _resume(sim: Sim, sid: str, state: Any) -> None:
    ref = sim.refs[sid]
    record = next(r for r in state.active if r.id == sid)
    moved = resume_target_ms(record, sim.now)
    expected = ref.target if ref.kind == "at" or ref.target > sim.now else ref.next_after(sim.now)
    assert moved == expected
    ref.paused = False
    if expected > ref.target and ref.until is not None and expected > ref.until:
        sim.write(DeleteChange(id=sid))  # its end passed while paused: the driver ends it
        del sim.refs[sid]
        return
    if expected != ref.target:
        sim.write(UpdateChange(id=sid, paused=False, scheduledAt=format_instant(expected)))
        ref.target = expected
    else:
        sim.write(UpdateChange(id=sid, paused=False))


def _run_until(sim: Sim, end: int) -> None:
    """Advance minute by minute, dispatching whatever the due decision asks for."""
    while sim.now < end:
        sim.now += MIN
        while not isinstance(decision := due_decision(fold(sim.events), sim.now), Wait):
            plan = plan_dispatch(decision)
            for change, pair in zip(plan.changes, plan.pairs, strict=True):
                _check_dispatch(sim, change.id, ms(pair.occurrenceAt), change.acceptedAt)
                sim.write(change)


def _check_dispatch(sim: Sim, sid: str, occurrence: int, accepted: str | None) -> None:
    ref = sim.refs[sid]
    assert not ref.paused, "a dispatch while paused"
    assert ref.target <= sim.now, "a dispatch before its target"
    assert ref.count is None or ref.delivered < ref.count, "a dispatch after the count"
    assert ref.until is None or occurrence <= ref.until, "a dispatch after until"
    if ref.kind == "at":
        assert (occurrence, accepted) == (ref.target, None)
        del sim.refs[sid]
        return
    assert accepted == format_instant(sim.now)
    assert occurrence == ref.latest_at_or_before(sim.now)
    ref.delivered += 1
    following = ref.next_after(sim.now)
    if (ref.count is not None and ref.delivered >= ref.count) or (
            ref.until is not None and following > ref.until):
        del sim.refs[sid]
    else:
        ref.target = following


def _compare(sim: Sim) -> None:
    state = fold(sim.events)
    got = {r.id: (r.scheduledAt, r.paused, r.prompt, getattr(r, "deliveredCount", 0))
           for r in state.active}
    want = {sid: (format_instant(r.target), r.paused, r.prompt, r.delivered)
            for sid, r in sim.refs.items()}
    assert got == want
