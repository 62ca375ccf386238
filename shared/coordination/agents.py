"""The Redis coordination of one deployment: every adapter, built from one client.

Redis only coordinates: every key here can be deleted and rebuilt from the session logs
(docs/architecture.md#delivery). This is the entry point a host or a process builds once;
the transactions receive it beside their ``Settings``, which it does not hand out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import redis
from rq.job import Job

from dsh_schedule.shared.coordination.followups import Followups, stream_id_ms
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import Leases
from dsh_schedule.shared.coordination.lock import AgentLocks, HeldLock, LockUnavailable
from dsh_schedule.shared.coordination.phase import AgentPhase
from dsh_schedule.shared.coordination.scripts import (
    batch_replies,
    queue_script_batch,
    run_script_batch,
)
from dsh_schedule.shared.coordination.wake import (
    ArmFacts,
    ArmRequest,
    WakeProjection,
)
from dsh_schedule.shared.coordination.workers import WorkerLiveness
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)


# KEYS[1] the agent-host hash, KEYS[2] the lease-queue hash, KEYS[3] the agent's followup
# stream, KEYS[4] the hosts zset; ARGV[1] the agent. Returns {the expiry of its host's
# lease, its lease's queue, the id of its oldest followup entry}, each false when absent.
_LEASE_AND_OLDEST = """
local oldest = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1)[1]
local host = redis.call('HGET', KEYS[1], ARGV[1])
return {host and redis.call('ZSCORE', KEYS[4], host) or false,
        redis.call('HGET', KEYS[2], ARGV[1]), oldest and oldest[1] or false}
"""


# KEYS[1] an agent's current-wake pointer, KEYS[2] its followup stream, KEYS[3] the
# schedule; ARGV[1] the prefix of rq's job keys. Returns {the current wake, the id of the
# oldest followup entry, 1 when the wake is in the schedule or its job hash exists}, the
# first two false when absent.
_PROJECTION = """
local wake = redis.call('GET', KEYS[1])
local first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
local held = 0
if wake and (redis.call('ZSCORE', KEYS[3], wake)
             or redis.call('EXISTS', ARGV[1] .. wake) == 1) then
  held = 1
end
return {wake, first and first[1] or false, held}
"""


class Projection(NamedTuple):
    """What Redis holds for one agent's wake and followups, as the reconcile pass checks it.

    ``wake``: the current-wake pointer (None: no current wake). ``wake_held``: that wake's
    job is in the schedule or its rq job hash exists. ``oldest_followup_ms``: when (server
    epoch ms) the oldest entry still in its followup stream was added (None: empty).
    """

    wake: str | None
    wake_held: bool
    oldest_followup_ms: int | None


class Coordination:
    """Locks, phase, leases, followups, wakes and worker liveness under one key
    prefix."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.keys = Keys(settings.prefix)
        self.locks = AgentLocks(client, self.keys, ttl_s=settings.lock_ttl_s)
        self.phase = AgentPhase(client, self.keys)
        self.leases = Leases(client, self.keys, default_queue=settings.queue)
        self.followups = Followups(client, self.keys)
        self.wakes = WakeProjection(client, self.keys)
        self.workers = WorkerLiveness(client, self.keys)
        self.followup_stale_ms = int(settings.followup_stale_s * 1000)

    def rearm(
        self, agent: str, state: FoldState, now_ms: int, *, release: HeldLock | None = None
    ) -> str | None:
        """The owner's recompute: arm the agent's wake at its next decision time.

        Only a live agent is armed, on the queue its lease names. Hold the agent's lock;
        with ``release``, the lock is released in the arm's own write.
        """
        return self.rearm_many([(agent, state)], now_ms, release=release)[0]

    def rearm_many(
        self, folds: Sequence[tuple[str, FoldState]], now_ms: int, *,
        release: HeldLock | None = None,
    ) -> list[str | None]:
        """``rearm`` for many agents; hold every agent's lock. Each agent's current wake
        id (None: not live, or nothing to wake for).

        Re-arming also restores the other half of the followup projection: a live agent
        whose stream still holds an entry older than ``followup_stale_s`` is announced
        again on its queue's ready stream (its first announcement, or the host holding it,
        was lost), so the reconcile pass repairs a lost announcement by enqueueing a wake.
        """
        if not folds:
            return []
        targets = [(agent, next_wake_ms(state, now_ms)) for agent, state in folds]
        # One read for everything arming and announcing need: the server's clock, and per
        # agent its lease and queue, its oldest followup entry (one script call per
        # hundred agents), its current wake (``queue_arm_facts``).
        hosts, agent_host = self.keys.hosts(), self.keys.agent_host()
        lease_queue = self.keys.lease_queue()
        with self.client.pipeline(transaction=False) as pipe:
            pipe.time()
            calls = queue_script_batch(pipe, _LEASE_AND_OLDEST, [
                ([agent_host, lease_queue, self.keys.followups(agent), hosts], [agent])
                for agent, _target in targets
            ])
            fact_calls = self.wakes.queue_arm_facts(pipe, targets)
            replies = iter(pipe.execute())
        seconds, micros = next(replies)
        server_ms = int(seconds) * 1000 + int(micros) // 1000
        leases = batch_replies(replies, calls)
        all_facts = self.wakes.arm_facts(replies, fact_calls)
        requests: list[ArmRequest] = []
        facts: list[ArmFacts] = []
        stale_by_queue: dict[str, list[str]] = {}
        for (agent, target_ms), (score, queue, oldest), fact in zip(
                targets, leases, all_facts, strict=True):
            found = self.leases.live_queue_reply(None if score is None else float(score),
                                                 queue, now_ms=now_ms)
            if found is None:
                continue  # not live: nothing is armed
            requests.append(ArmRequest(agent, target_ms, found))
            facts.append(fact)
            if oldest and server_ms - stream_id_ms(_text(oldest)) >= self.followup_stale_ms:
                stale_by_queue.setdefault(found, []).append(agent)
        armed = dict(zip(
            (r.agent for r in requests),
            self.wakes.arm_many(requests, facts=facts,
                                then=release.release_on if release is not None else None),
            strict=True,
        ))
        if release is not None:
            release.released_by_pipeline()
        if stale_by_queue:
            # The script checks each stream's age again, atomically.
            announced = self.followups.announce_stale(
                stale_by_queue, older_than_ms=self.followup_stale_ms
            )
            if announced:
                log.info("announced %d stale followup stream(s) again", len(announced))
        return [armed.get(agent) for agent, _state in folds]

    def trigger_many(self, agents: Sequence[str]) -> int:
        """Enqueue immediate wakes for many agents, each on the queue its lease names, in
        ``wake_batch`` jobs; one round trip to look the queues up, one to enqueue. Returns
        the number of jobs."""
        if not agents:
            return 0
        by_queue: dict[str, list[str]] = {}
        for agent, queue in zip(agents, self.leases.queues_of(list(agents)), strict=True):
            by_queue.setdefault(queue, []).append(agent)
        return self.wakes.trigger_many(by_queue)

    def projections(self, agents: Sequence[str]) -> list[Projection]:
        """The ``Projection`` of each agent, in one round trip however many agents (one
        script call per hundred; the caller bounds the batch); it reads only."""
        if not agents:
            return []
        scheduled, job_prefix = self.wakes.scheduler.scheduled_jobs_key, Job.key_for("")
        replies = run_script_batch(self.client, _PROJECTION, [
            ([self.keys.current_wake(agent), self.keys.followups(agent), scheduled],
             [job_prefix])
            for agent in agents
        ])
        return [Projection(_text(wake) if wake is not None else None, bool(held),
                           stream_id_ms(_text(first)) if first is not None else None)
                for wake, first, held in replies]

    def server_time_ms(self) -> int:
        """Redis's own clock, in epoch ms: the clock stream ids are made from."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def trigger(self, agent: str) -> None:
        """Enqueue an immediate wake on the agent's queue."""
        self.wakes.trigger(agent, self.leases.queue_of(agent))

    def forget_agent(self, agent: str, *, lock_wait_s: float) -> None:
        """Drop everything Redis holds for an agent; its session log keeps every record.

        Takes the agent's lock, so no transaction is half-way through. Never touches the
        log: disposal appends no delete records.
        """
        with self.locks.hold(agent, wait_s=lock_wait_s):
            self._forget_held([agent])

    def forget_agents(self, agents: Sequence[str], *, lock_wait_s: float) -> list[str]:
        """``forget_agent`` for many agents: the free locks taken together, and what Redis
        holds for those agents dropped in a few round trips whatever their number (the
        caller bounds the batch). An agent whose lock is busy (a transaction in flight) is
        then forgotten alone, waiting for its lock. Returns the agents whose lock stayed
        busy: nothing of theirs was dropped."""
        agents = list(dict.fromkeys(agents))
        with self.locks.hold_many(agents) as held:
            self._forget_held([agent for agent in agents if agent in held])
        left: list[str] = []
        for agent in agents:
            if agent not in held:
                try:
                    self.forget_agent(agent, lock_wait_s=lock_wait_s)
                except LockUnavailable:
                    left.append(agent)
        return left

    def _forget_held(self, agents: Sequence[str]) -> None:
        self.wakes.cancel_many(agents)
        self.leases.drop_many(agents)
        self.phase.forget_many(agents)
        self.followups.drop_many(agents)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
