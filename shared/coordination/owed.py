"""Re-arms owed after a durable mutation (docs/architecture.md#owed-re-arms): remembered by
the process that made the mutation, and retried once Redis answers again.

A tool call whose record is in the log but whose re-arm could not reach Redis leaves the
agent without the wake its log asks for. The process remembers the agent here, in memory,
and once Redis answers it enqueues an immediate wake for every agent it owes one: the wake
decides under the agent's lock, from its log, and re-arms it. No sweep is needed for it. If
the process dies first, what it owed goes with it; the agent's next lease (another host
installing it, the same one restarted) wakes it instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Protocol

import redis

log = logging.getLogger(__name__)


class Waker(Protocol):
    def trigger_many(self, agents: list[str]) -> int:
        """Enqueue immediate wakes for the agents; raises ``redis.RedisError``."""
        ...


class OwedRearms:
    """The agents one process owes a re-arm, each from a moment on (at once, unless it
    was owed for later: a worker's retry with backoff); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owed: dict[str, int] = {}  # agent: owed from this epoch ms on (0: at once)

    def owe(self, agents: Iterable[str], *, from_ms: int = 0) -> None:
        """Owe each agent a wake from ``from_ms`` on; one owed sooner keeps its moment."""
        with self._lock:
            for agent in agents:
                self._owed[agent] = min(self._owed.get(agent, from_ms), from_ms)

    def owed(self) -> list[str]:
        with self._lock:
            return list(self._owed)

    def repay(self, waker: Waker, *, now_ms: int | None = None) -> list[str]:
        """Enqueue a wake for every agent owed one (by ``now_ms``, when given; nothing is
        sent when none is); those agents are owed nothing more. A Redis failure keeps
        them owed, and is raised."""
        with self._lock:
            agents = [agent for agent, at in self._owed.items()
                      if now_ms is None or at <= now_ms]
        if not agents:
            return []
        waker.trigger_many(agents)
        with self._lock:
            for agent in agents:
                at = self._owed.get(agent)
                if at is not None and (now_ms is None or at <= now_ms):
                    del self._owed[agent]  # not owed again for later meanwhile
        log.info("woke %d agent(s) whose re-arm had failed", len(agents))
        return agents

    def repay_quietly(self, waker: Waker, *, now_ms: int | None = None) -> list[str]:
        """``repay``, a Redis failure left for the next try."""
        try:
            return self.repay(waker, now_ms=now_ms)
        except redis.RedisError:
            return []
