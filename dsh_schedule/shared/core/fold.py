"""The fold of a session's ``schedule/change`` records into the active set
(docs/architecture.md#replay-rules).

The fold is a pure function of the events. It can be continued: folding ``a + b`` equals
``fold_events(fold_events(EMPTY, a), b)``, which is what the stores' incremental cache
relies on. The rules themselves live in ``replay``; this module applies them to events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.records import decode_change
from dsh_schedule.shared.core.replay import (
    EMPTY,
    RECURRING_GAP_MS,
    FoldState,
    Replay,
    occurrence_at,
)

__all__ = [
    "EMPTY",
    "RECURRING_GAP_MS",
    "FoldState",
    "allocate_id",
    "check_candidate",
    "fold",
    "fold_events",
    "occurrence_at",
]


def fold_events(state: FoldState, events: Iterable[Event]) -> FoldState:
    """Continue ``state`` with ``events``; other event types are ignored.

    ScheduleLogError, carrying the event's ``seq``, at the first record that is
    malformed or breaks a replay rule.
    """
    replay = Replay(state)
    for event in events:
        if event.type != SCHEDULE_CHANGE:
            continue
        try:
            replay.apply(decode_change(event.data))
        except ScheduleLogError as exc:
            raise ScheduleLogError(exc.reason, seq=event.seq) from None
    return replay.state()


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
