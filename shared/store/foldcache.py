"""The fold each store caches per log, continued as the log grows, and the invariant it
runs before an append (docs/architecture.md#replay-rules).

No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.fold import EMPTY, FoldState, check_candidate, fold_events


class IncrementalFold:
    """The fold of one log's own suffix, continued as the log grows.

    Not thread-safe: the store guards it with the lock of the log it belongs to. A log
    only grows, so once its Schedule records are found corrupt they stay corrupt; the
    store starts a new ``IncrementalFold`` when the log is replaced.
    """

    def __init__(self, seed_length: int) -> None:
        self._seed_length = seed_length
        self._folded = seed_length
        self._state: FoldState = EMPTY
        self._error: ScheduleLogError | None = None

    def advance(self, events: Sequence[Event]) -> FoldState:
        """The fold of ``events[seed_length:]``, folding only what is new since last time."""
        if self._error is not None:
            raise ScheduleLogError(self._error.reason, self._error.seq)
        if not 0 <= self._seed_length <= len(events):
            raise ScheduleLogError("seedLength outside the log")
        if len(events) > self._folded:
            try:
                self._state = fold_events(self._state, events[self._folded :])
            except ScheduleLogError as exc:
                self._error = exc
                raise
            self._folded = len(events)
        return self._state

    def appended(self, state: FoldState, length: int) -> None:
        """Record the fold checked for an append that brought the log to ``length``."""
        self._state = state
        self._folded = length


def touches_schedule(events: Iterable[Event]) -> bool:
    """Whether the invariant must run before ``events`` are appended."""
    return any(e.type == SCHEDULE_CHANGE for e in events)


def check_append(
    fold: IncrementalFold, events: Sequence[Event], candidates: tuple[Event, ...]
) -> FoldState | None:
    """The invariant before an append: the fold after ``candidates``, or None when no
    candidate is a ``schedule/change`` (nothing to check). ``ScheduleLogError`` when the
    log plus the candidates would not fold."""
    if not touches_schedule(candidates):
        return None
    return check_candidate(fold.advance(events), candidates)
