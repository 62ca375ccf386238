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
decided, fenced and flushed on its own (the check stage: ``worker/due_check.py``; the dispatch
stage: ``worker/due_dispatch.py``). The log stays the authority: followups are
written before the fenced dispatch append, so a crash can only leave an entry without a
dispatch (the host drops it) or a dispatch without an entry (re-projection re-adds it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Final

import redis
from rq.timeouts import JobTimeoutException

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import (
    LogTransactions,
)
from dsh_schedule.worker.due_check import DueCheck, WakeBatch
from dsh_schedule.worker.due_dispatch import DueDispatch
from dsh_schedule.worker.outcome import WakeOutcome as WakeOutcome
from dsh_schedule.worker.retry import RETRIED, RETRY_MAX_S, WakeRetries

log = logging.getLogger(__name__)

MAX_ROUNDS: Final = 64


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
        self._checks = DueCheck(coordination, self._tx, settings, clock=clock)
        self._dispatches = DueDispatch(coordination, self._tx, settings, clock=clock)
        # The agents whose wake batch failed on Redis, maybe after a durable dispatch: the
        # worker's beat repays them once Redis answers (docs/architecture.md#owed-re-arms).
        self.owed = self._tx.owed
        # The agents whose own wake failed, owed a retry with backoff (worker/retry.py).
        self.retries = WakeRetries()

    def wake(self, wakes: Sequence[tuple[str, int | None]]) -> dict[str, WakeOutcome]:
        """``(agent, target)`` wakes as one batched due transaction, each agent's outcome
        (docs/architecture.md#batched-due-transactions); stale and duplicate wakes find
        nothing due and return.

        Each agent is decided under its own lock and phase, after its own preflight, with
        its own fenced append and barrier; what the batch shares are the round trips to
        Redis (liveness, locks, phase claims and releases, followup writes, re-arms: one
        pipelined call each, whatever the batch's size). An agent whose lock is busy is
        then woken alone, waiting for its lock. The first wake of an agent named twice
        counts. Lines logged by a wake of one agent carry it; each outcome and duration is
        recorded in the metrics (docs/architecture.md#operations).
        """
        if len(wakes) == 1:
            with log_context(agent=wakes[0][0]):
                return self._wake(wakes)
        return self._wake(wakes)

    def _wake(self, wakes: Sequence[tuple[str, int | None]]) -> dict[str, WakeOutcome]:
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
        batch = WakeBatch(agents)
        for _ in range(MAX_ROUNDS):
            if not batch.going:
                break
            self._dispatches.dispatch(self._checks.check(batch), batch)
        for agent in list(batch.going):
            log.warning("wake for %s: still due after %d rounds", agent, MAX_ROUNDS)
            batch.stop(agent, WakeOutcome.STILL_DUE)
        outcomes.update(batch.outcomes)
        self._coord.rearm([(agent, batch.settled[agent]) for agent in agents
                           if batch.outcomes[agent] is WakeOutcome.SETTLED], self._clock())
        # A failed agent's retry is owed in this worker's memory (``_owe_retries``), lost
        # if it dies: a wake RETRY_MAX_S on stands for it in Redis meanwhile, superseded by
        # the retry's own re-arm.
        failed = [agent for agent in agents if batch.outcomes[agent] in RETRIED]
        if failed:
            now = self._clock()
            last = now + int(RETRY_MAX_S * 1000)
            self._coord.wakes.arm_at([(agent, last) for agent in failed], now)
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
