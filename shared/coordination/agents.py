"""Everything the host and the workers coordinate through Redis, built from one client.

Redis only coordinates: every key here can be deleted and rebuilt from the session logs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from dsh_schedule.shared.coordination.followups import Followups
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import Leases
from dsh_schedule.shared.coordination.lock import AgentLocks
from dsh_schedule.shared.coordination.phase import AgentPhase
from dsh_schedule.shared.coordination.wake import ArmRequest, WakeProjection
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)


class Coordination:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.locks = AgentLocks(client, self.keys, ttl_s=settings.lock_ttl_s)
        self.phase = AgentPhase(client, self.keys)
        self.leases = Leases(client, self.keys)
        self.followups = Followups(client, self.keys)
        self.wakes = WakeProjection(client, self.keys)

    def rearm(self, agent: str, state: FoldState, now_ms: int) -> str | None:
        """The owner's recompute: arm the agent's wake at its next decision time.

        Only a live agent is armed, on the queue its lease names. Hold the agent's lock.
        """
        return self.rearm_many([(agent, state)], now_ms)[0]

    def rearm_many(
        self, folds: Sequence[tuple[str, FoldState]], now_ms: int
    ) -> list[str | None]:
        """``rearm`` for many agents, pipelined; hold every agent's lock."""
        with self.client.pipeline(transaction=False) as pipe:
            for agent, _state in folds:
                pipe.zscore(self.keys.live(), agent)
                pipe.hget(self.keys.lease_queue(), agent)
                pipe.get(self.keys.current_wake(agent))
            replies = pipe.execute()
        requests: list[ArmRequest] = []
        positions: list[int] = []
        for index, (agent, state) in enumerate(folds):
            expiry, queue, current = replies[3 * index : 3 * index + 3]
            if expiry is None or expiry < now_ms:
                continue
            requests.append(ArmRequest(
                agent,
                next_wake_ms(state, now_ms),
                queue.decode() if isinstance(queue, bytes) else self.settings.queue,
                current.decode() if isinstance(current, bytes) else None,
            ))
            positions.append(index)
        results: list[str | None] = [None] * len(folds)
        for index, job_id in zip(positions, self.wakes.arm_many(requests), strict=True):
            results[index] = job_id
        return results

    def trigger(self, agent: str) -> None:
        """Enqueue an immediate wake on the agent's queue."""
        queue = self.leases.queue_of(agent) or self.settings.queue
        self.wakes.trigger(agent, queue)

    def forget_agent(self, agent: str) -> None:
        """Drop everything Redis holds for an agent; its session log keeps every record.

        Takes the agent's lock, so no transaction is half-way through. Never touches the
        log: disposal appends no delete records.
        """
        with self.locks.hold(agent, wait_s=self.settings.tool_lock_wait_s):
            self.wakes.cancel(agent)
            self.leases.drop(agent)
            self.phase.forget(agent)
            self.followups.drop(agent)
