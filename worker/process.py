"""The ``worker`` process: an rq SimpleWorker on the schedule queue
(docs/architecture.md#processes-and-cli).

rq's worker handles SIGTERM and SIGINT with a warm shutdown: the wake in hand finishes
its transaction before the process exits. Through a Redis outage the process keeps
running: rq's loop gives up on a lost connection, so we wait for Redis (one line when it
goes away, one when it is back) and start a new rq worker (docs/architecture.md#outages).
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import redis
from rq import Queue, SimpleWorker

from dsh_schedule.shared.collector import tune_for_service
from dsh_schedule.shared.coordination.outage import Outage
from dsh_schedule.shared.logging_setup import log_context, rq_level_name
from dsh_schedule.shared.settings import Settings
from dsh_schedule.worker.due import DueOwner
from dsh_schedule.worker.job import build_owner, serving

log = logging.getLogger(__name__)


class ScheduleWorker(SimpleWorker):
    """rq's SimpleWorker that runs every wake job with ``owner``, and remembers a stop
    request, so a loop around it can tell a requested stop from an rq loop that gave up
    on Redis."""

    stop_requested = False
    # rq retries a lost connection while it waits for a job, doubling its pause up to this
    # cap: keep it short, so the worker is back soon after Redis is.
    max_connection_wait_time = 2.0
    # rq's worker key expires this + 60 s after the last heartbeat, and an idle worker
    # beats every this - 15 s: a killed worker leaves rq's registry (which ``status`` and
    # ``health`` read) within 90 s, not rq's default 480 s.
    WORKER_TTL_S = 30

    def __init__(
        self, *args: Any, owner: DueOwner, outage: Outage | None = None, **kwargs: Any
    ) -> None:
        kwargs.setdefault("worker_ttl", self.WORKER_TTL_S)
        super().__init__(*args, **kwargs)
        self.owner = owner
        self.outage = outage

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        result = super().dequeue_job_and_maintain_ttl(*args, **kwargs)
        if self.outage is not None:
            self.outage.succeeded()  # rq's own retries got through to Redis again
        return result

    def execute_job(self, job: Any, queue: Any) -> None:
        # rq's own lines about the job carry its id too.
        with serving(self.owner), log_context(wake_id=str(job.id)):
            super().execute_job(job, queue)

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stop_requested = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]


class _OutageNoise(logging.Filter):
    """Turns rq's own lines about a lost connection into our one line per outage."""

    def __init__(self, outage: Outage) -> None:
        super().__init__()
        self._outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            return False
        if "could not connect to Redis" in record.getMessage():
            self._outage.failed(ConnectionError())
            return False
        return True


def run_worker(settings: Settings, *, burst: bool = False) -> int:
    """Serve wakes until stopped (or, with ``burst``, until the queue is empty)."""
    if not settings.redis_url:
        raise ValueError("the worker needs a Redis URL")
    client = redis.Redis.from_url(settings.redis_url, health_check_interval=10)
    owner = build_owner(client, settings)
    tune_for_service()
    outage = Outage(log, "worker")
    stopped = threading.Event()
    logging.getLogger("rq.worker").addFilter(_OutageNoise(outage))
    log.info("worker serving queue %s, sessions in %s", settings.queue, settings.sessions)
    level = rq_level_name()  # rq would otherwise reset its loggers' level to INFO
    while not stopped.is_set():
        worker = ScheduleWorker(
            [Queue(settings.queue, connection=client)], connection=client, owner=owner,
            outage=outage,
        )
        try:
            worker.work(burst=burst, with_scheduler=False, logging_level=level)
            if worker.stop_requested or burst:
                return 0
            client.ping()  # rq's loop gave up: on Redis, or on something else?
            log.error("the rq worker loop stopped unexpectedly; starting a new one")
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if worker.stop_requested:
                return 0
            delay = outage.failed(exc)
            _wait_for_redis(client, outage, delay, stopped)
            continue
        outage.succeeded()
    return 0


def _wait_for_redis(
    client: redis.Redis, outage: Outage, delay: float, stopped: threading.Event
) -> None:
    """Ping with backoff until Redis answers again (or a stop is requested)."""

    def stop(signum: int, frame: object) -> None:
        stopped.set()

    # rq's handlers belong to the worker that gave up; a stop now must end the wait.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopped.wait(delay):
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            delay = outage.failed(exc)
            continue
        outage.succeeded()
        return
