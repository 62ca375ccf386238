"""The due transaction's dispatch stage (worker/due.py): claim maintenance, write the
followups, append each dispatch fenced (deciding again after a conflict), release, then
the barrier flush."""

from __future__ import annotations

import logging
import uuid

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.dispatch import plan_dispatch
from dsh_schedule.shared.core.due import DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import (
    FenceConflict,
    PersistenceError,
    ScheduleLogError,
)
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent
from dsh_schedule.shared.core.framing import FramingError
from dsh_schedule.shared.core.records import encode_change
from dsh_schedule.shared.failpoints import Failpoint, reach
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.transaction import (
    FENCE_ATTEMPTS,
    LogTransactions,
)
from dsh_schedule.worker.due_check import Due, Planned, Stage, WakeBatch, failure_level
from dsh_schedule.worker.outcome import WakeOutcome as WakeOutcome

log = logging.getLogger("dsh_schedule.worker.due")


class DueDispatch:
    """The dispatch stage of the due transactions of ``DueOwner``: claim, write, append,
    release, confirm."""

    def __init__(self, coordination: Coordination, transactions: LogTransactions,
                 settings: Settings, *, clock: Clock) -> None:
        self._coord = coordination
        self._tx = transactions
        self._settings = settings
        self._clock = clock

    def dispatch(self, due: list[Due], batch: WakeBatch) -> None:
        """Claim maintenance, dispatch once, release, then the barrier flush
        (docs/architecture.md#the-due-transaction, steps 6 to 8), for every agent found
        due: their phases claimed and released in one round trip each, their followups
        written in one. An agent that dispatched and passed its barrier is checked again
        next round; one that found nothing due any more gets the full check."""
        if not due:
            return
        token = uuid.uuid4().hex
        claimed = self._coord.claim_maintenance([d.agent for d in due], token,
                                                self._settings.maintenance_ttl_s)
        held: list[Due] = []
        for d, ok in zip(due, claimed, strict=True):
            if ok:
                held.append(d)
            else:
                log.debug("agent %s busy: idle waiter registered", d.agent)
                batch.stop(d.agent, WakeOutcome.WAITING_FOR_IDLE)
        if not held:
            return
        try:
            live = self._coord.live_agents([d.agent for d in held], self._clock())
            for d in held:
                if d.agent not in live:
                    batch.stop(d.agent, WakeOutcome.NOT_LIVE)
            appended = self._append_fenced([d for d in held if d.agent in live], batch)
        finally:
            self._coord.end_maintenance([d.agent for d in held], token)
        self._barrier(appended, batch)

    def _append_fenced(self, due: list[Due], batch: WakeBatch) -> list[str]:
        """Write each agent's followup, then append its dispatch fenced at the length it
        decided on; returns the agents appended. An agent whose append met another writer
        decides again once that writer's suffix is confirmed, the way a tool retries
        (``FENCE_ATTEMPTS`` attempts in all); its followup written before stays without a
        dispatch, and the host drops it."""
        appended: list[str] = []
        for n in range(FENCE_ATTEMPTS):
            if n:
                due = self._redecide(due, batch)
            due = self._write_and_append(self._plan(due, batch), batch, appended)
            if not due:
                return appended
        for d in due:
            log.warning("dispatch for %s: the log kept moving under %d attempts",
                        d.agent, FENCE_ATTEMPTS)
            batch.stop(d.agent, WakeOutcome.DISPATCH_ABANDONED)
        return appended

    def _redecide(self, due: list[Due], batch: WakeBatch) -> list[Due]:
        """Confirm the conflicting writers' suffixes, read and decide again: the agents
        still due. One found with nothing due any more gets the full check next round."""
        reads = self._tx.preflight([d.agent for d in due])
        now = self._clock()
        still: list[Due] = []
        for d in due:
            read = reads[d.agent]
            if isinstance(read, (PersistenceError, ScheduleLogError)):
                with log_context(agent=d.agent):
                    log.log(failure_level(read), "re-fold for %s failed: %s", d.agent, read)
                batch.stop(d.agent, WakeOutcome.DISPATCH_ABANDONED)
                continue
            if isinstance(read, Exception):
                raise read
            decision = due_decision(read.state, now)
            if isinstance(decision, Wait):
                batch.going[d.agent] = Stage.CHECK  # the next check settles it
            else:
                still.append(Due(agent=d.agent, read=read, decision=decision,
                                 decided_ms=now))
        return still

    def _plan(self, due: list[Due], batch: WakeBatch) -> list[Planned]:
        """Frame each agent's dispatch; one that cannot be framed writes nothing."""
        planned: list[Planned] = []
        for d in due:
            try:
                planned.append(Planned(due=d, plan=plan_dispatch(d.decision)))
            except FramingError:
                with log_context(agent=d.agent):
                    log.exception("framing failed for %s; nothing written", d.agent)
                batch.stop(d.agent, WakeOutcome.DISPATCH_ABANDONED)
        return planned

    def _write_and_append(
        self, planned: list[Planned], batch: WakeBatch, appended: list[str]
    ) -> list[Due]:
        """The followups to Redis in one call, before any append; then each dispatch's
        fenced append. Returns the agents whose append met another writer."""
        if not planned:
            return []
        reach(Failpoint.BEFORE_FOLLOWUP)
        # Announced once the transaction lets the agents go (``_announce``).
        self._coord.write_followups([(p.agent, p.plan.text, p.plan.pairs) for p in planned])
        written_ms = self._clock()
        reach(Failpoint.AFTER_FOLLOWUP)
        # Every dispatch's fenced append, in one round trip where the store can.
        results = self._tx.append([
            (p.agent, p.due.read,
             [NewEvent(type=SCHEDULE_CHANGE, time=p.due.decided_ms, data=encode_change(c))
              for c in p.plan.changes])
            for p in planned])
        conflicted: list[Due] = []
        for p in planned:
            schedule_ids = ",".join(pair.scheduleId for pair in p.plan.pairs)
            with log_context(agent=p.agent, schedule_id=schedule_ids):
                if self._appended(p, results[p.agent], batch):
                    conflicted.append(p.due)
                elif batch.going.get(p.agent) is Stage.APPENDED:
                    appended.append(p.agent)
                    self._record_dispatch(p, written_ms)
        return conflicted

    def _appended(self, planned: Planned, result: object, batch: WakeBatch) -> bool:
        """What the fenced append of one agent's dispatch did (``result``: the events
        appended, or what the append raised): ``APPENDED`` once written, stopped when
        abandoned; True when another writer came between."""
        agent = planned.agent
        if isinstance(result, FenceConflict):
            log.info("dispatch for %s: fence conflict (%s), re-deciding", agent, result)
            return True
        if isinstance(result, Exception):  # the disk, a bound: this agent's own failure
            # The followup may already be read; with no dispatch the host drops it.
            log.log(failure_level(result, logging.ERROR),
                    "dispatch append for %s abandoned: %s", agent, result)
            batch.stop(agent, WakeOutcome.DISPATCH_ABANDONED)
            return False
        reach(Failpoint.AFTER_APPEND)
        batch.going[agent] = Stage.APPENDED
        batch.announce.add(agent)
        return False

    def _record_dispatch(self, planned: Planned, written_ms: int) -> None:
        pairs = planned.plan.pairs
        recorder = metrics.get()
        if recorder.enabled:
            kind = "one-shot" if isinstance(planned.due.decision, DispatchOne) else "batch"
            recorder.dispatched(kind, metrics.lateness_s(
                written_ms, [pair.occurrenceAt for pair in pairs]))
        log.info("dispatched %s for %s", ", ".join(pair.scheduleId for pair in pairs),
                 planned.agent)

    def _barrier(self, agents: list[str], batch: WakeBatch) -> None:
        """The barrier flushes, together: a dispatch confirmed is checked again next
        round; one whose flush failed stops its agent (its host confirms it with its own
        flush before delivering)."""
        failed = self._tx.flush(agents)
        for agent in agents:
            if agent in failed:
                log.log(failure_level(failed[agent]), "dispatch barrier for %s failed: %s", agent,
                        failed[agent].reason)
                batch.stop(agent, WakeOutcome.BARRIER_FAILED)
            else:
                batch.going[agent] = Stage.RECHECK
