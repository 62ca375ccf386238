"""The ``scheduler`` process: rq-scheduler mover, startup rebuild, periodic reconcile.

We drive rq-scheduler's ``enqueue_jobs()`` from our own loop (its ``run()`` installs its
own signal handlers). Rebuild enqueues a wake for every live agent; all deciding happens
inside the wake, under the lock, after a preflight — so a Redis flush loses nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import msgspec
import redis

from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.coordination.outage import Outage
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)


class RebuildReport(msgspec.Struct, frozen=True, kw_only=True):
    woken: tuple[str, ...]
    retired: tuple[str, ...]


def rebuild(coord: Coordination, settings: Settings, *, now_ms: int) -> RebuildReport:
    """Enqueue a wake for every live agent; remove what Redis holds for ended agents."""
    live = coord.leases.live_agents(now_ms=now_ms)
    by_queue: dict[str, list[str]] = {}
    for agent, queue in zip(live, coord.leases.queues_of(live), strict=True):
        by_queue.setdefault(queue, []).append(agent)
    coord.wakes.trigger_many(by_queue)
    retired: list[str] = []
    for agent in coord.leases.expired_agents(now_ms=now_ms):
        try:
            coord.forget_agent(agent, lock_wait_s=settings.tool_lock_wait_s)
        except LockUnavailable:
            log.info("could not retire %s now; the next pass retries", agent)
        else:
            retired.append(agent)
    return RebuildReport(woken=tuple(live), retired=tuple(retired))


class SchedulerLoop:
    """The mover every ``mover_interval_s``, a rebuild at start and a reconcile every
    ``reconcile_interval_s``; through a Redis outage it waits with backoff and rebuilds
    once Redis is back (docs/architecture.md#outages)."""

    def __init__(self, coord: Coordination, settings: Settings) -> None:
        self._coord = coord
        self._settings = settings
        self._outage = Outage(log, "scheduler")
        self.stop = threading.Event()

    def run(self) -> int:
        next_reconcile = 0.0  # the first pass rebuilds
        while not self.stop.is_set():
            try:
                if time.monotonic() >= next_reconcile:
                    report = rebuild(self._coord, self._settings, now_ms=wall_clock_ms())
                    log.debug("rebuild woke %d live agent(s)", len(report.woken))
                    next_reconcile = time.monotonic() + self._settings.reconcile_interval_s
                self._move()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.stop.wait(self._outage.failed(exc))
                continue
            except Exception:
                # The mover must keep moving: log, and try again on the next pass.
                log.exception("scheduler pass failed")
                self.stop.wait(1.0)
                continue
            if self._outage.succeeded():
                next_reconcile = 0.0  # Redis may have lost everything: rebuild now
            self.stop.wait(self._settings.mover_interval_s)
        log.info("scheduler stopped")
        return 0

    def _move(self) -> None:
        scheduler = self._coord.wakes.scheduler
        if scheduler.acquire_lock():
            try:
                self._coord.wakes.move_due()
            finally:
                scheduler.remove_lock()

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping after this pass", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def run_scheduler(settings: Settings) -> int:
    if not settings.redis_url:
        raise ValueError("the scheduler needs a Redis URL")
    client = redis.Redis.from_url(settings.redis_url)
    loop = SchedulerLoop(Coordination(client, settings), settings)
    loop.install_signal_handlers()
    log.info("scheduler moving wakes every %g s", settings.mover_interval_s)
    return loop.run()
