"""Where the load test runs the system: embedded in this process, or real processes.

``InProcessRuntime`` steps the whole system in this process on the embedded Redis, as
``EmbeddedSystem`` assembles it (the mover, one ``SimpleWorker``), with the load test's
hosts. ``process_runtime.RedisRuntime`` runs real
``dsh-schedule`` processes against a real Redis. Both serve the phases as a ``Runtime``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Final, Protocol

import redis
from rq import Queue

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore

POLL_S: Final = 0.01
HOST_POLL_S: Final = 0.05
# However far the run's deadline is, a wait may still take this long (cleanup included).
GRACE_S: Final = 10.0


class LoadtestError(RuntimeError):
    """The load test cannot go on (a process died, Redis is not one it may use)."""


class Runtime(Protocol):
    mode: str
    client: redis.Redis
    settings: Settings
    store: JsonlStore
    workers: int
    deadline: float
    """``time.monotonic()`` after which every wait gives up (the run's time bound)."""

    def pool(self, workers: int) -> AbstractContextManager[str]:
        """For the block, ``workers`` workers serving a queue; yields the queue's name."""
        ...

    def move_due(self) -> int:
        """One mover pass now; returns how many wakes it moved."""
        ...

    def start_mover(self) -> None:
        """Start moving due wakes every mover interval (the ``scheduler`` loop)."""
        ...

    def stop_mover(self) -> None: ...

    def run_until(self, done: Callable[[], bool], timeout_s: float, *,
                  hosts: Sequence[ReferenceHost] = (),
                  status: Callable[[], None] | None = None) -> bool:
        """Let the system run (workers, the mover when started, ``hosts``) until
        ``done()``; False at timeout or past ``deadline``. ``status`` is called now and
        then for progress."""
        ...

    def close(self) -> None: ...


def queue_idle(client: redis.Redis, queue: Queue) -> bool:
    """Nothing waits in the queue, sits between dequeue and start, or runs."""
    with client.pipeline(transaction=True) as pipe:
        pipe.llen(queue.key)
        pipe.llen(queue.intermediate_queue_key)
        pipe.zcard(queue.started_job_registry.key)
        return not any(pipe.execute())


class InProcessRuntime:
    """The whole system in this process on the embedded Redis, stepped by one loop."""

    mode = "embedded"

    def __init__(self, sessions: Path, settings: Settings) -> None:
        self.settings = settings
        self.store = JsonlStore(sessions)
        self.system = EmbeddedSystem(self.store, settings, clock=wall_clock_ms, sleep=time.sleep)
        self.client = self.system.client
        self.workers = 1
        self.deadline = math.inf
        self._mover = False

    @contextmanager
    def pool(self, workers: int) -> Iterator[str]:
        yield self.settings.queue  # one in-process worker, whatever was asked

    def move_due(self) -> int:
        return self.system.move_due()

    def start_mover(self) -> None:
        self._mover = True

    def stop_mover(self) -> None:
        self._mover = False

    def run_until(self, done: Callable[[], bool], timeout_s: float, *,
                  hosts: Sequence[ReferenceHost] = (),
                  status: Callable[[], None] | None = None) -> bool:
        deadline = until(timeout_s, self.deadline)
        next_move = next_renew = 0.0
        mover = self._mover
        while not done():
            now = time.monotonic()
            if now > deadline:
                return False
            if mover and now >= next_move:
                self.move_due()
                next_move = now + self.settings.mover_interval_s
            self.system.worker_pass()
            renew = now >= next_renew  # as ReferenceHost.run does
            for host in hosts:
                if renew:
                    host.plugin.renew_leases()
                    next_renew = now + self.settings.lease_renew_s
                for agent in list(host.agents):
                    host.pump(agent)
            if status is not None:
                status()
            if mover or hosts:
                time.sleep(HOST_POLL_S)
        return True

    def close(self) -> None:
        self.client.flushall()


def until(timeout_s: float, deadline: float) -> float:
    """When a wait of ``timeout_s`` ends: no later than the run's ``deadline``, but with
    ``GRACE_S`` left however close that is."""
    now = time.monotonic()
    return min(now + timeout_s, max(deadline, now + GRACE_S))
