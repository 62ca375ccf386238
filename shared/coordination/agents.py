"""The Redis coordination of one deployment: every adapter, built from one client.

Redis only coordinates: every key here can be deleted and rebuilt from the session logs
(docs/architecture.md#delivery). This is the entry point a host or a process builds once;
the transactions receive it beside their ``Settings``, which it does not hand out.
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
    """Locks, phase, leases, followups and wakes under one key prefix."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.keys = Keys(settings.prefix)
        self.locks = AgentLocks(client, self.keys, ttl_s=settings.lock_ttl_s)
        self.phase = AgentPhase(client, self.keys)
        self.leases = Leases(client, self.keys, default_queue=settings.queue)
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
        """``rearm`` for many agents; hold every agent's lock. Each agent's current wake
        id (None: not live, or nothing to wake for)."""
        queues = self.leases.live_queues([agent for agent, _state in folds], now_ms=now_ms)
        requests = [
            ArmRequest(agent, next_wake_ms(state, now_ms), queues[agent])
            for agent, state in folds
            if agent in queues
        ]
        armed = dict(zip((r.agent for r in requests), self.wakes.arm_many(requests), strict=True))
        return [armed.get(agent) for agent, _state in folds]

    def trigger(self, agent: str) -> None:
        """Enqueue an immediate wake on the agent's queue."""
        self.wakes.trigger(agent, self.leases.queue_of(agent))

    def forget_agent(self, agent: str, *, lock_wait_s: float) -> None:
        """Drop everything Redis holds for an agent; its session log keeps every record.

        Takes the agent's lock, so no transaction is half-way through. Never touches the
        log: disposal appends no delete records.
        """
        with self.locks.hold(agent, wait_s=lock_wait_s):
            self.wakes.cancel(agent)
            self.leases.drop(agent)
            self.phase.forget(agent)
            self.followups.drop(agent)
