"""The ``worker`` process: an rq SimpleWorker on the schedule queue
(docs/architecture.md#processes-and-cli).

rq's worker handles SIGTERM and SIGINT with a warm shutdown: the wake in hand finishes
its transaction before the process exits.
"""

from __future__ import annotations

import logging

import redis
from rq import Queue, SimpleWorker

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.worker import job
from dsh_schedule.worker.due import DueOwner

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def build_owner(client: redis.Redis, settings: Settings) -> DueOwner:
    store = JsonlStore(settings.sessions)
    return DueOwner(store, Coordination(client, settings), clock=wall_clock_ms)


def run_worker(settings: Settings, *, burst: bool = False) -> int:
    """Serve wakes until stopped; the caller has checked that a Redis URL is set."""
    assert settings.redis_url
    client = redis.Redis.from_url(settings.redis_url)
    job.install(build_owner(client, settings))
    queue = Queue(settings.queue, connection=client)
    worker = SimpleWorker([queue], connection=client)
    log.info("worker serving queue %s, sessions in %s", settings.queue, settings.sessions)
    level = logging.getLevelName(logging.getLogger().level)
    worker.work(burst=burst, with_scheduler=False, logging_level=level)
    return 0
