"""Live-agent leases (docs/architecture.md#hosts-followups-and-rebuild): which agents are live,
and on which rq queue.

A lease is an entry in one ZSET (agent -> expiry, epoch ms) plus the agent's queue in one
HASH. Granting or renewing re-creates whatever Redis lost; a new lease reports itself so
that the caller enqueues an immediate wake. (The followup consumer group is re-created
by its reader, the moment the stream holds entries: see ``Followups.read``.)
A host renews all its leases with ``grant_many``: one script call, so one round trip, per
``GRANT_BATCH`` agents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import redis

from dsh_schedule.shared.coordination.keys import Keys

# KEYS[1] live zset, KEYS[2] lease-queue hash; ARGV[1] agent, ARGV[2] expiry ms,
# ARGV[3] now ms, ARGV[4] queue. Returns 1 when the agent had no valid lease before.
_GRANT = """
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
if (not old) or tonumber(old) < tonumber(ARGV[3]) then
  return 1
end
return 0
"""

GRANT_BATCH: Final = 2_000

# KEYS[1] live zset, KEYS[2] lease-queue hash; ARGV[1] expiry ms, ARGV[2] now ms, ARGV[3]
# queue, ARGV[4..] the agents. Grants or renews each agent's lease; returns the agents that
# had no valid lease before (in ARGV order).
_GRANT_MANY = """
local expiry, now, queue = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local new = {}
for i = 4, #ARGV do
  local agent = ARGV[i]
  local old = redis.call('ZSCORE', KEYS[1], agent)
  redis.call('ZADD', KEYS[1], expiry, agent)
  redis.call('HSET', KEYS[2], agent, queue)
  if (not old) or tonumber(old) < now then
    new[#new + 1] = agent
  end
end
return new
"""


class Leases:
    """Leases under one prefix; an agent whose lease names no queue uses ``default_queue``."""

    def __init__(self, client: redis.Redis, keys: Keys, *, default_queue: str) -> None:
        self._client = client
        self._keys = keys
        self._default_queue = default_queue
        self._grant = client.register_script(_GRANT)
        self._grant_many = client.register_script(_GRANT_MANY)

    def grant(self, agent: str, queue: str, *, now_ms: int, ttl_s: float) -> bool:
        """Create or renew the lease; True when it is new (the caller enqueues a wake)."""
        expiry = now_ms + int(ttl_s * 1000)
        new = self._grant(
            keys=[self._keys.live(), self._keys.lease_queue()],
            args=[agent, expiry, now_ms, queue],
        )
        return bool(new)

    def grant_many(
        self, agents: Sequence[str], queue: str, *, now_ms: int, ttl_s: float
    ) -> list[str]:
        """``grant`` for many agents on one queue: one script call (one round trip) per
        ``GRANT_BATCH`` agents. Returns the agents whose lease is new, in the order given
        (the caller enqueues their wakes)."""
        expiry = now_ms + int(ttl_s * 1000)
        new: list[str] = []
        for start in range(0, len(agents), GRANT_BATCH):
            granted: list[Any] = self._grant_many(
                keys=[self._keys.live(), self._keys.lease_queue()],
                args=[expiry, now_ms, queue, *agents[start : start + GRANT_BATCH]],
            )
            new.extend(m.decode() if isinstance(m, bytes) else str(m) for m in granted)
        return new

    def is_live(self, agent: str, *, now_ms: int) -> bool:
        score = self._client.zscore(self._keys.live(), agent)
        return score is not None and score >= now_ms

    def live_among(self, agents: Sequence[str], *, now_ms: int) -> list[str]:
        """The agents of ``agents`` that hold a valid lease, in one round trip."""
        if not agents:
            return []
        scores = self._client.zmscore(self._keys.live(), list(agents))
        return [a for a, score in zip(agents, scores, strict=True)
                if score is not None and score >= now_ms]

    def live_queues(self, agents: Sequence[str], *, now_ms: int) -> dict[str, str]:
        """The queue of each agent of ``agents`` that holds a valid lease, in one round
        trip; agents without a valid lease are left out."""
        if not agents:
            return {}
        with self._client.pipeline(transaction=False) as pipe:
            for agent in agents:
                self.live_queue_commands(agent, pipe)
            replies = pipe.execute()
        found: dict[str, str] = {}
        for index, agent in enumerate(agents):
            queue = self.live_queue_reply(replies[2 * index], replies[2 * index + 1],
                                          now_ms=now_ms)
            if queue is not None:
                found[agent] = queue
        return found

    def live_queue_commands(self, agent: str, pipe: Any) -> None:
        """Queue on ``pipe`` the two reads ``live_queue_reply`` decides from."""
        pipe.zscore(self._keys.live(), agent)
        pipe.hget(self._keys.lease_queue(), agent)

    def live_queue_reply(self, score: Any, queue: Any, *, now_ms: int) -> str | None:
        """The agent's queue when its lease is valid at ``now_ms`` (None: not live), from
        the replies of ``live_queue_commands``."""
        if score is not None and score >= now_ms:
            return self._queue(queue)
        return None

    def queue_of(self, agent: str) -> str:
        """The queue beside the agent's session store (the default when none is known)."""
        return self._queue(self._client.hget(self._keys.lease_queue(), agent))

    def queues_of(self, agents: list[str]) -> list[str]:
        """``queue_of`` for many agents in one round trip."""
        if not agents:
            return []
        values: list[Any] = self._client.hmget(self._keys.lease_queue(), agents)
        return [self._queue(v) for v in values]

    def _queue(self, value: object) -> str:
        return value.decode() if isinstance(value, bytes) else self._default_queue

    def live_agents(self, *, now_ms: int) -> list[str]:
        members: list[Any] = self._client.zrangebyscore(self._keys.live(), now_ms, "+inf")
        return [m.decode() for m in members]

    def expired_agents(self, *, now_ms: int) -> list[str]:
        members: list[Any] = self._client.zrangebyscore(
            self._keys.live(), "-inf", f"({now_ms}"
        )
        return [m.decode() for m in members]

    def drop(self, agent: str) -> None:
        self.drop_many([agent])

    def drop_many(self, agents: Sequence[str]) -> None:
        """End the leases of many agents, in one round trip."""
        if not agents:
            return
        with self._client.pipeline() as pipe:
            pipe.zrem(self._keys.live(), *agents)
            pipe.hdel(self._keys.lease_queue(), *agents)
            pipe.execute()
