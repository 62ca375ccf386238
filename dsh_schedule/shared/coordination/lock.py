"""The per-agent lock that serializes management and due transactions
(docs/architecture.md#management-tools).

It is a redis-py ``Lock`` with a TTL and a bounded wait. Correctness never rests on it
alone: every append is fenced by the expected log length (docs/architecture.md#session-logs),
so a holder whose
lock expired while it was paused cannot slip a stale decision into the log.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final, TypeVar

import redis
from redis.client import Pipeline
from redis.exceptions import LockError
from redis.lock import Lock

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript
from dsh_schedule.shared.core.errors import ScheduleError

log = logging.getLogger(__name__)

R = TypeVar("R")

_RELEASE: Final = LuaScript("lock_release_many")
_TAKE: Final = LuaScript("lock_take")


class LockUnavailable(ScheduleError):
    """The per-agent lock could not be had within its wait bound."""

    def __init__(self, agent: str) -> None:
        super().__init__("per-agent lock not acquired in time")
        self.agent = agent


class HeldLock:
    """A per-agent lock held by ``AgentLocks.hold``. A transaction whose last step is one
    pipelined write may release the lock in that same write (``release_on``), saving the
    release's round trip; ``hold`` then releases nothing more."""

    def __init__(self, key: str, token: bytes) -> None:
        self._key = key
        self._token = token
        self.released = False

    def release_on(self, pipe: Pipeline) -> None:
        """Queue this lock's release (only while it still holds our token) as the last
        command of ``pipe``; call ``released_by_pipeline`` once ``pipe`` has run."""
        _RELEASE.queue(pipe, [self._key], [self._token])

    def released_by_pipeline(self) -> None:
        self.released = True


class AgentLocks:
    """Acquires per-agent locks on one Redis connection."""

    def __init__(self, client: redis.Redis, keys: Keys, *, ttl_s: float) -> None:
        self._client = client
        self._keys = keys
        self._ttl_s = ttl_s
        # The tokens of the locks this thread holds, by agent (``token_of``).
        self._mine = threading.local()

    def token_of(self, agent: str) -> bytes | None:
        """The token of the agent's lock while this thread holds it (None: it does not):
        a write that must be made only while the lock is still ours checks it in Redis
        (``WakeProjection.arm``)."""
        return self._tokens().get(agent)

    def _tokens(self) -> dict[str, bytes]:
        tokens: dict[str, bytes] | None = getattr(self._mine, "tokens", None)
        if tokens is None:
            tokens = self._mine.tokens = {}
        return tokens

    def _note(self, agents: Sequence[str], token: bytes) -> None:
        tokens = self._tokens()
        for agent in agents:
            tokens[agent] = token

    def _forget(self, agents: Sequence[str], token: bytes) -> None:
        tokens = self._tokens()
        for agent in agents:
            if tokens.get(agent) == token:
                del tokens[agent]

    @contextmanager
    def hold(self, agent: str, *, wait_s: float) -> Iterator[HeldLock]:
        """Hold the agent's lock for the block; LockUnavailable after ``wait_s``.

        A release that finds the lock already expired or taken over is not an error:
        the fenced append has already protected the log. A release that cannot reach
        Redis is not one either: the lock expires by its TTL, and whatever the block
        confirmed stays confirmed. The block may release the lock itself, with its last
        writes (``HeldLock.release_on``).
        """
        lock = self._acquired(agent, wait_s)
        if lock is None:
            raise LockUnavailable(agent)
        with self._holding(agent, lock) as held:
            yield held

    def _acquired(self, agent: str, wait_s: float) -> Lock | None:
        """The agent's lock once had within ``wait_s``; None when it stayed busy."""
        lock = self._client.lock(
            self._keys.lock(agent),
            timeout=self._ttl_s,
            blocking=True,
            blocking_timeout=wait_s,
            sleep=0.01,
            thread_local=False,
        )
        return lock if lock.acquire() else None

    @contextmanager
    def _holding(self, agent: str, lock: Lock) -> Iterator[HeldLock]:
        token = lock.local.token
        held = HeldLock(self._keys.lock(agent), token)
        self._note([agent], token)
        try:
            yield held
        finally:
            self._forget([agent], token)
            if not held.released:
                try:
                    lock.release()
                except LockError:
                    pass
                except redis.RedisError as exc:
                    log.warning("lock of %s not released (%s); it expires in %g s",
                                agent, type(exc).__name__, self._ttl_s)

    def each_held(
        self, agents: Sequence[str], work: Callable[[list[str]], R], *, wait_s: float,
        released: Callable[[R], None] | None = None,
    ) -> list[str]:
        """Run ``work`` on ``agents`` with their locks held: once on those whose locks are
        free, taken together (``hold_free``), then once on each busy one alone, its lock
        had within ``wait_s``. ``released`` gets each run's result once that run's locks
        are let go. Returns the agents whose lock stayed busy (``work`` never saw them).
        The first mention of an agent named twice counts."""
        agents = list(dict.fromkeys(agents))
        with self.hold_free(agents) as free:
            result = work([agent for agent in agents if agent in free])
        if released is not None:
            released(result)
        busy: list[str] = []
        for agent in agents:
            if agent in free:
                continue
            lock = self._acquired(agent, wait_s)
            if lock is None:
                busy.append(agent)
                continue
            with self._holding(agent, lock):
                result = work([agent])
            if released is not None:
                released(result)
        return busy

    @contextmanager
    def hold_free(self, agents: Sequence[str]) -> Iterator[set[str]]:
        """Hold, for the block, the locks of those ``agents`` that are free now; yields
        the agents whose lock is held (the others are busy: no waiting here).

        One script call takes them (the same ``SET NX PX`` a single lock takes, under one
        token for the batch), one more releases them; none is sent for no agents. The
        release, like ``hold``'s, is never an error: an unreachable Redis lets the locks
        expire by TTL.
        """
        token = uuid.uuid4().hex
        keys = {agent: self._keys.lock(agent) for agent in dict.fromkeys(agents)}
        ttl_ms = max(int(self._ttl_s * 1000), 1)
        taken = _TAKE.run_items(self._client,
                                [([key], [token, ttl_ms]) for key in keys.values()])
        held = {agent for agent, ok in zip(keys, taken, strict=True) if ok}
        self._note(list(held), token.encode())
        try:
            yield held
        finally:
            self._forget(list(held), token.encode())
            if held:
                try:
                    _RELEASE.run(self._client, [keys[a] for a in held], [token])
                except redis.RedisError as exc:
                    log.warning("%d locks not released (%s); they expire in %g s",
                                len(held), type(exc).__name__, self._ttl_s)
