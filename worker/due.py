"""The due transaction: a wake's work (docs/architecture.md#the-due-transaction), performed
for a batch of wakes at once (docs/architecture.md#batched-due-transactions); a single wake
is a batch of one.

The locks, the preflight, the fenced append with its retry, the barrier and the re-arm are
the log transaction engine's (``shared/transaction.py``); the decision is ``due_decision``.
Each going agent of a batch stands at a named ``Stage``, one way: checked (flushed, read,
re-projected, decided), then, when a dispatch is due, an immutable ``Due`` record claimed
(its maintenance phase), written (its followup), appended (its fenced dispatch) and
confirmed (its barrier flush), then checked again, until nothing is due; an agent whose
wake stops on the way keeps the ``WakeOutcome`` that stopped it. Each stage runs for every
agent in it at once, so the batch shares its round trips to Redis, while each agent is
decided, fenced and flushed on its own. The log stays the authority: followups are
written before the fenced dispatch append, so a crash can only leave an entry without a
dispatch (the host drops it) or a dispatch without an entry (re-projection re-adds it).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Final

import msgspec
import redis
from rq.timeouts import JobTimeoutException

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.dispatch import DispatchPlan, pending_frame, plan_dispatch
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import (
    FenceConflict,
    PersistenceError,
    ScheduleLogError,
    outage_said,
)
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.framing import FramingError
from dsh_schedule.shared.core.ledger import LedgerView, Pair, ledger_of
from dsh_schedule.shared.core.records import encode_change
from dsh_schedule.shared.failpoints import Failpoint, reach
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import (
    FENCE_ATTEMPTS,
    LogTransactions,
    Read,
    retry_fenced_many,
)
from dsh_schedule.worker.outcome import WakeOutcome as WakeOutcome
from dsh_schedule.worker.retry import RETRIED, WakeRetries

log = logging.getLogger(__name__)

MAX_ROUNDS: Final = 64


class Stage(Enum):
    """Where a going agent's wake stands within its round; an agent whose wake ended is
    no longer going (``_Batch.outcomes`` says how it ended)."""

    CHECK = "check"  # to flush, read, re-project and decide
    RECHECK = "recheck"  # just dispatched past its barrier: read and decide (no flush)
    DUE = "due"  # a dispatch is due: claim, write, append
    APPENDED = "appended"  # the dispatch is in the log: the barrier flush confirms it


class Due(msgspec.Struct, frozen=True, kw_only=True):
    """An agent found due: the read it decided on, fenced at its length."""

    agent: str
    read: Read
    decision: DispatchOne | DispatchBatch
    decided_ms: int


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """A due agent's dispatch, framed and ready to write."""

    due: Due
    plan: DispatchPlan

    @property
    def agent(self) -> str:
        return self.due.agent


class _Batch:
    """Where each agent of a batch stands: going (at a ``Stage``) or ended (its
    outcome), the fold each settled agent re-arms from, and who is to be announced."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.agents = list(agents)
        self.going: dict[str, Stage] = dict.fromkeys(agents, Stage.CHECK)
        self.outcomes: dict[str, WakeOutcome] = {}
        self.settled: dict[str, FoldState] = {}
        self.announce: set[str] = set()  # told of their followups once let go

    def at(self, stage: Stage) -> list[str]:
        return [agent for agent, at in self.going.items() if at is stage]

    def stop(self, agent: str, outcome: WakeOutcome) -> None:
        self.going.pop(agent, None)
        self.outcomes[agent] = outcome


class DueOwner:
    """Performs due transactions for agents whose sessions live in ``store``."""

    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        settings: Settings,
        *,
        clock: Clock,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._coord = coordination
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._tx = LogTransactions(store, coordination, clock)
        # The agents whose wake batch failed on Redis, maybe after a durable dispatch: the
        # worker's beat repays them once Redis answers (docs/architecture.md#owed-re-arms).
        self.owed = self._tx.owed
        # The agents whose own wake failed, owed a retry with backoff (worker/retry.py).
        self.retries = WakeRetries()

    def wake(self, agent: str, target_ms: int | None) -> WakeOutcome:
        """Handle one wake (a batch of one): stale and duplicate wakes find nothing due
        and return.

        Lines logged meanwhile carry the agent; the wake's outcome and duration are
        recorded in the metrics (docs/architecture.md#operations)."""
        with log_context(agent=agent):
            return self.wake_many([(agent, target_ms)])[agent]

    def wake_many(
        self, wakes: Sequence[tuple[str, int | None]]
    ) -> dict[str, WakeOutcome]:
        """Many wakes as one batched due transaction
        (docs/architecture.md#batched-due-transactions).

        Each agent is decided exactly as ``wake`` decides it, under its own lock and
        phase, after its own preflight, with its own fenced append and barrier; what the
        batch shares are the round trips to Redis (liveness, locks, phase claims and
        releases, followup writes, re-arms: one pipelined call each, whatever the batch's
        size). An agent whose lock is busy is then woken alone, waiting for its lock as
        ``wake`` does. The first wake of an agent named twice counts.
        """
        targets: dict[str, int | None] = {}
        for agent, target_ms in wakes:
            targets.setdefault(agent, target_ms)
        recorder = metrics.get()
        started = time.perf_counter()
        try:
            outcomes = self._wake_live(targets)
        except redis.RedisError as exc:
            # The records stay active, maybe with a dispatch appended and its re-arm lost:
            # this worker owes each agent a wake, and repays it once Redis answers.
            self.owed.owe(targets)
            recorder.redis_error()
            log.warning("wake batch of %d: Redis unavailable (%s)", len(targets),
                        type(exc).__name__)
            outcomes = dict.fromkeys(targets, WakeOutcome.REDIS_UNAVAILABLE)
        except JobTimeoutException:
            # rq's job timeout: owed a retry like any failure, and rq ends the job.
            self._owe_retries(dict.fromkeys(targets, WakeOutcome.FAILED))
            raise
        except Exception:
            log.exception("wake batch of %d failed", len(targets))
            outcomes = dict.fromkeys(targets, WakeOutcome.FAILED)
        self._owe_retries(outcomes)
        elapsed = time.perf_counter() - started
        for outcome in outcomes.values():
            recorder.due_transaction(elapsed)  # each agent's transaction took the batch's
            recorder.wake(outcome.value)
        return {agent: outcomes[agent] for agent in targets}

    def repay_owed(self) -> list[str]:
        """Enqueue a wake for every agent a failed batch left owed one, whose retry is
        due (nothing is sent when none is); a Redis failure keeps them owed for the next
        call."""
        return self._tx.repay_owed(quietly=True, now_ms=self._clock())

    def _owe_retries(self, outcomes: dict[str, WakeOutcome]) -> None:
        """Owe every agent whose wake failed on its own a retry, with backoff
        (``worker/retry.py``): its records stay active with no wake armed for them."""
        failed = [agent for agent, outcome in outcomes.items() if outcome in RETRIED]
        self.retries.ended(agent for agent, outcome in outcomes.items()
                           if outcome not in RETRIED
                           and outcome is not WakeOutcome.REDIS_UNAVAILABLE)
        if not failed:
            return
        now = self._clock()
        delays = [self.retries.failed(agent) for agent in failed]
        for agent, delay in zip(failed, delays, strict=True):
            self.owed.owe([agent], from_ms=now + int(delay * 1000))
        log.info("%d agent(s) owed a wake again after a failure, in %g s at most",
                 len(failed), max(delays))

    def _wake_live(self, targets: dict[str, int | None]) -> dict[str, WakeOutcome]:
        """The live agents' transactions, their free locks taken together, then each busy
        one alone, waiting for its lock; the others are not live."""
        live = self._coord.live_agents(list(targets), self._clock())
        outcomes = {agent: WakeOutcome.NOT_LIVE for agent in targets if agent not in live}
        for agent in outcomes:
            log.info("wake for %s: not live (no host holds a valid lease on it); the host "
                     "that installs it again wakes it", agent)
        order = [agent for agent in targets if agent in live]
        timed = [(target, agent) for agent in order if (target := targets[agent]) is not None]
        if timed:
            latest, agent = max(timed)
            self._sleep_out_skew(agent, latest)
        busy = self._tx.each_held(
            order, lambda held: self._transact(held, outcomes),
            wait_s=self._settings.wake_lock_wait_s, released=self._announce)
        for agent in busy:
            log.debug("wake for %s: lock busy, the holder re-arms", agent)
            outcomes[agent] = WakeOutcome.LOCK_BUSY
        return {agent: outcomes.get(agent, WakeOutcome.FAILED) for agent in targets}

    def _sleep_out_skew(self, agent: str, target_ms: int) -> None:
        """Sleep out a scheduled wake that arrives less than ``early_sleep_s`` before its
        target by this worker's clock; one further away goes on, finds nothing due and
        re-arms.

        The mover hands a wake on only once its exact target has come on the clock every
        process shares, Redis's (docs/architecture.md#wake-projection), and this worker
        reads the same clock, so this sleeps at most the few milliseconds by which two
        processes' readings of it differ (a round trip), or a wake of an injected clock:
        without it, such a wake would re-arm a target the mover already counts as due and
        come back on every mover pass. It is never what keeps a
        dispatch from being early: the due decision re-reads the clock under the lock.
        """
        early_ms = target_ms - self._clock()
        if 0 < early_ms < self._settings.early_sleep_s * 1000:
            log.debug("wake for %s arrived %d ms early by this clock: sleeping it out",
                      agent, early_ms)
            self._sleep(early_ms / 1000)

    def _transact(self, agents: list[str], outcomes: dict[str, WakeOutcome]) -> list[str]:
        """The rounds of these agents' transactions, their locks held, then the re-arm of
        those that settled; notes each one's outcome, and returns the agents to announce
        once they are let go."""
        if len(agents) == 1:  # a busy agent woken alone: its lines carry it
            with log_context(agent=agents[0]):
                return self._rounds(agents, outcomes)
        return self._rounds(agents, outcomes)

    def _rounds(self, agents: list[str], outcomes: dict[str, WakeOutcome]) -> list[str]:
        batch = _Batch(agents)
        for _ in range(MAX_ROUNDS):
            if not batch.going:
                break
            self._dispatch(self._check(batch), batch)
        for agent in list(batch.going):
            log.warning("wake for %s: still due after %d rounds", agent, MAX_ROUNDS)
            batch.stop(agent, WakeOutcome.STILL_DUE)
        outcomes.update(batch.outcomes)
        self._tx.rearm_many([(agent, batch.settled[agent]) for agent in agents
                             if batch.outcomes[agent] is WakeOutcome.SETTLED])
        return [agent for agent in agents if agent in batch.announce
                or batch.outcomes[agent] is WakeOutcome.BARRIER_FAILED]

    def _announce(self, agents: Sequence[str]) -> None:
        """Announce to their hosts the agents with followups to deliver, now that the
        transaction has let them go: a host told earlier would find the agent still held
        and come back a second later. A lost announcement costs time, never a reminder:
        the entry waits in its stream, the agent's next wake announces it again (it has
        an undelivered dispatch), and so does a re-arm once the entry is stale."""
        try:
            self._coord.announce(agents)
        except redis.RedisError as exc:
            metrics.get().redis_error()
            log.warning("%d dispatched agent(s) not announced (%s); their followups wait "
                        "in their streams", len(agents), type(exc).__name__)

    # -- check: read the log and decide ------------------------------------------------

    def _check(self, batch: _Batch) -> list[Due]:
        """Read and decide each going agent once: an agent that just dispatched past its
        barrier is read on this worker's own view of its log, the rest after a preflight
        flush and a re-projection of their lost followups. Returns the agents found due;
        the others are settled or stopped."""
        reads = self._reread(batch)
        checked = self._preflight(batch)
        self._reproject(checked, batch)
        reads.update((agent, read) for agent, (read, _ledger) in checked.items())
        now = self._clock()
        due: list[Due] = []
        for agent in list(batch.going):
            if (read := reads.get(agent)) is None:
                continue
            decision = due_decision(read.state, now)
            if isinstance(decision, Wait):
                batch.settled[agent] = read.state
                batch.stop(agent, WakeOutcome.SETTLED)
            else:
                batch.going[agent] = Stage.DUE
                due.append(Due(agent=agent, read=read, decision=decision, decided_ms=now))
        return due

    def _reread(self, batch: _Batch) -> dict[str, Read]:
        """The read after a dispatch whose barrier flush just succeeded, the agent's lock
        still held. No second preflight flush and no re-projection: the barrier confirmed
        this worker's bytes, the followups were written just before them, and only
        ``schedule/change`` records, appended under the lock this worker holds, change
        the decision. An agent whose log cannot be read now gets the full check."""
        reads: dict[str, Read] = {}
        for agent in batch.at(Stage.RECHECK):
            try:
                reads[agent] = self._tx.load(agent)
            except (PersistenceError, ScheduleLogError):
                batch.going[agent] = Stage.CHECK
        return reads

    def _preflight(self, batch: _Batch) -> dict[str, tuple[Read, LedgerView]]:
        """The flushed log of each agent to check, and its ledger (what it dispatched and
        has not delivered), the flushes together; a failure stops its agent alone."""
        checked: dict[str, tuple[Read, LedgerView]] = {}
        for agent, read in self._tx.preflight(batch.at(Stage.CHECK)).items():
            with log_context(agent=agent):
                outcome = self._unread(agent, read)
                if outcome is None:
                    assert isinstance(read, Read)
                    try:
                        checked[agent] = (read, ledger_of(read.session))
                    except ScheduleLogError as exc:
                        log.error("cannot re-project followups for %s: %s", agent, exc)
                        outcome = WakeOutcome.CORRUPT_LOG
                    except Exception:
                        log.exception("wake for %s failed", agent)  # spares the rest
                        outcome = WakeOutcome.FAILED
            if outcome is not None:
                batch.stop(agent, outcome)
        return checked

    @staticmethod
    def _unread(agent: str, read: Read | Exception) -> WakeOutcome | None:
        """How a failed preflight ends the agent's wake (None: it read)."""
        if isinstance(read, PersistenceError):
            log.log(_level(read), "due preflight for %s failed: %s", agent, read.reason)
            return WakeOutcome.PREFLIGHT_FAILED
        if isinstance(read, ScheduleLogError):
            log.error("corrupt schedule log for %s, arming nothing: %s", agent, read)
            return WakeOutcome.CORRUPT_LOG
        if isinstance(read, Exception):
            log.error("wake for %s failed", agent, exc_info=read)  # spares the rest
            return WakeOutcome.FAILED
        return None

    def _reproject(self, checked: dict[str, tuple[Read, LedgerView]], batch: _Batch) -> None:
        """Re-add every lost followup of these agents
        (docs/architecture.md#hosts-followups-and-rebuild): a dispatch in the agent's own
        suffix that no delivered message covers and no stream entry holds gets its
        followup re-added, rendered from the prompts the ledger kept of it by the same
        renderer a dispatch uses, so it is byte-identical to the original frame. One
        pipelined read of the streams of the agents with an undelivered dispatch, one
        script call writing what is missing, unannounced: an agent with an undelivered
        dispatch is announced once let go (a host may have missed it, as when a worker
        died before announcing)."""
        undelivered = [(agent, ledger, missing) for agent, (_read, ledger) in checked.items()
                       if (missing := ledger.undelivered())]
        if not undelivered:
            return
        streams = self._coord.followup_entries([a for a, _l, _m in undelivered])
        lost: list[tuple[str, str, Sequence[Pair]]] = []
        for (agent, ledger, missing), entries in zip(undelivered, streams, strict=True):
            batch.announce.add(agent)
            held: set[Pair] = {p for entry in entries for p in entry.pairs}
            added = [(agent, pending_frame(ledger, group), group.pairs)
                     for group in missing if not any(p in held for p in group.pairs)]
            if added:
                metrics.get().delivery("reprojected", len(added))
                log.info("re-projected %d lost followup(s) for %s", len(added), agent)
            lost.extend(added)
        self._coord.write_followups(lost)

    # -- dispatch: claim, write, append, release, confirm --------------------------------

    def _dispatch(self, due: list[Due], batch: _Batch) -> None:
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

    def _append_fenced(self, due: list[Due], batch: _Batch) -> list[str]:
        """Write each agent's followup, then append its dispatch fenced at the length it
        decided on; returns the agents appended. An agent whose append met another writer
        decides again once that writer's suffix is confirmed, the way a tool retries
        (``FENCE_ATTEMPTS`` attempts in all); its followup written before stays without a
        dispatch, and the host drops it."""
        appended: list[str] = []

        def attempt(n: int, due: list[Due]) -> list[Due]:
            if n:
                due = self._redecide(due, batch)
            return self._write_and_append(self._plan(due, batch), batch, appended)

        for d in retry_fenced_many(due, attempt):
            log.warning("dispatch for %s: the log kept moving under %d attempts",
                        d.agent, FENCE_ATTEMPTS)
            batch.stop(d.agent, WakeOutcome.DISPATCH_ABANDONED)
        return appended

    def _redecide(self, due: list[Due], batch: _Batch) -> list[Due]:
        """Confirm the conflicting writers' suffixes, read and decide again: the agents
        still due. One found with nothing due any more gets the full check next round."""
        reads = self._tx.preflight([d.agent for d in due])
        now = self._clock()
        still: list[Due] = []
        for d in due:
            read = reads[d.agent]
            if isinstance(read, (PersistenceError, ScheduleLogError)):
                with log_context(agent=d.agent):
                    log.log(_level(read), "re-fold for %s failed: %s", d.agent, read)
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

    def _plan(self, due: list[Due], batch: _Batch) -> list[Planned]:
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
        self, planned: list[Planned], batch: _Batch, appended: list[str]
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
        conflicted: list[Due] = []
        for p in planned:
            schedule_ids = ",".join(pair.scheduleId for pair in p.plan.pairs)
            with log_context(agent=p.agent, schedule_id=schedule_ids):
                if self._append(p, batch):
                    conflicted.append(p.due)
                elif batch.going.get(p.agent) is Stage.APPENDED:
                    appended.append(p.agent)
                    self._record_dispatch(p, written_ms)
        return conflicted

    def _append(self, planned: Planned, batch: _Batch) -> bool:
        """The fenced append of one agent's dispatch: ``APPENDED`` once written, stopped
        when abandoned; True when another writer came between."""
        agent, due = planned.agent, planned.due
        events = [NewEvent(type=SCHEDULE_CHANGE, time=due.decided_ms, data=encode_change(c))
                  for c in planned.plan.changes]
        try:
            self._tx.append(agent, due.read, events)
        except FenceConflict as conflict:
            log.info("dispatch for %s: fence conflict (%s), re-deciding", agent, conflict)
            return True
        except Exception as exc:  # the disk, a bound: this agent's own failure
            # The followup may already be read; with no dispatch the host drops it.
            log.log(_level(exc, logging.ERROR), "dispatch append for %s abandoned: %s",
                    agent, exc)
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

    def _barrier(self, agents: list[str], batch: _Batch) -> None:
        """The barrier flushes, together: a dispatch confirmed is checked again next
        round; one whose flush failed stops its agent (its host confirms it with its own
        flush before delivering)."""
        failed = self._tx.barrier(agents)
        for agent in agents:
            if agent in failed:
                log.log(_level(failed[agent]), "dispatch barrier for %s failed: %s", agent,
                        failed[agent].reason)
                batch.stop(agent, WakeOutcome.BARRIER_FAILED)
            else:
                batch.going[agent] = Stage.RECHECK


def _level(exc: BaseException, level: int = logging.WARNING) -> int:
    """A wake's store failure is said per agent, unless the store said its outage."""
    return logging.DEBUG if outage_said(exc) else level
