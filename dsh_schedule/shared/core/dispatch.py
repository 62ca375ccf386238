"""What a dispatch writes and the frame it is delivered with
(docs/architecture.md#the-due-transaction, docs/architecture.md#hosts-followups-and-rebuild).

A dispatch's frame is rendered in two places: by the due transaction from its decision,
and by re-projection when the followup was lost, from the prompts the ledger kept of the
undelivered group (``pending_frame``). Both build the receipts of the dispatch through the
replay rules, as the receipt projection (``reminder_presentation``) does from the log, and
render them with ``dispatch_frame``, so the frames are byte-identical.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.framing import FramingError, batch_frame, one_shot_frame
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.ledger import DispatchGroup, LedgerView, Pair
from dsh_schedule.shared.core.presentation import Presentation, delivery_presentation
from dsh_schedule.shared.core.records import DispatchChange
from dsh_schedule.shared.core.replay import deliver


class DispatchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatch, ready to write: the followup's frame and pairs, then the records."""

    text: str
    pairs: tuple[Pair, ...]
    changes: tuple[DispatchChange, ...]


def dispatch_frame(shown: Sequence[Presentation], *, batch: bool) -> str:
    """The frame of one delivered message: the five-line one-shot frame of the single
    receipt in ``shown``, or (``batch``) the three-line frame of every receipt in order.

    FramingError when a one-shot has not exactly one receipt, a batch is empty, or a
    receipt cannot be framed.
    """
    if batch:
        return batch_frame([(p.scheduleId, p.occurrenceAt, p.prompt) for p in shown])
    if len(shown) != 1:
        raise FramingError("a one-shot reminder is delivered alone")
    one = shown[0]
    return one_shot_frame(one.scheduleId, one.occurrenceAt, one.prompt)


def plan_dispatch(decision: DispatchOne | DispatchBatch) -> DispatchPlan:
    """The dispatch ``decision`` asks for: the one-shot's record alone, or every record of
    the batch with ``acceptedAt`` = the decision time, in batch order.

    FramingError when it cannot be written: the frame cannot be rendered, or the
    records do not replay (a target that is no canonical instant, a recurring record
    sent alone, a batch accepted before a record's target), which a decision of
    ``due_decision`` never asks for.
    """
    try:
        if isinstance(decision, DispatchOne):
            changes: tuple[DispatchChange, ...] = (DispatchChange(id=decision.record.id),)
            deliveries = [deliver(decision.record, changes[0])]
        else:
            accepted = format_instant(decision.accepted_ms)
            changes = tuple(
                DispatchChange(id=r.id, acceptedAt=accepted) for r in decision.records
            )
            deliveries = [deliver(r, c) for r, c in zip(decision.records, changes, strict=True)]
    except ValueError as exc:  # ScheduleLogError included
        raise FramingError(f"the decision does not replay: {exc}") from exc
    shown = [delivery_presentation(d) for d in deliveries]
    text = dispatch_frame(shown, batch=isinstance(decision, DispatchBatch))
    pairs = tuple(Pair(scheduleId=p.scheduleId, occurrenceAt=p.occurrenceAt) for p in shown)
    return DispatchPlan(text=text, pairs=pairs, changes=changes)


def pending_frame(ledger: LedgerView, group: DispatchGroup) -> str:
    """The exact frame the undelivered ``group`` was delivered with, from the prompts the
    ledger kept: the ledger replayed each record up to its dispatch by the same rules the
    receipt projection (``reminder_presentation``) replays from the log, so both render
    the same receipts.

    ScheduleLogError when ``group`` is no undelivered group of ``ledger``; FramingError
    when its receipts cannot be framed.
    """
    prompts = ledger.prompts(group)
    if prompts is None:
        raise ScheduleLogError("the group is no undelivered dispatch of the ledger")
    shown = [
        Presentation(scheduleId=pair.scheduleId, prompt=prompt, occurrenceAt=pair.occurrenceAt)
        for pair, prompt in zip(group.pairs, prompts, strict=True)
    ]
    return dispatch_frame(shown, batch=group.accepted_at is not None)
