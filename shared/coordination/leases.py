"""Liveness per host (docs/architecture.md#hosts-followups-and-rebuild): which agents are
live, and on which rq queue.

A host holds one lease for itself: an entry of one ZSET (host -> expiry, epoch ms). Beside
it the host's served set (a SET of agent ids) and, per agent, the host serving it (one
HASH, agent -> host) and its queue (one HASH, agent -> queue). An agent is live while the
host that serves it holds a valid lease. Installing and disposing of agents write the
set and the hashes; a renewal writes the host's own entry only, so it costs the same
command whatever the number of agents the host serves (``renew_host``).

Installing an agent another host serves moves it: it leaves the other host's set, and
the agent's hash entry names the new host. An install reports the agents that had no
valid lease before (or that moved), so the caller enqueues their wakes. An expired host
lease is found by the reconcile pass in one read of the hosts ZSET
(``expired_hosts``); its agents are then retired, a batch at a time (``served_batch``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import redis

from dsh_schedule.shared.coordination.keys import Keys

INSTALL_BATCH: Final = 2_000  # agents per install call (one script call, one round trip)

# The host digest: per host, the sum modulo 2^48 of the ``agent_digest`` of every agent
# whose agent-host entry names it, changed in the same script as the entry, so a write
# Redis lost takes its digest change with it. Each agent's share comes from the caller,
# beside the agent (a double holds these sums exactly).
_DIGEST = """
local function digest_add(hash, host, share)
  local d = (tonumber(redis.call('HGET', hash, host) or '0') + share) % 281474976710656
  if d == 0 then redis.call('HDEL', hash, host)
  else redis.call('HSET', hash, host, string.format('%.0f', d)) end
end
"""

# KEYS[1] hosts zset, KEYS[2] agent-host hash, KEYS[3] lease-queue hash, KEYS[4] this
# host's served set, KEYS[5] the host digest hash; ARGV[1] host, ARGV[2] expiry ms, ARGV[3]
# now ms, ARGV[4] queue, ARGV[5] the served-set key prefix, ARGV[6..] pairs of an agent and
# its ``agent_digest``. Renews the
# host's lease, serves each agent from this host (moving it from the host that served it),
# and returns the agents that were not live here before: no host, an expired one, another
# host, or no queue entry (a lost one is written again, and the agent woken).
_INSTALL = _DIGEST + """
local host, now, queue, served = ARGV[1], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local mine = redis.call('ZSCORE', KEYS[1], host)
local mine_live = mine and tonumber(mine) >= now
redis.call('ZADD', KEYS[1], ARGV[2], host)
local new = {}
for i = 6, #ARGV, 2 do
  local agent, share = ARGV[i], tonumber(ARGV[i + 1])
  local old = redis.call('HGET', KEYS[2], agent)
  local is_new = false
  if old ~= host then
    if old then
      redis.call('SREM', served .. old, agent)
      digest_add(KEYS[5], old, -share)
    end
    redis.call('HSET', KEYS[2], agent, host)
    digest_add(KEYS[5], host, share)
    is_new = true
  elseif not mine_live or redis.call('SADD', KEYS[4], agent) == 1 then
    is_new = true
  end
  redis.call('SADD', KEYS[4], agent)
  local had = redis.call('HGET', KEYS[3], agent)
  if had ~= queue then
    redis.call('HSET', KEYS[3], agent, queue)
    if not had then is_new = true end
  end
  if is_new then new[#new + 1] = agent end
end
return new
"""

# KEYS[1] hosts zset, KEYS[2] this host's served set, KEYS[3] the host digest hash;
# ARGV[1] host, ARGV[2] expiry ms, ARGV[3] now ms. Returns {1 when the host's lease was
# valid, the size of its served set, its digest}.
_RENEW_HOST = """
local old = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local valid = 0
if old and tonumber(old) >= tonumber(ARGV[3]) then valid = 1 end
return {valid, redis.call('SCARD', KEYS[2]),
        tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')}
"""

# KEYS[1] hosts zset, KEYS[2] agent-host hash; ARGV[1] now ms, ARGV[2..] agents. Returns,
# per agent, its host when that host's lease is valid, else false.
_HOSTS_OF = """
local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local host = redis.call('HGET', KEYS[2], ARGV[i])
  if host then
    local expiry = redis.call('ZSCORE', KEYS[1], host)
    if not expiry or tonumber(expiry) < now then host = false end
  end
  out[i - 1] = host or false
end
return out
"""

# KEYS[1] agent-host hash, KEYS[2] lease-queue hash, KEYS[3] the host digest hash; ARGV[1]
# the served-set key prefix, ARGV[2..] pairs of an agent and its ``agent_digest``. Ends
# each agent's lease: it leaves its host's set and digest and both hashes.
_DROP = _DIGEST + """
for i = 2, #ARGV, 2 do
  local host = redis.call('HGET', KEYS[1], ARGV[i])
  if host then
    redis.call('SREM', ARGV[1] .. host, ARGV[i])
    digest_add(KEYS[3], host, -tonumber(ARGV[i + 1]))
  end
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
return 1
"""

# KEYS[1] hosts zset, KEYS[2] the host's served set, KEYS[3] the host digest hash; ARGV[1]
# host, ARGV[2] now ms. Forgets an expired host whose set is empty, and its digest; 1 when
# it did (a host that renewed is kept).
_FORGET_HOST = """
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) >= tonumber(ARGV[2]) then return 0 end
if redis.call('SCARD', KEYS[2]) > 0 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""


DIGEST_MODULUS: Final = 1 << 48


def agent_digest(agent: str) -> int:
    """An agent's share of its host's digest: the first 48 bits of its id's SHA-1. A
    host's digest is the sum of its agents' shares modulo ``DIGEST_MODULUS``."""
    return int.from_bytes(hashlib.sha1(agent.encode()).digest()[:6], "big")


def _with_digests(agents: Sequence[str]) -> list[str | int]:
    return [x for agent in agents for x in (agent, agent_digest(agent))]


class HostRenewal(NamedTuple):
    """One renewal of a host's lease: whether the lease was still valid, how many agents
    Redis holds in its served set, and the digest of the agents whose ``agent-host``
    entry names it (the sum of their ``agent_digest``)."""

    was_valid: bool
    served: int
    digest: int


class Leases:
    """Host leases under one prefix; an agent whose lease names no queue uses
    ``default_queue``."""

    def __init__(self, client: redis.Redis, keys: Keys, *, default_queue: str) -> None:
        self._client = client
        self._keys = keys
        self._default_queue = default_queue
        self._install = client.register_script(_INSTALL)
        self._renew_host = client.register_script(_RENEW_HOST)
        self._hosts_of = client.register_script(_HOSTS_OF)
        self._drop = client.register_script(_DROP)
        self._forget_host = client.register_script(_FORGET_HOST)

    # -- a host's side ----------------------------------------------------------------

    def install(
        self, host: str, agents: Sequence[str], queue: str, *, now_ms: int, ttl_s: float
    ) -> list[str]:
        """Serve ``agents`` from ``host`` on ``queue`` and renew the host's lease: one
        script call (one round trip) per ``INSTALL_BATCH`` agents. Returns the agents
        that were not live on this host before, in the order given (the caller enqueues
        their wakes)."""
        expiry = now_ms + int(ttl_s * 1000)
        keys = [self._keys.hosts(), self._keys.agent_host(), self._keys.lease_queue(),
                self._keys.served(host), self._keys.host_digest()]
        new: list[str] = []
        for start in range(0, max(len(agents), 1), INSTALL_BATCH):
            found: list[Any] = self._install(keys=keys, args=[
                host, expiry, now_ms, queue, self._keys.served(""),
                *_with_digests(agents[start : start + INSTALL_BATCH])])
            new.extend(_text(m) for m in found)
        return new

    def grant(self, agent: str, queue: str, *, now_ms: int, ttl_s: float,
              host: str = "host") -> bool:
        """``install`` of one agent; True when its lease is new."""
        return bool(self.install(host, [agent], queue, now_ms=now_ms, ttl_s=ttl_s))

    def renew_host(self, host: str, *, now_ms: int, ttl_s: float) -> HostRenewal:
        """Renew the host's own lease: one script call, whatever the number of agents it
        serves. Whether the lease was still valid, and the size of its served set (a host
        whose lease had expired, or whose set is not what it serves, installs again)."""
        valid, served, digest = self._renew_host(
            keys=[self._keys.hosts(), self._keys.served(host), self._keys.host_digest()],
            args=[host, now_ms + int(ttl_s * 1000), now_ms])
        return HostRenewal(bool(valid), int(served), int(digest))

    def reset_digest(self, host: str, digest: int) -> None:
        """Set the host's digest to what the host computes from the agents it serves,
        after it installed them all again (one command)."""
        if digest:
            self._client.hset(self._keys.host_digest(), host, digest)
        else:
            self._client.hdel(self._keys.host_digest(), host)

    def served_here(self, host: str, agents: Sequence[str]) -> list[bool]:
        """Whether each of ``agents`` is in the host's served set, in one round trip."""
        if not agents:
            return []
        found: list[Any] = self._client.smismember(self._keys.served(host), list(agents))
        return [bool(f) for f in found]

    # -- whoever asks -----------------------------------------------------------------

    def hosts_of(self, agents: Sequence[str], *, now_ms: int) -> list[str | None]:
        """The host serving each agent when that host's lease is valid (None: not live),
        in one round trip."""
        if not agents:
            return []
        found: list[Any] = self._hosts_of(
            keys=[self._keys.hosts(), self._keys.agent_host()], args=[now_ms, *agents])
        return [_text(h) if h else None for h in found]

    def is_live(self, agent: str, *, now_ms: int) -> bool:
        return self.hosts_of([agent], now_ms=now_ms)[0] is not None

    def live_among(self, agents: Sequence[str], *, now_ms: int) -> list[str]:
        """The agents of ``agents`` that hold a valid lease, in one round trip."""
        return [a for a, host in zip(agents, self.hosts_of(agents, now_ms=now_ms),
                                     strict=True) if host is not None]

    def live_queues(self, agents: Sequence[str], *, now_ms: int) -> dict[str, str]:
        """The queue of each agent of ``agents`` that holds a valid lease, in two round
        trips; agents without a valid lease are left out."""
        live = self.live_among(agents, now_ms=now_ms)
        return dict(zip(live, self.queues_of(live), strict=True))

    def live_queue_reply(self, expiry: Any, queue: Any, *, now_ms: int) -> str | None:
        """The agent's queue when the lease of its host (which expires at ``expiry``, None
        when there is none) is valid at ``now_ms`` (None: not live)."""
        if expiry is not None and float(expiry) >= now_ms:
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

    def live_hosts(self, *, now_ms: int) -> list[str]:
        members: list[Any] = self._client.zrangebyscore(self._keys.hosts(), now_ms, "+inf")
        return [_text(m) for m in members]

    def expired_hosts(self, *, now_ms: int) -> list[str]:
        """The hosts whose lease expired (their agents are to be retired): one read,
        whatever the number of agents."""
        members: list[Any] = self._client.zrangebyscore(
            self._keys.hosts(), "-inf", f"({now_ms}")
        return [_text(m) for m in members]

    def live_agents(self, *, now_ms: int) -> list[str]:
        """Every live agent, in id order: the served sets of the live hosts (a rebuild's
        read, and ``status``'s; O(agents), never a periodic pass's)."""
        agents: list[str] = []
        for host in self.live_hosts(now_ms=now_ms):
            members: Any = self._client.smembers(self._keys.served(host))
            agents.extend(_text(m) for m in members)
        return sorted(set(agents))

    def count_served(self, hosts: Sequence[str]) -> int:
        """How many agents the hosts' served sets hold together, in one round trip."""
        if not hosts:
            return 0
        with self._client.pipeline(transaction=False) as pipe:
            for host in hosts:
                pipe.scard(self._keys.served(host))
            return sum(int(n) for n in pipe.execute())

    def served_batch(self, host: str, count: int) -> list[str]:
        """Up to about ``count`` agents of the host's served set that it still serves
        (an agent that moved to another host meanwhile is left out, and leaves the set)."""
        members: Any = self._client.srandmember(self._keys.served(host), count)
        agents = [_text(m) for m in members]
        if not agents:
            return []
        owners: list[Any] = self._client.hmget(self._keys.agent_host(), agents)
        moved = [a for a, owner in zip(agents, owners, strict=True)
                 if owner is not None and _text(owner) != host]
        if moved:
            self._client.srem(self._keys.served(host), *moved)
        gone = set(moved)
        return [a for a in agents if a not in gone]

    def leave_served(self, host: str, agents: Sequence[str]) -> None:
        """Take retired agents out of the host's served set, whatever the hashes say (one
        command; nothing when there are none)."""
        if agents:
            self._client.srem(self._keys.served(host), *agents)

    def forget_host(self, host: str, *, now_ms: int) -> bool:
        """Forget an expired host whose served set is empty (all its agents retired);
        False while it is live again or still serves agents."""
        return bool(self._forget_host(
            keys=[self._keys.hosts(), self._keys.served(host), self._keys.host_digest()],
            args=[host, now_ms]))

    def drop(self, agent: str) -> None:
        self.drop_many([agent])

    def drop_many(self, agents: Sequence[str]) -> None:
        """End the leases of many agents, in one round trip."""
        if not agents:
            return
        self._drop(keys=[self._keys.agent_host(), self._keys.lease_queue(),
                         self._keys.host_digest()],
                   args=[self._keys.served(""), *_with_digests(agents)])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
