"""The due transaction: a wake's work (docs/architecture.md#the-due-transaction), performed
for a batch of wakes at once (docs/architecture.md#batched-due-transactions); a single wake
is a batch of one.

Each agent of a batch is one ``AgentWake`` record moving through named ``Stage``s, one
way: checked (flushed, read, re-projected, decided), then, when a dispatch is due, claimed
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
from dsh_schedule.shared.coordination.clock import LIVE_SLACK_MS
from dsh_schedule.shared.coordination.owed import OwedRearms
from dsh_schedule.shared.coordination.phase import Release
from dsh_schedule.shared.core.dispatch import DispatchPlan, pending_frame, plan_dispatch
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import (
    FenceConflict,
    PersistenceError,
    ScheduleLogError,
    outage_said,
)
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, Session
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.framing import FramingError
from dsh_schedule.shared.core.ledger import LedgerView, Pair, ledger_of
from dsh_schedule.shared.core.records import encode_change
from dsh_schedule.shared.failpoints import Failpoint, reach
from dsh_schedule.shared.fencing import FENCE_ATTEMPTS
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.flushing import flush_each
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.outcome import WakeOutcome as WakeOutcome
from dsh_schedule.worker.retry import RETRIED, WakeRetries

log = logging.getLogger(__name__)

MAX_ROUNDS: Final = 64


class Stage(Enum):
    """Where an agent's wake stands within its round."""

    CHECK = "check"  # flush, read, re-project and decide
    RECHECK = "recheck"  # just dispatched past its barrier: read and decide (no flush)
    DUE = "due"  # a dispatch is due: claim, write, append
    APPENDED = "appended"  # the dispatch is in the log: the barrier flush confirms it
    DONE = "done"  # ``outcome`` says how the wake ended


class AgentWake(msgspec.Struct, kw_only=True):
    """One agent's due transaction as it moves through the stages."""

    agent: str
    stage: Stage = Stage.CHECK
    session: Session | None = None
    state: FoldState | None = None
    ledger: LedgerView | None = None  # what the check found dispatched, undelivered
    decision: DispatchOne | DispatchBatch | None = None
    decided_ms: int = 0
    plan: DispatchPlan | None = None
    outcome: WakeOutcome | None = None
    announce: bool = False  # a host is to be told of its followups once it is let go

    def stop(self, outcome: WakeOutcome) -> None:
        self.stage, self.outcome = Stage.DONE, outcome


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
        # The agents whose wake batch failed on Redis, maybe after a durable dispatch: the
        # worker's beat repays them once Redis answers (docs/architecture.md#owed-re-arms).
        self.owed = OwedRearms()
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
        return self.owed.repay_quietly(self._coord, now_ms=self._clock())

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
        live = set(self._coord.leases.live_among(list(targets),
                                                 now_ms=self._clock() - LIVE_SLACK_MS))
        outcomes = {agent: WakeOutcome.NOT_LIVE for agent in targets if agent not in live}
        for agent in outcomes:
            log.info("wake for %s: not live (no host holds a valid lease on it); the host "
                     "that installs it again wakes it", agent)
        order = [agent for agent in targets if agent in live]
        timed = [(target, agent) for agent in order if (target := targets[agent]) is not None]
        if timed:
            latest, agent = max(timed)
            self._sleep_out_skew(agent, latest)
        wakes = {agent: AgentWake(agent=agent) for agent in order}
        busy = self._coord.locks.each_held(
            order, lambda held: self._transact([wakes[agent] for agent in held]),
            wait_s=self._settings.wake_lock_wait_s, released=self._announce)
        for agent in busy:
            log.debug("wake for %s: lock busy, the holder re-arms", agent)
            wakes[agent].stop(WakeOutcome.LOCK_BUSY)
        outcomes.update((agent, wake.outcome or WakeOutcome.FAILED)
                        for agent, wake in wakes.items())
        return outcomes

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

    def _transact(self, wakes: list[AgentWake]) -> list[str]:
        """The rounds of these agents' transactions, their locks held, then the re-arm of
        those that settled; returns the agents to announce once they are let go."""
        if len(wakes) == 1:  # a busy agent woken alone: its lines carry it
            with log_context(agent=wakes[0].agent):
                return self._rounds(wakes)
        return self._rounds(wakes)

    def _rounds(self, wakes: list[AgentWake]) -> list[str]:
        for _ in range(MAX_ROUNDS):
            going = [wake for wake in wakes if wake.stage is not Stage.DONE]
            if not going:
                break
            self._check(going)
            self._dispatch([wake for wake in going if wake.stage is Stage.DUE])
        for wake in wakes:
            if wake.stage is not Stage.DONE:
                log.warning("wake for %s: still due after %d rounds", wake.agent, MAX_ROUNDS)
                wake.stop(WakeOutcome.STILL_DUE)
        settled = [(wake.agent, wake.state) for wake in wakes
                   if wake.outcome is WakeOutcome.SETTLED and wake.state is not None]
        self._coord.rearm_many(settled, self._clock())
        return [wake.agent for wake in wakes
                if wake.announce or wake.outcome is WakeOutcome.BARRIER_FAILED]

    def _announce(self, agents: Sequence[str]) -> None:
        """Announce to their hosts the agents with followups to deliver, now that the
        transaction has let them go: a host told earlier would find the agent still held
        and come back a second later. A lost announcement costs time, never a reminder:
        the entry waits in its stream, the agent's next wake announces it again (it has
        an undelivered dispatch), and so does a re-arm once the entry is stale."""
        try:
            self._coord.followups.announce_many(agents)
        except redis.RedisError as exc:
            metrics.get().redis_error()
            log.warning("%d dispatched agent(s) not announced (%s); their followups wait "
                        "in their streams", len(agents), type(exc).__name__)

    # -- check: read the log and decide ------------------------------------------------

    def _check(self, wakes: list[AgentWake]) -> None:
        """Read and decide each agent once: an agent that just dispatched past its barrier
        is read on this worker's own view of its log, the rest after a preflight flush
        and a re-projection of their lost followups. Leaves each agent ``DUE``, settled,
        or stopped."""
        for wake in wakes:
            if wake.stage is Stage.RECHECK:
                self._reread(wake)
        checking = [wake for wake in wakes if wake.stage is Stage.CHECK]
        self._preflight(checking)
        self._reproject([wake for wake in checking if wake.stage is Stage.CHECK])
        now = self._clock()
        for wake in wakes:
            if wake.stage in (Stage.CHECK, Stage.RECHECK):
                self._decide(wake, now)

    def _reread(self, wake: AgentWake) -> None:
        """The read after a dispatch whose barrier flush just succeeded, the agent's lock
        still held. No second preflight flush and no re-projection: the barrier confirmed
        this worker's bytes, the followups were written just before them, and only
        ``schedule/change`` records, appended under the lock this worker holds, change
        the decision. An agent whose log cannot be read now gets the full check."""
        try:
            wake.session, wake.state = self._store.load(wake.agent)
        except (PersistenceError, ScheduleLogError):
            wake.stage = Stage.CHECK

    def _preflight(self, wakes: list[AgentWake]) -> None:
        """The flushed log of each agent, the flushes together. A failed one stops its
        agent: a flush that succeeds after a failed one does not prove the earlier bytes
        durable."""
        unflushed = flush_each(self._store, [wake.agent for wake in wakes])
        for wake in wakes:
            with log_context(agent=wake.agent):
                try:
                    self._load(wake, unflushed.get(wake.agent))
                except redis.RedisError:
                    raise  # every other agent of the batch needs Redis too
                except Exception:
                    log.exception("wake for %s failed", wake.agent)  # spares the rest
                    wake.stop(WakeOutcome.FAILED)

    def _load(self, wake: AgentWake, flush_failure: PersistenceError | None) -> None:
        agent = wake.agent
        try:
            if flush_failure is not None:
                raise flush_failure
            wake.session, wake.state = self._store.load(agent)
        except PersistenceError as exc:
            log.log(_level(exc), "due preflight for %s failed: %s", agent, exc.reason)
            wake.stop(WakeOutcome.PREFLIGHT_FAILED)
            return
        except ScheduleLogError as exc:
            log.error("corrupt schedule log for %s, arming nothing: %s", agent, exc)
            wake.stop(WakeOutcome.CORRUPT_LOG)
            return
        try:
            wake.ledger = ledger_of(wake.session)  # a corrupt one stops here
        except ScheduleLogError as exc:
            log.error("cannot re-project followups for %s: %s", agent, exc)
            wake.stop(WakeOutcome.CORRUPT_LOG)

    def _reproject(self, wakes: list[AgentWake]) -> None:
        """Re-add every lost followup of these agents
        (docs/architecture.md#hosts-followups-and-rebuild): a dispatch in the agent's own
        suffix that no delivered message covers and no stream entry holds gets its
        followup re-added, rendered from the prompts the ledger kept of it by the same
        renderer a dispatch uses, so it is byte-identical to the original frame. One
        pipelined read of the streams of the agents with an undelivered dispatch, one
        script call writing what is missing, unannounced: an agent with an undelivered
        dispatch is announced once let go (a host may have missed it, as when a worker
        died before announcing)."""
        undelivered = [(wake, ledger, missing) for wake in wakes
                       if (ledger := wake.ledger) and (missing := ledger.undelivered())]
        if not undelivered:
            return
        streams = self._coord.followups.entries_many([w.agent for w, _l, _m in undelivered])
        lost: list[tuple[str, str, Sequence[Pair]]] = []
        for (wake, ledger, missing), entries in zip(undelivered, streams, strict=True):
            wake.announce = True
            held: set[Pair] = {p for entry in entries for p in entry.pairs}
            added = [(wake.agent, pending_frame(ledger, group), group.pairs)
                     for group in missing if not any(p in held for p in group.pairs)]
            if added:
                metrics.get().delivery("reprojected", len(added))
                log.info("re-projected %d lost followup(s) for %s", len(added), wake.agent)
            lost.extend(added)
        self._coord.followups.add_many(lost)

    def _decide(self, wake: AgentWake, now: int) -> None:
        assert wake.state is not None
        decision = due_decision(wake.state, now)
        if isinstance(decision, Wait):
            wake.stop(WakeOutcome.SETTLED)
        else:
            wake.stage, wake.decision, wake.decided_ms = Stage.DUE, decision, now

    # -- dispatch: claim, write, append, release, confirm --------------------------------

    def _dispatch(self, wakes: list[AgentWake]) -> None:
        """Claim maintenance, dispatch once, release, then the barrier flush
        (docs/architecture.md#the-due-transaction, steps 6 to 8), for every agent found
        due: their phases claimed and released in one round trip each, their followups
        written in one. An agent that dispatched and passed its barrier is checked again
        next round; one that found nothing due any more gets the full check."""
        if not wakes:
            return
        token = uuid.uuid4().hex
        phase = self._coord.phase
        agents = [wake.agent for wake in wakes]
        claimed = phase.claim_many(agents, "maintenance", token,
                                   self._settings.maintenance_ttl_s)
        held: list[AgentWake] = []
        for wake, ok in zip(wakes, claimed, strict=True):
            if ok:
                held.append(wake)
            else:
                log.debug("agent %s busy: idle waiter registered", wake.agent)
                wake.stop(WakeOutcome.WAITING_FOR_IDLE)
        if not held:
            return
        try:
            live = set(self._coord.leases.live_among([w.agent for w in held],
                                                     now_ms=self._clock() - LIVE_SLACK_MS))
            for wake in held:
                if wake.agent not in live:
                    wake.stop(WakeOutcome.NOT_LIVE)
            self._append_fenced([wake for wake in held if wake.stage is Stage.DUE])
        finally:
            released = phase.release_many([w.agent for w in held], "maintenance", token)
            woken = [wake.agent for wake, release in zip(held, released, strict=True)
                     if release is Release.WAITER_WOKEN]
            if woken:
                self._coord.trigger_many(woken)
        self._barrier([wake for wake in held if wake.stage is Stage.APPENDED])

    def _append_fenced(self, wakes: list[AgentWake]) -> None:
        """Write each agent's followup, then append its dispatch fenced at the length it
        decided on. An agent whose append met another writer decides again once that
        writer's suffix is confirmed, the way a tool retries (``FENCE_ATTEMPTS`` attempts
        in all); its followup written before stays without a dispatch, and the host
        drops it."""
        for attempt in range(FENCE_ATTEMPTS):
            if attempt:
                wakes = self._redecide(wakes)
            self._plan(wakes)
            wakes = self._write_and_append([w for w in wakes if w.stage is Stage.DUE])
            if not wakes:
                return
        for wake in wakes:
            log.warning("dispatch for %s: the log kept moving under %d attempts",
                        wake.agent, FENCE_ATTEMPTS)
            wake.stop(WakeOutcome.DISPATCH_ABANDONED)

    def _redecide(self, wakes: list[AgentWake]) -> list[AgentWake]:
        """Confirm the conflicting writers' suffixes, read and decide again: the agents
        still due. One found with nothing due any more gets the full check next round."""
        unflushed = flush_each(self._store, [wake.agent for wake in wakes])
        now = self._clock()
        for wake in wakes:
            with log_context(agent=wake.agent):
                try:
                    if wake.agent in unflushed:
                        raise unflushed[wake.agent]
                    wake.session, wake.state = self._store.load(wake.agent)
                except (PersistenceError, ScheduleLogError) as exc:
                    log.log(_level(exc), "re-fold for %s failed: %s", wake.agent, exc)
                    wake.stop(WakeOutcome.DISPATCH_ABANDONED)
                    continue
            assert wake.state is not None
            decision = due_decision(wake.state, now)
            if isinstance(decision, Wait):
                wake.stage = Stage.CHECK  # nothing due any more: the next check settles it
            else:
                wake.decision, wake.decided_ms = decision, now
        return [wake for wake in wakes if wake.stage is Stage.DUE]

    def _plan(self, wakes: list[AgentWake]) -> None:
        """Frame each agent's dispatch; one that cannot be framed writes nothing."""
        for wake in wakes:
            assert wake.decision is not None
            try:
                wake.plan = plan_dispatch(wake.decision)
            except FramingError:
                with log_context(agent=wake.agent):
                    log.exception("framing failed for %s; nothing written", wake.agent)
                wake.stop(WakeOutcome.DISPATCH_ABANDONED)

    def _write_and_append(self, wakes: list[AgentWake]) -> list[AgentWake]:
        """The followups to Redis in one call, before any append; then each dispatch's
        fenced append. Returns the agents whose append met another writer."""
        if not wakes:
            return []
        reach(Failpoint.BEFORE_FOLLOWUP)
        # Announced once the transaction lets the agents go (``_announce``).
        self._coord.followups.add_many([(wake.agent, plan.text, plan.pairs)
                                        for wake in wakes if (plan := wake.plan)])
        written_ms = self._clock()
        reach(Failpoint.AFTER_FOLLOWUP)
        conflicted: list[AgentWake] = []
        for wake in wakes:
            assert wake.plan is not None
            schedule_ids = ",".join(pair.scheduleId for pair in wake.plan.pairs)
            with log_context(agent=wake.agent, schedule_id=schedule_ids):
                if self._append(wake, written_ms):
                    conflicted.append(wake)
        return conflicted

    def _append(self, wake: AgentWake, written_ms: int) -> bool:
        """The fenced append of one agent's dispatch: ``APPENDED`` once written, stopped
        when abandoned; True when another writer came between."""
        assert wake.plan is not None and wake.session is not None
        agent, plan = wake.agent, wake.plan
        events = [NewEvent(type=SCHEDULE_CHANGE, time=wake.decided_ms, data=encode_change(c))
                  for c in plan.changes]
        try:
            self._store.append(agent, events, expected_seq=len(wake.session.events))
        except FenceConflict as conflict:
            log.info("dispatch for %s: fence conflict (%s), re-deciding", agent, conflict)
            return True
        except Exception as exc:  # the disk, a bound: this agent's own failure
            # The followup may already be read; with no dispatch the host drops it.
            log.log(_level(exc, logging.ERROR), "dispatch append for %s abandoned: %s",
                    agent, exc)
            wake.stop(WakeOutcome.DISPATCH_ABANDONED)
            return False
        reach(Failpoint.AFTER_APPEND)
        wake.stage, wake.announce = Stage.APPENDED, True
        self._record_dispatch(wake, written_ms)
        return False

    def _record_dispatch(self, wake: AgentWake, written_ms: int) -> None:
        assert wake.plan is not None
        pairs = wake.plan.pairs
        recorder = metrics.get()
        if recorder.enabled:
            kind = "one-shot" if isinstance(wake.decision, DispatchOne) else "batch"
            recorder.dispatched(kind, metrics.lateness_s(
                written_ms, [pair.occurrenceAt for pair in pairs]))
        log.info("dispatched %s for %s", ", ".join(pair.scheduleId for pair in pairs),
                 wake.agent)

    def _barrier(self, wakes: list[AgentWake]) -> None:
        """The barrier flushes, together: a dispatch confirmed is checked again next
        round; one whose flush failed stops its agent (its host confirms it with its own
        flush before delivering)."""
        failed = flush_each(self._store, [wake.agent for wake in wakes])
        for wake in wakes:
            if wake.agent in failed:
                log.log(_level(failed[wake.agent]), "dispatch barrier for %s failed: %s",
                        wake.agent, failed[wake.agent].reason)
                wake.stop(WakeOutcome.BARRIER_FAILED)
            else:
                wake.stage = Stage.RECHECK


def _level(exc: BaseException, level: int = logging.WARNING) -> int:
    """A wake's store failure is said per agent, unless the store said its outage."""
    return logging.DEBUG if outage_said(exc) else level
