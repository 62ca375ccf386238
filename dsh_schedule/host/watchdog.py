"""The host's watchdog over its agents' projections in Redis
(docs/architecture.md#repairing-lost-keys).

A key of a live agent's projection lost (a wake's schedule entry or job hash, its followup
stream, its ``agent-host`` or ``lease-queue`` entry) shows as a reminder that is overdue:
due and not dispatched, or dispatched and not delivered. For each agent it serves, the host
keeps the next moment at which something is due (a heap, in memory): its tool calls note
the moment they armed, and a new lease notes now. Only when a moment has passed by
``repair_after_s`` does the watchdog look: it loads the agent's session (from the host's
store, no Redis command) and, when something is still overdue, writes the agent's lease
entries again and wakes it (the wake re-arms its reminders and re-projects its followups
from its log). Otherwise it notes the agent's next moment. The cost grows with the due
work, never with the agents served: nothing is read while no moment has passed.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Final

from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.core.delivered import LedgerView
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, due_decision, gate_opens_ms
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError, outage_said
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.ledger import ledger_of
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)

# Agents looked at per check: a host that took over thousands of agents at once spreads
# their first look over several checks instead of stalling its loop.
CHECK_BATCH: Final = 100


def overdue_since_ms(state: FoldState, ledger: LedgerView, now_ms: int) -> int | None:
    """Since when something of the session is overdue at ``now_ms``: the earliest moment
    of a record that is due and not dispatched, or of an occurrence dispatched and not
    delivered (None: nothing is)."""
    moments: list[int] = []
    decision = due_decision(state, now_ms)
    if isinstance(decision, DispatchOne):
        moments.append(parse_instant(decision.record.scheduledAt))
    elif isinstance(decision, DispatchBatch):
        earliest = min(parse_instant(r.scheduledAt) for r in decision.records)
        moments.append(max(earliest, gate_opens_ms(state) or earliest))
    moments.extend(parse_instant(pair.occurrenceAt)
                   for group in ledger.undelivered() for pair in group.pairs)
    return min(moments) if moments else None


def next_look_ms(state: FoldState, ledger: LedgerView, now_ms: int) -> int | None:
    """The moment from which the session has something due or undelivered: what the
    watchdog looks at ``repair_after_s`` later (None: nothing to watch)."""
    since = overdue_since_ms(state, ledger, now_ms)
    if since is not None:
        return since
    decision = due_decision(state, now_ms)
    return getattr(decision, "until_ms", None)


class Watchdog:
    """The next due moment of each agent a host serves, and the repair of those whose
    moment passed ``repair_after_ms`` ago with something still overdue."""

    def __init__(self, store: SessionStore, *, clock: Clock, repair_after_s: float,
                 misplaced: Callable[[list[str]], list[str]],
                 repair: Callable[[list[str]], None]) -> None:
        self._store = store
        self._clock = clock
        self._after_ms = int(repair_after_s * 1000)
        self._misplaced = misplaced
        self._repair = repair
        self._state = threading.Lock()
        self._heap: list[tuple[int, str]] = []
        self._moment: dict[str, int] = {}  # agent -> the moment its heap entry holds

    def watch(self, agents: Sequence[str], moment_ms: int) -> None:
        """Look at the agents once ``moment_ms`` passed by ``repair_after_s`` (an earlier
        moment already noted is kept)."""
        with self._state:
            for agent in agents:
                noted = self._moment.get(agent)
                if noted is not None and noted <= moment_ms:
                    continue
                self._moment[agent] = moment_ms
                heapq.heappush(self._heap, (moment_ms, agent))

    def note(self, agent: str, state: FoldState) -> None:
        """Watch the agent from its next due moment in ``state`` (a tool call's fold)."""
        decision = due_decision(state, self._clock())
        moment = getattr(decision, "until_ms", self._clock())
        if moment is not None:
            self.watch([agent], moment)

    def forget(self, agents: Sequence[str]) -> None:
        """The host serves these agents no more."""
        with self._state:
            for agent in agents:
                self._moment.pop(agent, None)

    def check(self) -> list[str]:
        """Look at up to ``CHECK_BATCH`` agents whose moment passed ``repair_after_s`` ago:
        repair those with something still overdue or whose lease entries do not name this
        host, watch the others from their next moment. Returns the agents repaired. No
        Redis command while no moment passed; one round trip for the batch otherwise,
        plus the repair's when one is needed."""
        now = self._clock()
        taken: list[str] = []
        with self._state:
            while self._heap and len(taken) < CHECK_BATCH:
                moment, agent = self._heap[0]
                if moment + self._after_ms > now:
                    break
                heapq.heappop(self._heap)
                if self._moment.get(agent) == moment:
                    del self._moment[agent]
                    taken.append(agent)
        stuck: list[str] = []
        for n, agent in enumerate(taken):
            try:
                session, state = self._store.load(agent)
                ledger = ledger_of(session)
            except (PersistenceError, ScheduleLogError) as exc:
                if outage_said(exc):
                    # The store is out and has said so: the rest of the batch waits for
                    # it too, rather than each load waiting on it in this loop.
                    self.watch(taken[n:], now)
                    taken = taken[:n]
                    break
                log.warning("watchdog: cannot read %s (%s); looking again later", agent,
                            type(exc).__name__)
                self.watch([agent], now)
                continue
            since = overdue_since_ms(state, ledger, now)
            if since is not None and since + self._after_ms <= now:
                stuck.append(agent)
                self.watch([agent], now)  # look again: the repair worked, or repair again
                continue
            look = next_look_ms(state, ledger, now)
            if look is not None:
                self.watch([agent], look)
        if taken:
            # Their lease entries, read once for the batch: one lost while nothing was
            # overdue yet (its wakes and announcements fall back to the default queue).
            misplaced = set(self._misplaced(taken)) - set(stuck)
            stuck.extend(a for a in taken if a in misplaced)
        if stuck:
            self._repair(stuck)
        return stuck
