"""A due transaction's dispatch (docs/architecture.md#the-due-transaction, steps 6 to 8):
for the agents found due, claim maintenance, re-decide on each agent's own fold, write
the followups, append each dispatch fenced, release, then the barrier flush. The worker's
``DueOwner`` decides who is due and settles the rest; this module only dispatches.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from enum import Enum
from typing import Final

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.phase import Release
from dsh_schedule.shared.core.dispatch import DispatchPlan, plan_dispatch
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent
from dsh_schedule.shared.core.framing import FramingError
from dsh_schedule.shared.core.records import encode_change
from dsh_schedule.shared.fencing import FENCE_ATTEMPTS
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.flushing import flush_each
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.outcome import WakeOutcome, crash_point

log = logging.getLogger(__name__)


class _Conflict(Enum):
    """An append met another writer: the dispatch is decided again."""

    CONFLICT = "conflict"


_CONFLICT: Final = _Conflict.CONFLICT


class Dispatcher:
    """Dispatches for agents whose sessions live in ``store``, their locks held by the
    caller."""

    def __init__(
        self, store: SessionStore, coordination: Coordination, settings: Settings,
        *, clock: Clock,
    ) -> None:
        self._store = store
        self._coord = coordination
        self._settings = settings
        self._clock = clock

    def dispatch_many(
        self, agents: Sequence[str], outcomes: dict[str, WakeOutcome]
    ) -> tuple[list[str], list[str]]:
        """Claim maintenance, dispatch once, release, then the barrier flush, for many
        agents: their phases claimed and released in one round trip each, their followups
        written in one. Returns the agents to check again: those that found nothing due
        any more, and those that dispatched and passed their barrier."""
        if not agents:
            return [], []
        token = uuid.uuid4().hex
        phase = self._coord.phase
        ttl_s = self._settings.maintenance_ttl_s
        claimed = phase.claim_many(agents, "maintenance", token, ttl_s)
        held = [agent for agent, ok in zip(agents, claimed, strict=True) if ok]
        for agent in set(agents).difference(held):
            log.debug("agent %s busy: idle waiter registered", agent)
            outcomes[agent] = WakeOutcome.WAITING_FOR_IDLE
        if not held:
            return [], []
        try:
            live = set(self._coord.leases.live_among(held, now_ms=self._clock()))
            for agent in set(held).difference(live):
                outcomes[agent] = WakeOutcome.NOT_LIVE
            again, dispatched = self._together(
                [agent for agent in held if agent in live], outcomes)
        finally:
            released = phase.release_many(held, "maintenance", token)
            woken = [agent for agent, release in zip(held, released, strict=True)
                     if release is Release.WAITER_WOKEN]
            if woken:
                self._coord.trigger_many(woken)
        failed = flush_each(self._store, dispatched)  # the barriers
        for agent, exc in failed.items():
            log.warning("dispatch barrier for %s failed: %s", agent, exc.reason)
            outcomes[agent] = WakeOutcome.BARRIER_FAILED
        return again, [agent for agent in dispatched if agent not in failed]

    def _together(
        self, agents: Sequence[str], outcomes: dict[str, WakeOutcome], *, attempt: int = 0
    ) -> tuple[list[str], list[str]]:
        """Dispatch once for each of many agents, their phases held: each re-decides on its
        own fold and gets its own fenced append; the followups go to Redis in one call,
        before any append. Agents whose append met another writer re-decide together
        afterwards, their suffix confirmed first, at most ``FENCE_ATTEMPTS`` times.
        Returns the agents that found nothing due any more, and those that dispatched."""
        planned: list[tuple[str, int, int, DispatchOne | DispatchBatch, DispatchPlan]] = []
        again: list[str] = []
        for agent in agents:
            with log_context(agent=agent):
                try:
                    session, state = self._store.load(agent)
                except (PersistenceError, ScheduleLogError) as exc:
                    log.warning("re-fold for %s failed: %s", agent, exc)
                    outcomes[agent] = WakeOutcome.DISPATCH_ABANDONED
                    continue
                now = self._clock()
                decision = due_decision(state, now)
                if isinstance(decision, Wait):
                    again.append(agent)  # nothing due any more: the next check settles it
                    continue
                try:
                    plan = plan_dispatch(decision)
                except FramingError:
                    log.exception("framing failed for %s; nothing written", agent)
                    outcomes[agent] = WakeOutcome.DISPATCH_ABANDONED
                    continue
            planned.append((agent, len(session.events), now, decision, plan))
        if not planned:
            return again, []
        crash_point("before-followup")
        # Announced once the transaction lets the agents go (``_announce``).
        self._coord.followups.add_many([(agent, plan.text, plan.pairs)
                                        for agent, _n, _now, _d, plan in planned])
        written_ms = self._clock()
        crash_point("after-followup")
        conflicted: list[str] = []
        dispatched: list[str] = []
        for agent, length, now, decision, plan in planned:
            schedule_ids = ",".join(pair.scheduleId for pair in plan.pairs)
            with log_context(agent=agent, schedule_id=schedule_ids):
                stopped = self._append(agent, length, now, decision, plan, written_ms)
            if stopped is None:
                dispatched.append(agent)
            elif stopped is _CONFLICT:
                conflicted.append(agent)
            else:
                outcomes[agent] = stopped
        more_again, more_dispatched = self._redecide(conflicted, outcomes, attempt + 1)
        return again + more_again, dispatched + more_dispatched

    def _redecide(
        self, agents: list[str], outcomes: dict[str, WakeOutcome], attempt: int
    ) -> tuple[list[str], list[str]]:
        """Dispatch again for agents whose append met another writer, once that writer's
        suffix is confirmed (their followups written before stay without a dispatch, and
        the host drops them)."""
        if not agents:
            return [], []
        if attempt >= FENCE_ATTEMPTS:
            for agent in agents:
                log.warning("dispatch for %s: the log kept moving under %d attempts",
                            agent, attempt)
                outcomes[agent] = WakeOutcome.DISPATCH_ABANDONED
            return [], []
        unflushed = flush_each(self._store, agents)
        for agent, exc in unflushed.items():
            log.warning("re-fold for %s failed: %s", agent, exc)
            outcomes[agent] = WakeOutcome.DISPATCH_ABANDONED
        return self._together([a for a in agents if a not in unflushed], outcomes,
                                       attempt=attempt)

    def _append(
        self, agent: str, length: int, now: int, decision: DispatchOne | DispatchBatch,
        plan: DispatchPlan, written_ms: int,
    ) -> WakeOutcome | _Conflict | None:
        """The fenced append of one agent's dispatch: None once written, ``_CONFLICT`` when
        another writer came between, else the outcome that abandons it."""
        events = [NewEvent(type=SCHEDULE_CHANGE, time=now, data=encode_change(c))
                  for c in plan.changes]
        try:
            self._store.append(agent, events, expected_seq=length)
        except FenceConflict as conflict:
            log.info("dispatch for %s: fence conflict (%s), re-deciding", agent, conflict)
            return _CONFLICT
        except (PersistenceError, ScheduleLogError) as exc:
            # The followup may already be read; with no dispatch the host drops it.
            log.error("dispatch append for %s abandoned: %s", agent, exc)
            return WakeOutcome.DISPATCH_ABANDONED
        crash_point("after-append")
        self._dispatched(agent, decision, plan, written_ms)
        return None

    def _dispatched(
        self, agent: str, decision: DispatchOne | DispatchBatch, plan: DispatchPlan,
        written_ms: int,
    ) -> None:
        recorder = metrics.get()
        if recorder.enabled:
            kind = "one-shot" if isinstance(decision, DispatchOne) else "batch"
            occurrences = [pair.occurrenceAt for pair in plan.pairs]
            recorder.dispatched(kind, metrics.lateness_s(written_ms, occurrences))
        log.info("dispatched %s for %s", ", ".join(pair.scheduleId for pair in plan.pairs),
                 agent)
