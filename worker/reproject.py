"""Re-projection of lost followups from the log (docs/architecture.md#hosts-followups-and-rebuild).

A dispatch in the agent's own suffix that no delivered message covers and no stream
entry holds gets its followup re-added, rendered from the prompts the ledger kept of it
by the same renderer the due transaction uses, so it is byte-identical to the original
frame. The ledger comes with the loaded session: nothing here reads the log again.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsh_schedule.shared.coordination.followups import Followups, Pair
from dsh_schedule.shared.core.dispatch import pending_frame
from dsh_schedule.shared.core.events import Session
from dsh_schedule.shared.core.ledger import ledger_of


def reproject(
    followups: Followups, sessions: Sequence[tuple[str, Session]]
) -> tuple[dict[str, int], list[str]]:
    """Re-add every lost followup of these agents: one pipelined read of the streams of
    the agents with an undelivered dispatch, one script call writing what is missing,
    unannounced. How many entries were added, per agent, and the agents with an
    undelivered dispatch: the caller announces them once it lets them go (a host may
    have missed them, as when a worker died before announcing)."""
    added = {agent: 0 for agent, _session in sessions}
    undelivered = [(agent, ledger, missing) for agent, session in sessions
                   if (missing := (ledger := ledger_of(session)).undelivered())]
    if not undelivered:
        return added, []
    streams = followups.entries_many([agent for agent, _ledger, _missing in undelivered])
    lost: list[tuple[str, str, Sequence[Pair]]] = []
    for (agent, ledger, missing), entries in zip(undelivered, streams, strict=True):
        held: set[Pair] = {p for entry in entries for p in entry.pairs}
        for group in missing:
            if not any(p in held for p in group.pairs):
                lost.append((agent, pending_frame(ledger, group), group.pairs))
                added[agent] += 1
    followups.add_many(lost)
    return added, [agent for agent, _ledger, _missing in undelivered]
