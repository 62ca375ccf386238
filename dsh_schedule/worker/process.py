"""The ``worker`` process: an rq SimpleWorker on the schedule queue
(docs/architecture.md#processes-and-cli).

rq's worker handles SIGTERM and SIGINT with a warm shutdown: the wake in hand finishes
its transaction before the process exits. Through a Redis outage the process keeps
running: rq's loop gives up on a lost connection or an error reply that means "not now"
(``is_outage``: OOM, READONLY, NOREPLICAS, ...), so we wait until Redis takes a write
again (one line when it goes away, one when it is back) and start a new rq worker
(docs/architecture.md#outages).

A thread of the worker beats every few seconds, also while a wake runs: into our worker
ZSET, so a scheduler notices a dead worker and wakes again the agents it held
(docs/architecture.md#a-dead-workers-wakes), and into rq's registration, which it writes
again whenever Redis lost it (a flush, a restart without persistence), since rq itself
registers only at its start.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from contextlib import suppress
from typing import Any

import redis
from redis.typing import EncodableT
from rq import Queue, SimpleWorker, worker_registration

from dsh_schedule.shared.collector import tune_for_service
from dsh_schedule.shared.coordination.connection import connect
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.outage import Outage, is_outage
from dsh_schedule.shared.coordination.workers import Held, WorkerLiveness
from dsh_schedule.shared.logging_setup import log_context, rq_level_name
from dsh_schedule.shared.settings import Settings
from dsh_schedule.worker.due import DueOwner
from dsh_schedule.worker.job import build_owner, held_by, serving

log = logging.getLogger(__name__)


def liveness_ms(settings: Settings) -> int:
    """How long a worker may go without a beat before a scheduler takes it for dead: half
    its lock and maintenance TTLs (15 s by default). Noticing sooner would gain nothing:
    the agents it held can be taken again only once those expire."""
    return max(int(min(settings.lock_ttl_s, settings.maintenance_ttl_s) * 500), 300)


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
        self, *args: Any, owner: DueOwner, outage: Outage | None = None,
        liveness: WorkerLiveness | None = None, liveness_ms: int = 15_000, **kwargs: Any
    ) -> None:
        kwargs.setdefault("worker_ttl", self.WORKER_TTL_S)
        super().__init__(*args, **kwargs)
        self.owner = owner
        self.outage = outage
        self.liveness = liveness
        self.liveness_ms = liveness_ms
        self._held: Held | None = None
        self._stop_beat = threading.Event()
        self._beater: threading.Thread | None = None

    # -- liveness and registration ---------------------------------------------------

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[no-untyped-call]
        if self.liveness is None:
            return
        self.beat()
        self._beater = threading.Thread(target=self._beat_loop, name="worker-beat",
                                        daemon=True)
        self._beater.start()

    def register_death(self) -> None:
        self._stop_beating()
        super().register_death()  # type: ignore[no-untyped-call]
        if self.liveness is not None:
            self.liveness.leave(self.name)

    def teardown(self) -> None:
        self._stop_beating()
        try:
            super().teardown()  # type: ignore[no-untyped-call]
        except redis.RedisError:
            # rq skips its unsubscribe when its death cannot be registered.
            with suppress(Exception):
                self.unsubscribe()  # type: ignore[no-untyped-call]
            raise

    def _stop_beating(self) -> None:
        self._stop_beat.set()
        beater, self._beater = self._beater, None
        if beater is not None and beater is not threading.current_thread():
            beater.join(timeout=5)

    def _beat_loop(self) -> None:
        every_s = self.liveness_ms / 3000
        while not self._stop_beat.wait(every_s):
            try:
                self.beat()
                self.owner.repay_owed()  # Redis answers: the wakes a failed batch owes
            except redis.RedisError as exc:
                if not is_outage(exc):
                    log.exception("worker heartbeat failed")
                # an outage: the worker's loop says so, once
            except Exception:
                log.exception("worker heartbeat failed")

    def beat(self) -> None:
        """One beat: our liveness entry, and rq's registration written again where Redis
        lost it (rq's worker sets, and its worker hash, whose TTL this also keeps at
        rq's idle one while a job runs). One round trip; two when Redis lost the hash."""
        assert self.liveness is not None
        with self.connection.pipeline(transaction=False) as pipe:
            self.liveness.beat_on(pipe, self.name, next_within_ms=self.liveness_ms)
            worker_registration.register(self, pipe)
            pipe.hexists(self.key, "birth")
            pipe.expire(self.key, self.worker_ttl + 60)
            replies = pipe.execute()
        if not replies[-2]:
            self._register_again()

    def _register_again(self) -> None:
        """Write rq's worker hash again (Redis lost it), as rq's registration does."""
        # rq's states are str enums: redis-py writes their values, as rq's set_state does.
        mapping: dict[EncodableT, EncodableT] = {**self.serialize(),
                                                 "state": self.get_state()}
        held = self._held
        if held is not None:
            mapping["current_job"] = held.job
        with self.connection.pipeline() as pipe:
            pipe.hset(self.key, mapping=mapping)
            pipe.expire(self.key, self.worker_ttl + 60)
            if self.liveness is not None:
                self.liveness.holding_on(pipe, self.name, self._held)
            pipe.execute()
        log.warning("worker %s: its registration was gone (Redis lost its keys); "
                    "registered again", self.name)

    def set_current_job_id(self, job_id: str | None = None, pipeline: Any = None) -> None:
        # rq calls this in the pipelines that start and end a job: what the worker holds
        # goes with them, at no round trip of its own.
        super().set_current_job_id(job_id, pipeline)
        if self.liveness is not None:
            self.liveness.holding_on(pipeline if pipeline is not None else self.connection,
                                     self.name, self._held if job_id is not None else None)

    def dequeue_job_and_maintain_ttl(self, *args: Any, **kwargs: Any) -> Any:
        result = super().dequeue_job_and_maintain_ttl(*args, **kwargs)
        if self.outage is not None:
            self.outage.succeeded()  # rq's own retries got through to Redis again
        return result

    def execute_job(self, job: Any, queue: Any) -> None:
        self._held = held_by(job, str(queue.name))
        try:
            # rq's own lines about the job carry its id too.
            with serving(self.owner), log_context(wake_id=str(job.id)):
                super().execute_job(job, queue)
        finally:
            self._held = None

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stop_requested = True
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]


class _OutageNoise(logging.Filter):
    """Turns rq's own lines about a lost connection into our one line per outage."""

    def __init__(self, outage: Outage) -> None:
        super().__init__()
        self._outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        # rq logs some of its failures inside the ``except`` that caught them, with the
        # traceback as text: the exception being handled then tells.
        exc = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        if isinstance(exc, redis.RedisError) and is_outage(exc):
            self._outage.failed(exc)
            return False
        if "could not connect to Redis" in record.getMessage():
            self._outage.failed(ConnectionError())
            return False
        return True


def run_worker(settings: Settings, *, burst: bool = False) -> int:
    """Serve wakes until stopped (or, with ``burst``, until the queue is empty)."""
    if not settings.redis_url:
        raise ValueError("the worker needs a Redis URL")
    client = connect(settings.redis_url, health_check_interval=10)
    owner = build_owner(client, settings)
    keys = Keys(settings.prefix)
    liveness = WorkerLiveness(client, keys)
    tune_for_service()
    outage = Outage(log, "worker")
    stopped = threading.Event()
    logging.getLogger("rq.worker").addFilter(_OutageNoise(outage))
    log.info("worker serving queue %s, sessions in %s", settings.queue, settings.store_shown)
    level = rq_level_name()  # rq would otherwise reset its loggers' level to INFO
    while not stopped.is_set():
        worker = ScheduleWorker(
            [Queue(settings.queue, connection=client)], connection=client, owner=owner,
            outage=outage, liveness=liveness, liveness_ms=liveness_ms(settings),
        )
        try:
            worker.work(burst=burst, with_scheduler=False, logging_level=level)
            if worker.stop_requested or burst:
                return 0
            _probe(client, keys)  # rq's loop gave up: on Redis, or on something else?
            log.error("the rq worker loop stopped unexpectedly; starting a new one")
        except redis.RedisError as exc:
            if not is_outage(exc):
                raise
            if worker.stop_requested:
                return 0
            delay = outage.failed(exc)
            _wait_for_redis(client, keys, outage, delay, stopped)
            continue
        outage.succeeded()
    return 0


def _probe(client: redis.Redis, keys: Keys) -> None:
    """A write, since a Redis that refuses writes (OOM, READONLY, NOREPLICAS) still
    answers PING."""
    client.set(keys.worker_probe(), b"1", px=1000)


def _wait_for_redis(
    client: redis.Redis, keys: Keys, outage: Outage, delay: float, stopped: threading.Event
) -> None:
    """Try a write with backoff until Redis takes it again (or a stop is requested)."""

    def stop(signum: int, frame: object) -> None:
        stopped.set()

    # rq's handlers belong to the worker that gave up; a stop now must end the wait.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopped.wait(delay):
        try:
            _probe(client, keys)
        except redis.RedisError as exc:
            if not is_outage(exc):
                raise
            delay = outage.failed(exc)
            continue
        outage.succeeded()
        return
