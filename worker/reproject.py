"""Re-projection of lost followups from the log (docs/architecture.md#hosts-followups-and-rebuild).

A dispatch in the agent's own suffix that no delivered message covers and no stream
entry holds gets its followup re-added, rendered from the prompts the ledger kept of it
by the same renderer the due transaction uses, so it is byte-identical to the original
frame. The ledger comes with the loaded session: nothing here reads the log again.
"""

from __future__ import annotations

from dsh_schedule.shared.coordination.followups import Followups, Pair
from dsh_schedule.shared.core.dispatch import pending_frame
from dsh_schedule.shared.core.events import Session
from dsh_schedule.shared.core.ledger import LedgerCache


def reproject(followups: Followups, agent: str, session: Session, cache: LedgerCache) -> int:
    """Re-add every lost followup; returns how many entries were added."""
    ledger = cache.ledger(agent, session)
    missing = ledger.undelivered()
    if not missing:
        return 0
    held: set[Pair] = {p for entry in followups.entries(agent) for p in entry.pairs}
    added = 0
    for group in missing:
        if any(p in held for p in group.pairs):
            continue
        followups.add(agent, pending_frame(ledger, group), group.pairs)
        added += 1
    return added
