"""The Host-facing receipt projection of a dispatch (docs/architecture.md#receipts).

``reminder_presentation`` pairs a ``schedule/change`` dispatch with its nearest preceding
same-id create and replays that record through the same-id updates, dispatches and deletes
up to the dispatch, so the receipt shows the prompt and occurrence in force at it (those
of the nearest preceding create or update). The current fork's ``seed_length`` is a hard
boundary for the fork's own dispatches; inherited dispatches search their persisted prefix
back to the start. Presentation never changes live ownership: it only reads the log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.records import (
    Change,
    CreateChange,
    DeleteChange,
    DispatchChange,
    Schedule,
    UpdateChange,
    decode_change,
)
from dsh_schedule.shared.core.replay import Delivery, apply_update, deliver

RECEIPT_LABEL: Final = "session-local"

_Later = DeleteChange | DispatchChange | UpdateChange


class Presentation(msgspec.Struct, frozen=True, kw_only=True):
    """What a receipt shows; its builtins dict is the receipt value (without the label)."""

    scheduleId: str
    prompt: str
    occurrenceAt: str


def receipt_value(presentation: Presentation) -> dict[str, Any]:
    """The rendered receipt: the presentation's fields, then the fixed ``session-local`` label."""
    value: dict[str, Any] = msgspec.to_builtins(presentation)
    value["label"] = RECEIPT_LABEL
    return value


def reminder_presentation(
    events: Sequence[Event], dispatch_seq: int, seed_length: int
) -> Presentation | None:
    """The receipt of the dispatch at ``dispatch_seq``, or None when that event is no dispatch.

    Raises ScheduleLogError when ``seed_length`` is outside ``0..len(events)``, when
    ``dispatch_seq`` is not an index of ``events`` or not that event's ``seq``, when no
    same-id create precedes the dispatch inside its search window, and when the records
    read (the dispatch, its create and everything between them) are malformed or do not
    replay to an active record.
    """
    _check_seed_length(events, seed_length)
    if not 0 <= dispatch_seq < len(events):
        raise ScheduleLogError(f"no event with seq {dispatch_seq}")
    event = events[dispatch_seq]
    if event.seq != dispatch_seq:
        raise ScheduleLogError(f"event at index {dispatch_seq} has seq {event.seq}")
    if event.type != SCHEDULE_CHANGE:
        return None
    dispatch = _decode(event)
    if not isinstance(dispatch, DispatchChange):
        return None
    floor = seed_length if dispatch_seq >= seed_length else 0
    created, between = _find_create(events, dispatch, dispatch_seq, floor)
    record = _replay(created, between)
    if record is None:
        raise ScheduleLogError(f"dispatch of inactive schedule id {dispatch.id!r}", dispatch_seq)
    return delivery_presentation(_deliver(record, dispatch, dispatch_seq))


def delivery_presentation(delivery: Delivery) -> Presentation:
    """What a receipt shows of one delivery: the record's id and prompt as dispatched,
    and the occurrence delivered."""
    record = delivery.record
    return Presentation(
        scheduleId=record.id, prompt=record.prompt, occurrenceAt=delivery.occurrence_at
    )


def _check_seed_length(events: Sequence[Event], seed_length: int) -> None:
    if not 0 <= seed_length <= len(events):
        raise ScheduleLogError("seedLength outside the log")


def _decode(event: Event) -> Change:
    try:
        return decode_change(event.data)
    except ScheduleLogError as exc:
        raise ScheduleLogError(exc.reason, event.seq) from None


def _find_create(
    events: Sequence[Event], dispatch: DispatchChange, dispatch_seq: int, floor: int
) -> tuple[Schedule, list[tuple[int, _Later]]]:
    """The record of the nearest same-id create at or after ``floor``, and the same-id
    deletes, dispatches and updates (with their seqs) between it and the dispatch, in log order."""
    between: list[tuple[int, _Later]] = []
    for seq in range(dispatch_seq - 1, floor - 1, -1):
        event = events[seq]
        if event.type != SCHEDULE_CHANGE:
            continue
        change = _decode(event)
        if isinstance(change, CreateChange):
            if change.schedule.id == dispatch.id:
                between.reverse()
                return change.schedule, between
        elif change.id == dispatch.id:
            between.append((seq, change))
    raise ScheduleLogError(
        f"dispatch of schedule id {dispatch.id!r} has no preceding create", dispatch_seq
    )


def _replay(
    record: Schedule, changes: list[tuple[int, _Later]]
) -> Schedule | None:
    """The record as of the end of ``changes``; None once it has ended."""
    current: Schedule | None = record
    for seq, change in changes:
        if current is None:
            raise ScheduleLogError(f"{change.operation} of inactive schedule id {change.id!r}", seq)
        if isinstance(change, DeleteChange):
            current = None
        elif isinstance(change, UpdateChange):
            try:
                current = apply_update(current, change)
            except ScheduleLogError as exc:
                raise ScheduleLogError(exc.reason, seq) from None
        else:
            current = _deliver(current, change, seq).following
    return current


def _deliver(record: Schedule, dispatch: DispatchChange, seq: int) -> Delivery:
    """``deliver``, its ScheduleLogError carrying the dispatch's ``seq``."""
    try:
        return deliver(record, dispatch)
    except ScheduleLogError as exc:
        raise ScheduleLogError(exc.reason, seq) from None
