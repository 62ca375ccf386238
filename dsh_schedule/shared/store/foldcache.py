"""What a store keeps of one log besides its lines: its length, the fold of its own suffix
and its delivery ledger, continued as the log is read or appended, and the invariant run
before an append (docs/architecture.md#replay-rules).

No I/O happens here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event
from dsh_schedule.shared.core.fold import FoldState, check_candidate
from dsh_schedule.shared.core.ledger import Ledger, LedgerView

# Accounted bytes (an estimate of what the objects hold in memory) per kept item.
_RECORD_BYTES: Final = 400  # one active record, plus twice its prompt's length
_ID_BYTES: Final = 160  # one id ever created: in the replay's set and in the fold's
_GROUP_BYTES: Final = 300  # one undelivered group, plus per pair and prompt below
_PAIR_BYTES: Final = 250


class LogDigest:
    """The fold and the ledger of one log's own suffix, fed its events in order.

    Both are one replay (``Ledger``), so a log's ``schedule/change`` records are replayed
    once. Not thread-safe: the store guards it with the lock of the log it belongs to. A
    log only grows, so once its Schedule records are found corrupt they stay corrupt:
    the error is kept and raised by every later ``fold``; the store starts a new digest
    when the log is replaced.
    """

    def __init__(self, seed_length: int) -> None:
        self.seed_length = seed_length
        self.length = 0
        self._ledger = Ledger(seed_length)
        self._error: ScheduleLogError | None = None
        self._costed: tuple[FoldState, LedgerView] | None = None
        self._cost = 0

    def feed(self, events: Sequence[Event]) -> None:
        """Continue with ``events``, which must be numbered from ``self.length``.

        A record that does not replay is kept as the log's error, never raised here:
        a log with corrupt Schedule records still reads.
        """
        if not events:
            return
        if self._error is None:
            try:
                self._ledger.extend(events)
            except ScheduleLogError as exc:
                self._error = exc
        self.length = events[-1].seq + 1

    def fold(self) -> FoldState:
        """The fold of ``events[seed_length:]``; ScheduleLogError when the log's own
        Schedule records are corrupt or ``seed_length`` lies outside the log."""
        if self._error is not None:
            raise ScheduleLogError(self._error.reason, self._error.seq)
        if not 0 <= self.seed_length <= self.length:
            raise ScheduleLogError("seedLength outside the log")
        return self._ledger.state()

    def ledger(self) -> LedgerView | None:
        """The ledger's answers at ``self.length``; None whenever ``fold`` would raise."""
        if self._error is not None or not 0 <= self.seed_length <= self.length:
            return None
        return self._ledger.view()

    def check(self, candidates: Iterable[Event]) -> None:
        """The invariant before an append: ScheduleLogError when the log plus the
        ``candidates`` would not fold. Nothing to check when no candidate is a
        ``schedule/change``."""
        batch = tuple(candidates)
        if touches_schedule(batch):
            check_candidate(self.fold(), batch)

    def cost(self) -> int:
        """Accounted bytes of what the digest holds: its schedule state, never its events."""
        state, view = self._ledger.state(), self._ledger.view()
        costed = self._costed
        if costed is None or costed[0] is not state or costed[1] is not view:
            self._cost = (
                sum(_RECORD_BYTES + 2 * len(r.prompt) for r in state.active)
                + _ID_BYTES * len(state.created)
                + sum(
                    _GROUP_BYTES + sum(_PAIR_BYTES + 2 * len(p) for p in u.prompts)
                    for u in view.pending
                )
            )
            self._costed = (state, view)
        return self._cost


def touches_schedule(events: Iterable[Event]) -> bool:
    """Whether the invariant must run before ``events`` are appended."""
    return any(e.type == SCHEDULE_CHANGE for e in events)
