"""What the live owner must do now, decided purely from the fold and ``now``
(docs/architecture.md#the-due-transaction).

The earliest due one-shot goes alone; otherwise every due recurring record (``every``
and ``cron`` alike) goes in one batch once the 300-second recurring gate is open;
otherwise the owner waits until the next decision time.
"""

from __future__ import annotations

import msgspec

from dsh_schedule.shared.core.fold import RECURRING_GAP_MS, FoldState
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.records import RECURRING_TYPES, RecurringSchedule, Schedule


class DispatchOne(msgspec.Struct, frozen=True, kw_only=True):
    record: Schedule


class DispatchBatch(msgspec.Struct, frozen=True, kw_only=True):
    records: tuple[RecurringSchedule, ...]
    accepted_ms: int


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    """Nothing is due; ``until_ms`` is the next decision time, None when nothing is active."""

    until_ms: int | None


Decision = DispatchOne | DispatchBatch | Wait


def gate_opens_ms(state: FoldState) -> int | None:
    """When the next recurring batch may be accepted; None when no batch was accepted yet."""
    if state.last_batch_ms is None:
        return None
    return state.last_batch_ms + RECURRING_GAP_MS


def due_decision(state: FoldState, now_ms: int) -> Decision:
    # A paused record never fires and never enters a batch.
    targets = [
        (parse_instant(r.scheduledAt), index, r)
        for index, r in enumerate(state.active)
        if not r.paused
    ]
    one_shots = [t for t in targets if not isinstance(t[2], RECURRING_TYPES) and t[0] <= now_ms]
    if one_shots:
        return DispatchOne(record=min(one_shots, key=lambda t: (t[0], t[1]))[2])
    gate = gate_opens_ms(state)
    gate_open = gate is None or now_ms >= gate
    due_every = sorted(t for t in targets if isinstance(t[2], RECURRING_TYPES) and t[0] <= now_ms)
    if due_every and gate_open:
        batch = tuple(r for _, _, r in due_every if isinstance(r, RECURRING_TYPES))
        return DispatchBatch(records=batch, accepted_ms=now_ms)
    future = [t[0] for t in targets if t[0] > now_ms]
    if due_every and gate is not None:
        future.append(gate)
    return Wait(until_ms=min(future) if future else None)


def next_wake_ms(state: FoldState, now_ms: int) -> int | None:
    """The time the owner's wake should fire: now when something is due, else the wait."""
    decision = due_decision(state, now_ms)
    if isinstance(decision, Wait):
        return decision.until_ms
    return now_ms


def next_due_moment_ms(state: FoldState) -> int | None:
    """The earliest moment something of ``state`` is due, whatever the time is now: a
    one-shot's target, a recurring record's target or, when later, the moment the
    recurring gate opens; None when nothing unpaused is active. ``due_decision`` at that moment
    dispatches something (or, for a recurring record, waits no longer than the gate);
    stores keep it beside a session so the due sessions are found by one query."""
    gate = gate_opens_ms(state)
    moments = []
    for record in state.active:
        if record.paused:  # never due while paused
            continue
        target = parse_instant(record.scheduledAt)
        if isinstance(record, RECURRING_TYPES) and gate is not None:
            target = max(target, gate)
        moments.append(target)
    return min(moments, default=None)
