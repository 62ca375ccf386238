"""Re-projection of lost followups from the log (docs/architecture.md#hosts-followups-and-rebuild).

A dispatch in the agent's own suffix that no delivered message covers and no stream
entry holds gets its followup re-added, re-rendered through the receipt projection, so it
is byte-identical to the original frame.
"""

from __future__ import annotations

from dsh_schedule.shared.coordination.followups import Followups, Pair
from dsh_schedule.shared.core.events import Session
from dsh_schedule.shared.core.framing import batch_frame, one_shot_frame
from dsh_schedule.shared.core.ledger import DispatchGroup, LedgerCache
from dsh_schedule.shared.core.presentation import reminder_presentation


def render_group(session: Session, group: DispatchGroup) -> str:
    """The exact frame a dispatch group was delivered with, rebuilt from the log."""
    items = []
    for seq in group.seqs:
        shown = reminder_presentation(session.events, seq, session.seed_length)
        assert shown is not None
        items.append((shown.scheduleId, shown.occurrenceAt, shown.prompt))
    if "acceptedAt" not in session.events[group.seqs[0]].data:
        schedule_id, occurrence, prompt = items[0]
        return one_shot_frame(schedule_id, occurrence, prompt)
    return batch_frame(items)


def reproject(followups: Followups, agent: str, session: Session, cache: LedgerCache) -> int:
    """Re-add every lost followup; returns how many entries were added."""
    missing = cache.ledger(agent, session).undelivered()
    if not missing:
        return 0
    held: set[Pair] = {p for entry in followups.entries(agent) for p in entry.pairs}
    added = 0
    for group in missing:
        if any(p in held for p in group.pairs):
            continue
        followups.add(agent, render_group(session, group), group.pairs)
        added += 1
    return added
