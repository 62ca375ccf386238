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

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)


class RebuildReport(msgspec.Struct, frozen=True, kw_only=True):
    woken: tuple[str, ...]
    retired: tuple[str, ...]


def rebuild(coord: Coordination, *, now_ms: int) -> RebuildReport:
    """Enqueue a wake for every live agent; remove what Redis holds for ended agents."""
    live = coord.leases.live_agents(now_ms=now_ms)
    by_queue: dict[str, list[str]] = {}
    for agent, queue in zip(live, coord.leases.queues_of(live), strict=True):
        by_queue.setdefault(queue or coord.settings.queue, []).append(agent)
    coord.wakes.trigger_many(by_queue)
    retired: list[str] = []
    for agent in coord.leases.expired_agents(now_ms=now_ms):
        try:
            coord.forget_agent(agent)
        except (LockUnavailable, redis.RedisError):
            log.warning("could not retire %s now; the next pass retries", agent)
        else:
            retired.append(agent)
    return RebuildReport(woken=tuple(live), retired=tuple(retired))


class SchedulerLoop:
    def __init__(self, coord: Coordination) -> None:
        self._coord = coord
        self.stop = threading.Event()

    def run(self) -> int:
        settings = self._coord.settings
        report = rebuild(self._coord, now_ms=_now_ms())
        log.info("startup rebuild woke %d live agent(s)", len(report.woken))
        next_reconcile = time.monotonic() + settings.reconcile_interval_s
        scheduler = self._coord.wakes.scheduler
        while not self.stop.is_set():
            try:
                if scheduler.acquire_lock():
                    try:
                        self._coord.wakes.move_due()
                    finally:
                        scheduler.remove_lock()
                if time.monotonic() >= next_reconcile:
                    rebuild(self._coord, now_ms=_now_ms())
                    next_reconcile = time.monotonic() + settings.reconcile_interval_s
            except redis.RedisError:
                log.warning("Redis unavailable; retrying", exc_info=True)
                self.stop.wait(1.0)
            except Exception:
                # The mover must keep moving: log, and try again on the next pass.
                log.exception("scheduler pass failed")
                self.stop.wait(1.0)
            self.stop.wait(settings.mover_interval_s)
        log.info("scheduler stopped")
        return 0

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping after this pass", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def run_scheduler(settings: Settings) -> int:
    assert settings.redis_url
    client = redis.Redis.from_url(settings.redis_url)
    loop = SchedulerLoop(Coordination(client, settings))
    loop.install_signal_handlers()
    return loop.run()
