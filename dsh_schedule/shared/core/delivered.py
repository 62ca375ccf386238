"""What a session's log says is dispatched and not yet delivered, as plain data: the answers
of the delivery ledger (``ledger``), which a store hands out with every session it loads
(``Session.ledger``; docs/architecture.md#hosts-followups-and-rebuild).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec


class Pair(msgspec.Struct, frozen=True, kw_only=True):
    """One delivered occurrence: which reminder, and which of its occurrences."""

    scheduleId: str
    occurrenceAt: str


class DispatchGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Dispatches delivered as one message: a one-shot alone, or one recurring batch.

    ``accepted_at`` is the batch's ``acceptedAt``; None for a one-shot.
    """

    seqs: tuple[int, ...]
    pairs: tuple[Pair, ...]
    accepted_at: str | None = None


class Undelivered(msgspec.Struct, frozen=True, kw_only=True):
    """A dispatch group no delivered message covers, with the prompt of each of its
    records as dispatched (``prompts[i]`` belongs to ``group.pairs[i]``)."""

    group: DispatchGroup
    prompts: tuple[str, ...]


class LedgerView(msgspec.Struct, frozen=True, kw_only=True):
    """A ledger's answers at one log length: its undelivered groups, in log order.

    Plain data: two views of the same log at the same length are equal, and a view never
    changes when the log grows.
    """

    pending: tuple[Undelivered, ...] = ()

    def undelivered(self) -> list[DispatchGroup]:
        """Dispatch groups no delivered message covers, in log order."""
        return [u.group for u in self.pending]

    def deliverable(self, pairs: Iterable[Pair]) -> bool:
        """Whether ``pairs`` are exactly one undelivered dispatch group: the complete
        batch the log recorded, none of it delivered yet."""
        wanted = set(pairs)
        if not wanted:
            return False
        first = next(iter(wanted))
        for undelivered in self.pending:
            if first in undelivered.group.pairs:
                return set(undelivered.group.pairs) == wanted
        return False

    def prompts(self, group: DispatchGroup) -> tuple[str, ...] | None:
        """The prompts of ``group`` as dispatched; None when it is no undelivered group."""
        for undelivered in self.pending:
            if undelivered.group == group:
                return undelivered.prompts
        return None
