"""The lifecycle's deciders against a brute-force reference model
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders).

Random sequences of tool calls (create with end conditions, update: prompt, timing, pause,
resume, until, count; delete) go through the same pure functions the tools call
(``parse_create_args``/``build_create`` with the cap, ``parse_update_args``/
``decide_update``), and late wakes through ``due_decision``/``plan_dispatch``. The model,
written here, steps occurrences by interval for ``every`` and minute by minute for ``cron``:
the fold must equal it, every answer code must be the one it expects, and no dispatch may
come before its target, while paused, or after the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.dispatch import plan_dispatch
from dsh_schedule.shared.core.due import Wait, due_decision
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    RECURRING_TYPES,
    Change,
    DeleteChange,
    EverySchedule,
    create_change,
    encode_change,
)
from dsh_schedule.shared.core.requests import build_create, parse_create_args
from dsh_schedule.shared.core.update_requests import decide_update, parse_update_args

T0 = parse_instant("2026-12-01T12:00:00.000Z")
MIN = 60_000
GAP = 300_000
CAP = 4
LIMIT = 32 * 1024


def utc() -> str:
    return "UTC"


@dataclass
class Ref:
    """The model of one active record."""

    kind: str  # after, at, every, cron
    target: int
    period: int = 0  # every: ms
    step: int = 0  # cron "*/step * * * *" in UTC: minutes
    paused: bool = False
    until: int | None = None
    count: int | None = None
    delivered: int = 0
    prompt: str = "p"

    @property
    def recurring(self) -> bool:
        return self.kind in ("every", "cron")

    def is_occurrence(self, t: int) -> bool:
        if self.kind == "every":
            return t >= self.target and (t - self.target) % self.period == 0
        return t % MIN == 0 and (t // MIN) % self.step == 0

    def next_after(self, t: int) -> int:
        """The first occurrence strictly after ``t``, by stepping."""
        if self.kind == "every":
            n = self.target
            while n <= t:
                n += self.period
            return n
        m = t // MIN * MIN + MIN
        while not self.is_occurrence(m):
            m += MIN
        return m

    def latest_up_to(self, t: int) -> int:
        """The latest occurrence in ``[target, t]``, by stepping forward from the target."""
        n = self.target
        while (following := self.next_after(n)) <= t:
            n = following
        return n


@dataclass
class Model:
    now: int = T0
    refs: dict[str, Ref] = field(default_factory=dict)
    created: int = 0
    last_batch: int | None = None
    events: list[Event] = field(default_factory=list)

    def write(self, change: Change) -> None:
        self.events.append(Event(type=SCHEDULE_CHANGE, seq=len(self.events), time=self.now,
                                 data=encode_change(change)))


KINDS = st.sampled_from(["after", "at", "every", "cron"])
OPS = st.lists(st.one_of(
    st.tuples(st.just("create"), KINDS, st.integers(1, 30), st.one_of(st.none(), st.integers(1, 4)),
              st.one_of(st.none(), st.integers(0, 90))),
    st.tuples(st.sampled_from(["pause", "resume", "prompt", "delete"]), st.integers(0, 9)),
    st.tuples(st.just("retime"), st.integers(0, 9), KINDS, st.integers(1, 30)),
    st.tuples(st.sampled_from(["until", "count"]), st.integers(0, 9), st.integers(0, 90)),
    st.tuples(st.just("wait"), st.integers(1, 5400)),
), min_size=1, max_size=30)


@settings(max_examples=250, deadline=None)
@given(OPS)
def test_the_deciders_and_the_fold_agree_with_the_model(ops: list[tuple[Any, ...]]) -> None:
    model = Model()
    for op in ops:
        ids = sorted(model.refs)
        if op[0] == "create":
            _create(model, *op[1:])
        elif op[0] == "wait":
            model.now += op[1] * 1000
            _wake(model)  # one wake, however late
        elif ids:
            sid = ids[op[1] % len(ids)]
            if op[0] == "delete":
                model.write(DeleteChange(id=sid))
                del model.refs[sid]
            else:
                _update(model, sid, op)
        _compare(model)
    for _ in range(40):  # then time runs on, a wake every few minutes
        model.now += 7 * MIN
        _wake(model)
        _compare(model)


def _selector(kind: str, amount: int) -> dict[str, Any]:
    if kind == "after":
        return {"after_seconds": amount * 60}
    if kind == "at":
        return {"at": format_instant(T0 + 10**9 + amount * MIN).replace(".000Z", "Z")}
    if kind == "every":
        return {"every_seconds": 300 + 60 * (amount % 10)}
    return {"cron": {"expression": f"*/{(5, 10, 15)[amount % 3]} * * * *", "time_zone": "UTC"}}


def _timing(kind: str, amount: int, now: int) -> Ref:
    """The model's record of a selector given at ``now``."""
    if kind == "after":
        return Ref(kind="after", target=now + amount * MIN)
    if kind == "at":
        return Ref(kind="at", target=T0 + 10**9 + amount * MIN)
    if kind == "every":
        period = (300 + 60 * (amount % 10)) * 1000
        return Ref(kind="every", target=now + period, period=period)
    ref = Ref(kind="cron", target=0, step=(5, 10, 15)[amount % 3])
    ref.target = ref.next_after(now)
    return ref


def _expect(code: str | None, call: Any) -> Any:
    try:
        result = call()
    except ToolError as err:
        assert err.code == code, (err.code, err.message)
        return None
    assert code is None, f"expected {code}"
    return result


def _create(model: Model, kind: str, amount: int, count: int | None,
            until_minutes: int | None) -> None:
    args: dict[str, Any] = {"prompt": "p", **_selector(kind, amount)}
    if count is not None:
        args["count"] = count
    ref = _timing(kind, amount, model.now)
    until = None
    if until_minutes is not None:
        until = model.now + until_minutes * MIN + 1000
        args["until"] = format_instant(until)
    code = None
    # shape errors first (before the queue), then the cap, then what needs the time
    if (count is not None or until is not None) and not ref.recurring:
        code = "invalid_rule"
    elif len(model.refs) >= CAP:
        code = "limit_exceeded"
    elif until is not None and until < ref.target:
        code = "invalid_rule"

    def call() -> Any:
        request = parse_create_args(args, max_prompt_bytes=LIMIT, calendar=True, lifecycle=True)
        return build_create(request, fold(model.events), model.now, utc, max_active=CAP)

    change = _expect(code, call)
    if change is None:
        return
    model.created += 1
    ref.until, ref.count = until, count
    model.refs[change.schedule.id] = ref
    assert change.schedule.id == f"schedule-{model.created}"
    model.write(change)


def _update(model: Model, sid: str, op: tuple[Any, ...]) -> None:
    ref = model.refs[sid]
    args: dict[str, Any] = {"id": sid}
    new = Ref(**vars(ref))
    code: str | None = None
    if op[0] == "pause":
        args["paused"] = True
        new.paused = True
    elif op[0] == "resume":
        args["paused"] = False
        new.paused = False
        if ref.paused and ref.recurring and ref.target <= model.now:
            new.target = ref.next_after(model.now)
            if new.until is not None and new.target > new.until:
                code = "invalid_rule"  # its end passed while paused
    elif op[0] == "prompt":
        args["prompt"] = ref.prompt + "!"
        new.prompt = args["prompt"]
    elif op[0] == "retime":
        kind, amount = op[2], op[3]
        args.update(_selector(kind, amount))
        timing = _timing(kind, amount, model.now)
        new.kind, new.target, new.period, new.step = (
            timing.kind, timing.target, timing.period, timing.step)
        if not new.recurring:
            new.until, new.count, new.delivered = None, None, 0
        elif not ref.recurring:
            new.delivered = 0
        if new.until is not None and new.until < new.target:
            code = "invalid_rule"
    elif op[0] == "until":
        new.until = model.now + op[2] * MIN + 1000
        args["until"] = format_instant(new.until)
        if not ref.recurring or new.until < ref.target:
            code = "invalid_rule"
    else:
        new.count = op[2] % 6 + 1
        args["count"] = new.count
        if not ref.recurring or (new.count != ref.count and new.count <= ref.delivered):
            code = "invalid_rule"

    def call() -> Any:
        request = parse_update_args(args, max_prompt_bytes=LIMIT, calendar=True)
        return decide_update(request, fold(model.events), model.now, utc)

    decision = _expect(code, call)
    if decision is None:
        return
    record, change = decision
    if change is not None:
        model.write(change)
    model.refs[sid] = new
    assert fold(model.events).find(sid) == record


def _wake(model: Model) -> None:
    """Everything the due decision sends at ``now``, checked against the model."""
    while not isinstance(decision := due_decision(fold(model.events), model.now), Wait):
        plan = plan_dispatch(decision)
        for change, pair in zip(plan.changes, plan.pairs, strict=True):
            _check_dispatch(model, change.id, parse_instant(pair.occurrenceAt), change.acceptedAt)
            model.write(change)
    # nothing the model says is due is left waiting, but for the recurring gate
    for sid, ref in model.refs.items():
        if ref.paused or ref.target > model.now:
            continue
        assert ref.recurring, f"{sid} is due and was not sent"
        assert model.last_batch is not None and model.now < model.last_batch + GAP


def _check_dispatch(model: Model, sid: str, occurrence: int, accepted: str | None) -> None:
    ref = model.refs[sid]
    assert not ref.paused, "a dispatch while paused"
    assert ref.target <= model.now, "a dispatch before its target"
    if not ref.recurring:
        assert (occurrence, accepted) == (ref.target, None)
        del model.refs[sid]
        return
    assert accepted == format_instant(model.now)
    model.last_batch = model.now
    assert ref.count is None or ref.delivered < ref.count, "a dispatch after the count"
    limit = model.now if ref.until is None else min(model.now, ref.until)
    assert occurrence == ref.latest_up_to(limit)
    assert ref.until is None or occurrence <= ref.until, "a dispatch after until"
    ref.delivered += 1
    following = ref.next_after(occurrence)
    if (ref.count is not None and ref.delivered >= ref.count) or (
            ref.until is not None and following > ref.until):
        del model.refs[sid]
    else:
        ref.target = following


def _compare(model: Model) -> None:
    got = {}
    for r in fold(model.events).active:
        recurring = isinstance(r, RECURRING_TYPES)
        got[r.id] = (r.kind, r.scheduledAt, r.paused, r.prompt,
                     r.deliveredCount if recurring else 0,
                     r.until if recurring else None, r.count if recurring else None)
    want = {sid: (r.kind, format_instant(r.target), r.paused, r.prompt, r.delivered,
                  None if r.until is None else format_instant(r.until), r.count)
            for sid, r in model.refs.items()}
    assert got == want


def test_a_late_wake_past_until_delivers_the_last_occurrence_and_ends() -> None:
    record = EverySchedule(id="schedule-1", prompt="p", everySeconds=600,
                           scheduledAt=format_instant(T0), until=format_instant(T0 + 1000_000))
    events = [Event(type=SCHEDULE_CHANGE, seq=0, time=0, data=encode_change(create_change(record)))]
    # given a wake long after until (occurrences T0 and T0+600 s; until at T0+1000 s)
    decision = due_decision(fold(events), T0 + 3_600_000)
    plan = plan_dispatch(decision)
    # then it delivers T0+600 s, not T0+3600 s, and the record has ended
    assert [p.occurrenceAt for p in plan.pairs] == [format_instant(T0 + 600_000)]
    events.append(Event(type=SCHEDULE_CHANGE, seq=1, time=0,
                        data=encode_change(plan.changes[0])))
    assert fold(events).active == ()
