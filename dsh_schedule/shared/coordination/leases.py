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
(``expired_hosts``); its agents are then retired, a batch at a time (``still_served``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import redis

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript

INSTALL_BATCH: Final = 2_000  # agents per install call (one script call, one round trip)

# The host digest (lua/host_digest.lua) changes in the same script as the agent-host entry.
_INSTALL: Final = LuaScript("host_digest", "lease_install")
_RENEW_HOST: Final = LuaScript("lease_renew_host")
_HOSTS_OF: Final = LuaScript("lease_hosts_of")
_DROP: Final = LuaScript("host_digest", "lease_drop")
_FORGET_HOST: Final = LuaScript("lease_forget_host")


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
            found: list[Any] = _INSTALL.run(self._client, keys, [
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
        valid, served, digest = _RENEW_HOST.run(
            self._client,
            [self._keys.hosts(), self._keys.served(host), self._keys.host_digest()],
            [host, now_ms + int(ttl_s * 1000), now_ms])
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
        found: list[Any] = _HOSTS_OF.run(
            self._client, [self._keys.hosts(), self._keys.agent_host()], [now_ms, *agents])
        return [_text(h) if h else None for h in found]

    def live_among(self, agents: Sequence[str], *, now_ms: int) -> list[str]:
        """The agents of ``agents`` that hold a valid lease, in one round trip."""
        return [a for a, host in zip(agents, self.hosts_of(agents, now_ms=now_ms),
                                     strict=True) if host is not None]

    def live_queue_reply(self, expiry: Any, queue: Any, *, now_ms: int) -> str | None:
        """The agent's queue when the lease of its host (which expires at ``expiry``, None
        when there is none) is valid at ``now_ms`` (None: not live)."""
        if expiry is not None and float(expiry) >= now_ms:
            return self._queue(queue)
        return None

    def queues_of(self, agents: list[str]) -> list[str]:
        """The queue beside each agent's session store (the default when none is known),
        in one round trip."""
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

    def still_served(self, host: str, count: int) -> list[str]:
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
        return bool(_FORGET_HOST.run(
            self._client,
            [self._keys.hosts(), self._keys.served(host), self._keys.host_digest()],
            [host, now_ms]))

    def drop(self, agents: Sequence[str]) -> None:
        """End the leases of many agents, in one round trip."""
        if not agents:
            return
        _DROP.run(self._client,
                  [self._keys.agent_host(), self._keys.lease_queue(), self._keys.host_digest()],
                  [self._keys.served(""), *_with_digests(agents)])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
