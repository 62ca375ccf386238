"""Replay of ``schedule/change`` records into the active set (docs/architecture.md#replay-rules).

The fold is a pure function of the events. It can be continued: folding ``a + b`` equals
``fold_events(fold_events(EMPTY, a), b)``, which is what the stores' incremental cache
relies on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.instant import MAX_MS, format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    Change,
    CreateChange,
    DeleteChange,
    DispatchChange,
    EverySchedule,
    Schedule,
    decode_change,
)

RECURRING_GAP_MS: Final[int] = 300_000


class FoldState(msgspec.Struct, frozen=True, kw_only=True):
    """Active records in create order, every id ever created, the last recurring batch."""

    active: tuple[Schedule, ...] = ()
    created: frozenset[str] = frozenset()
    last_batch_ms: int | None = None

    def find(self, schedule_id: str) -> Schedule | None:
        for record in self.active:
            if record.id == schedule_id:
                return record
        return None


EMPTY: Final = FoldState()


def occurrence_at(record: EverySchedule, accepted_ms: int) -> int:
    """The latest anchor-aligned occurrence not after ``accepted_ms`` (>= scheduledAt)."""
    target = parse_instant(record.scheduledAt)
    period = record.everySeconds * 1000
    return target + (accepted_ms - target) // period * period


def advance_every(record: EverySchedule, accepted_ms: int) -> EverySchedule | None:
    """The record after a dispatch accepted at ``accepted_ms`` (>= scheduledAt): its target
    moves to the first anchor-aligned one after the delivered occurrence; None when that
    target is beyond 9999-12-31T23:59:59.999Z, which ends the record."""
    following = occurrence_at(record, accepted_ms) + record.everySeconds * 1000
    if following > MAX_MS:
        return None
    return EverySchedule(
        id=record.id,
        prompt=record.prompt,
        everySeconds=record.everySeconds,
        scheduledAt=format_instant(following),
    )


def apply_change(state: _Folding, change: Change) -> None:
    """Apply one decoded change to a mutable fold; ScheduleLogError when it is invalid."""
    if isinstance(change, CreateChange):
        schedule = change.schedule
        if schedule.id in state.created:
            raise ScheduleLogError(f"schedule id {schedule.id!r} is created twice")
        state.created.add(schedule.id)
        state.active[schedule.id] = schedule
        return
    record = state.active.get(change.id)
    if record is None:
        raise ScheduleLogError(f"{change.operation} of inactive schedule id {change.id!r}")
    if isinstance(change, DeleteChange):
        del state.active[change.id]
        return
    _apply_dispatch(state, record, change)


def _apply_dispatch(state: _Folding, record: Schedule, change: DispatchChange) -> None:
    if not isinstance(record, EverySchedule):
        if change.acceptedAt is not None:
            raise ScheduleLogError("one-shot dispatch carries acceptedAt")
        del state.active[record.id]
        return
    if change.acceptedAt is None:
        raise ScheduleLogError("recurring dispatch lacks acceptedAt")
    accepted = parse_instant(change.acceptedAt)
    if accepted < parse_instant(record.scheduledAt):
        raise ScheduleLogError("recurring dispatch accepted before its target")
    last = state.last_batch_ms
    if last is not None and accepted != last and accepted < last + RECURRING_GAP_MS:
        raise ScheduleLogError("recurring batches less than 300 seconds apart")
    state.last_batch_ms = accepted
    advanced = advance_every(record, accepted)
    if advanced is None:
        del state.active[record.id]
    else:
        state.active[record.id] = advanced


class _Folding:
    """Mutable working copy of a FoldState (dicts keep create order)."""

    def __init__(self, state: FoldState) -> None:
        self.active: dict[str, Schedule] = {r.id: r for r in state.active}
        self.created: set[str] = set(state.created)
        self.last_batch_ms = state.last_batch_ms

    def freeze(self) -> FoldState:
        return FoldState(
            active=tuple(self.active.values()),
            created=frozenset(self.created),
            last_batch_ms=self.last_batch_ms,
        )


def fold_events(state: FoldState, events: Iterable[Event]) -> FoldState:
    """Continue ``state`` with ``events``; other event types are ignored."""
    working = _Folding(state)
    for event in events:
        if event.type != SCHEDULE_CHANGE:
            continue
        try:
            apply_change(working, decode_change(event.data))
        except ScheduleLogError as exc:
            raise ScheduleLogError(exc.reason, seq=event.seq) from None
    return working.freeze()


def fold(events: Sequence[Event], seed_length: int = 0) -> FoldState:
    """Fold a session's own suffix ``events[seed_length:]``."""
    if not 0 <= seed_length <= len(events):
        raise ScheduleLogError("seedLength outside the log")
    return fold_events(EMPTY, events[seed_length:])


def check_candidate(state: FoldState, candidates: Iterable[Event]) -> FoldState:
    """The invariant companion: the fold after ``candidates``, or ScheduleLogError."""
    return fold_events(state, candidates)


def allocate_id(state: FoldState) -> str:
    """``schedule-N`` from (ids ever created) + 1 upwards, never one already created."""
    n = len(state.created) + 1
    while f"schedule-{n}" in state.created:
        n += 1
    return f"schedule-{n}"
