"""The algebra of the core (docs/architecture.md#replay-rules): round trips, fold
composition, anchor alignment, that every log an owner produces passes the invariant, and
that re-projection renders every frame the owner planned."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.dispatch import DispatchPlan, pending_frame, plan_dispatch
from dsh_schedule.shared.core.due import (
    DispatchBatch,
    DispatchOne,
    Wait,
    due_decision,
    next_wake_ms,
)
from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    USER_MESSAGE,
    Event,
    Session,
    SessionHeader,
)
from dsh_schedule.shared.core.fold import (
    EMPTY,
    FoldState,
    allocate_id,
    check_candidate,
    fold,
    fold_events,
)
from dsh_schedule.shared.core.instant import (
    MAX_MS,
    MAX_SAFE_INTEGER,
    MIN_MS,
    format_instant,
    parse_instant,
)
from dsh_schedule.shared.core.ledger import Ledger
from dsh_schedule.shared.core.presentation import reminder_presentation
from dsh_schedule.shared.core.records import (
    MAX_EVERY_SECONDS,
    MIN_EVERY_SECONDS,
    AfterSchedule,
    AtSchedule,
    Change,
    CreateChange,
    DeleteChange,
    DispatchChange,
    EverySchedule,
    decode_change,
    encode_change,
    js_trim,
)
from tests.core.test_dispatch import frame_from_log
from tests.core.test_presentation import own_batches

# Timing is for benchmarks, never a pass/fail threshold.
PROPERTY = settings(deadline=None, max_examples=150)

START_2026 = parse_instant("2026-12-01T12:00:00.000Z")

texts = (
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=30)
    | st.sampled_from(["\u0085edge\u001c", "\u001fx\u200b", "call \"Ana\"\n\ttoday"])
).map(js_trim).filter(bool)
ids = st.integers(1, 10**6).map(lambda n: f"schedule-{n}") | texts
instants = st.integers(MIN_MS, MAX_MS).map(format_instant)
schedules = st.one_of(
    st.builds(AfterSchedule, id=ids, prompt=texts,
              afterSeconds=st.integers(1, MAX_SAFE_INTEGER), scheduledAt=instants),
    st.builds(AtSchedule, id=ids, prompt=texts, scheduledAt=instants),
    st.builds(EverySchedule, id=ids, prompt=texts,
              everySeconds=st.integers(MIN_EVERY_SECONDS, MAX_EVERY_SECONDS),
              scheduledAt=instants),
)
changes: st.SearchStrategy[Change] = st.one_of(
    st.builds(CreateChange, schedule=schedules),
    st.builds(DeleteChange, id=ids),
    st.builds(DispatchChange, id=ids, acceptedAt=st.none()),
    st.builds(DispatchChange, id=ids, acceptedAt=instants),
)


@PROPERTY
@given(changes)
def test_decode_inverts_encode(change: Change) -> None:
    # given any valid record, when it goes through a JSON log line and back
    line = json.dumps(encode_change(change), ensure_ascii=False, separators=(",", ":"))
    decoded = decode_change(json.loads(line))

    # then it is the same record, and encodes to the same line again
    assert decoded == change
    assert decode_change(encode_change(change)) == change
    assert json.dumps(encode_change(decoded), ensure_ascii=False, separators=(",", ":")) == line


@PROPERTY
@given(st.integers(MIN_MS, MAX_MS))
def test_an_instant_renders_as_its_datetime_and_parses_back(ms: int) -> None:
    # given any instant of years 0001-9999, before the epoch or after it
    text = format_instant(ms)

    # then it is its datetime to the millisecond, and parses back to itself
    d = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert text == (f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:"
                    f"{d.second:02d}.{d.microsecond // 1000:03d}Z")
    assert parse_instant(text) == ms


@dataclass
class Owner:
    """A tool caller and live owner writing a log as the real ones do: decisions from the
    fold at a ``now`` that only moves forward, appends through the invariant."""

    now: int
    first_seq: int = 0
    events: list[Event] = field(default_factory=list)
    state: FoldState = EMPTY
    anchors: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (anchor, P ms)
    occurrences: dict[int, int] = field(default_factory=dict)  # dispatch seq -> occurrence
    plans: dict[tuple[int, ...], DispatchPlan] = field(default_factory=dict)  # by dispatch seqs

    def append(self, data: Any, event_type: str = SCHEDULE_CHANGE) -> int:
        seq = self.first_seq + len(self.events)
        event = Event(type=event_type, seq=seq, time=self.now, data=data)
        self.state = check_candidate(self.state, [event])
        self.events.append(event)
        return seq

    def create(self, kind: str, amount: int, prompt: str) -> None:
        sid = allocate_id(self.state)
        seconds = {"after": "afterSeconds", "every": "everySeconds"}
        target = self.now + (amount if kind == "at" else amount * 1000)
        if target > MAX_MS:
            return  # the tool answers time_out_of_range and appends nothing
        schedule: dict[str, Any] = {"id": sid, "kind": kind, "prompt": prompt}
        if kind in seconds:
            schedule[seconds[kind]] = amount
        schedule["scheduledAt"] = format_instant(target)
        self.append({"version": 1, "operation": "create", "schedule": schedule})
        if kind == "every":
            self.anchors[sid] = (target, amount * 1000)

    def delete(self, pick: int) -> None:
        if self.state.active:
            sid = self.state.active[pick % len(self.state.active)].id
            self.append({"version": 1, "operation": "delete", "id": sid})

    def wake(self) -> None:
        """The due transaction: dispatch until nothing is due at this ``now``."""
        while not isinstance(decision := due_decision(self.state, self.now), Wait):
            plan = plan_dispatch(decision)
            first = self.first_seq + len(self.events)
            if isinstance(decision, DispatchOne):
                record = decision.record
                seq = self.append({"version": 1, "operation": "dispatch", "id": record.id})
                self.occurrences[seq] = parse_instant(record.scheduledAt)
            else:
                accepted = format_instant(decision.accepted_ms)
                for every in decision.records:
                    seq = self.append(
                        {"version": 1, "operation": "dispatch", "id": every.id,
                         "acceptedAt": accepted}
                    )
                    anchor, period = self.anchors[every.id]
                    self.occurrences[seq] = anchor + (self.now - anchor) // period * period
            seqs = tuple(range(first, self.first_seq + len(self.events)))
            assert [encode_change(c) for c in plan.changes] == [
                self.events[s - self.first_seq].data for s in seqs
            ]
            self.plans[seqs] = plan

    def sleep(self, lateness: int) -> None:
        """Wake at the next decision time, ``lateness`` ms late (early when negative)."""
        until = next_wake_ms(self.state, self.now)
        if until is not None:
            self.now = max(self.now, min(until + lateness, MAX_MS))
        self.wake()

    def run(self, step: tuple[Any, ...]) -> None:
        match step:
            case ("wait", delta):
                self.now = min(self.now + delta, MAX_MS)
            case ("create", kind, amount, prompt):
                self.create(kind, amount, prompt)
            case ("burst", count, amount):
                for _ in range(count):
                    self.create("every", amount, "burst")
            case ("delete", pick):
                self.delete(pick)
            case ("wake",):
                self.wake()
            case ("sleep", lateness):
                self.sleep(lateness)
            case ("note",):
                self.append({"content": [{"type": "text", "text": "hi"}]}, USER_MESSAGE)


steps = st.one_of(
    st.tuples(st.just("wait"), st.sampled_from([0, 1, 299_999, 300_000])
              | st.integers(0, 3 * 3_600_000)),
    st.tuples(st.just("create"), st.just("after"), st.integers(1, 4 * 3600), texts),
    st.tuples(st.just("create"), st.just("at"), st.integers(1, 4 * 3_600_000), texts),
    st.tuples(st.just("create"), st.just("every"), st.integers(300, 3 * 3600), texts),
    st.tuples(st.just("create"), st.just("every"), st.sampled_from([300, 600, 3600]), texts),
    st.tuples(st.just("burst"), st.integers(2, 4), st.sampled_from([300, 600, 900])),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("wake")),
    st.tuples(st.just("sleep"), st.sampled_from([-1, 0, 1]) | st.integers(0, 3 * 3_600_000)),
    st.tuples(st.just("sleep"), st.integers(0, 1000)),
    st.tuples(st.just("note")),
)
starts = st.just(START_2026) | st.just(MAX_MS - 4 * 3_600_000) | st.integers(MIN_MS, MAX_MS)


@st.composite
def owners(draw: st.DrawFn, start: int | None = None, first_seq: int = 0) -> Owner:
    owner = Owner(now=draw(starts) if start is None else start, first_seq=first_seq)
    for step in draw(st.lists(steps, min_size=4, max_size=40)):
        owner.run(step)
    return owner


@PROPERTY
@given(owners())
def test_any_log_an_owner_produces_passes_the_invariant(owner: Owner) -> None:
    assert fold(owner.events) == owner.state


@PROPERTY
@given(owners(), st.data())
def test_folding_a_then_b_continues_the_fold_of_a(owner: Owner, data: st.DataObject) -> None:
    # given an owner's log cut anywhere
    cut = data.draw(st.integers(0, len(owner.events)))
    a, b = owner.events[:cut], owner.events[cut:]

    # when the fold of a is continued with b, then it is the fold of a + b
    assert fold_events(fold(a), b) == fold(a + b)


@PROPERTY
@given(owners())
def test_every_occurrence_is_anchor_aligned_and_not_after_its_accepted_at(owner: Owner) -> None:
    # given an owner's log, walked one event at a time
    state = EMPTY
    for event in owner.events:
        change = decode_change(event.data) if event.type == SCHEDULE_CHANGE else None
        before = state
        state = fold_events(state, [event])
        if not isinstance(change, DispatchChange) or change.acceptedAt is None:
            continue

        # when the fold derives the occurrence a recurring dispatch delivered
        record = before.find(change.id)
        assert isinstance(record, EverySchedule)
        accepted = parse_instant(change.acceptedAt)
        target = parse_instant(record.scheduledAt)
        occurrence = target + (accepted - target) // (record.everySeconds * 1000) * (
            record.everySeconds * 1000
        )

        # then it is anchor + k*P, not after acceptedAt, the latest such, and the record
        # moves on to the first strictly future aligned target (or ends past 9999)
        anchor, period = owner.anchors[change.id]
        assert (occurrence - anchor) % period == 0
        assert anchor <= target <= occurrence <= accepted < occurrence + period
        after = state.find(change.id)
        if after is None:
            assert occurrence + period > MAX_MS
        else:
            assert parse_instant(after.scheduledAt) == occurrence + period
        assert state.last_batch_ms == accepted


@PROPERTY
@given(owners())
def test_receipts_name_the_occurrence_each_dispatch_delivered(owner: Owner) -> None:
    # given an owner's log, when every dispatch is presented
    for seq, occurrence in owner.occurrences.items():
        presentation = reminder_presentation(owner.events, seq, 0)

        # then it names the occurrence the owner delivered
        assert presentation is not None
        assert presentation.occurrenceAt == format_instant(occurrence)
    for event in owner.events:
        if event.seq not in owner.occurrences:
            assert reminder_presentation(owner.events, event.seq, 0) is None

    # and the delivered batches cover every dispatch once, in log order
    batches = own_batches(owner.events, 0)
    assert [seq for batch in batches for seq in batch] == sorted(owner.occurrences)


@PROPERTY
@given(owners())
def test_re_projection_renders_every_frame_the_owner_planned(owner: Owner) -> None:
    # given an owner's log and the plan of each of its dispatches
    session = Session(header=SessionHeader(id="s1", createdAt=0), events=tuple(owner.events))

    # when the log's dispatch groups are read back and rendered
    ledger = Ledger(0).extend(owner.events)
    groups = ledger.view().undelivered()

    # then each is one planned dispatch, with the planned frame and pairs, rendered the
    # same from the log and from the prompts the ledger kept; the ledger's replay is the fold
    assert [g.seqs for g in groups] == list(owner.plans)
    for group in groups:
        plan = owner.plans[group.seqs]
        assert frame_from_log(session, group) == plan.text
        assert pending_frame(ledger.view(), group) == plan.text
        assert group.pairs == plan.pairs
    assert ledger.state() == owner.state


@PROPERTY
@given(owners(start=START_2026), st.data())
def test_a_fork_neither_inherits_nor_changes_its_parents_receipts(
    parent: Owner, data: st.DataObject
) -> None:
    # given a parent's log and a child forked from it that writes its own records
    seed_length = len(parent.events)
    child = data.draw(owners(start=parent.now, first_seq=seed_length))
    alone = Owner(now=parent.now)
    for event in child.events:
        alone.append(event.data, event.type)
    events = parent.events + child.events

    # when the child is folded and its dispatches presented
    state = fold(events, seed_length)

    # then it is as if the child were a fresh session; parent receipts stay the same
    assert state == fold(alone.events)
    for seq in parent.occurrences:
        assert reminder_presentation(events, seq, seed_length) == reminder_presentation(
            parent.events, seq, 0
        )
    for seq in child.occurrences:
        assert reminder_presentation(events, seq, seed_length) == reminder_presentation(
            alone.events, seq - seed_length, 0
        )
    assert own_batches(events, seed_length) == [
        tuple(seq + seed_length for seq in batch) for batch in own_batches(alone.events, 0)
    ]


@PROPERTY
@given(owners(), st.integers(-3_600_000, 3_600_000))
def test_a_decision_never_dispatches_early(owner: Owner, offset: int) -> None:
    # given any fold an owner reached, sampled at some time around its clock
    now = max(MIN_MS, min(MAX_MS, owner.now + offset))
    targets = {r.id: parse_instant(r.scheduledAt) for r in owner.state.active}

    # when the owner decides
    decision = due_decision(owner.state, now)

    # then nothing it dispatches is early, a batch respects the gate, a wait is in the future
    if isinstance(decision, DispatchOne):
        assert targets[decision.record.id] <= now
    elif isinstance(decision, DispatchBatch):
        assert decision.accepted_ms == now
        assert all(targets[r.id] <= now for r in decision.records)
        last = owner.state.last_batch_ms
        assert last is None or now >= last + 300_000
    else:
        assert decision.until_ms is None or decision.until_ms > now
