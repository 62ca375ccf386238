"""The mover (docs/architecture.md#wake-projection): rq-scheduler with its keys under our
prefix, handing each wake on exactly when its target comes on the clock every process
shares (Redis's, ``coordination.clock``), never before, in batched ``wake_batch`` jobs
shared among a queue's workers. Its script is ``lua/take_due.lua``.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any, Final

import redis
from rq import Queue, worker_registration
from rq.exceptions import NoSuchJobError
from rq.job import Job

from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript
from dsh_schedule.shared.coordination.wake_jobs import (
    WAKE_FUNC,
    WAKE_ID_PREFIX,
    DueWakes,
    ScheduledWake,
    batch_job,
    scheduled_wake,
    wake_score,
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from rq_scheduler import Scheduler

# rq-scheduler samples datetime.utcnow(), deprecated on newer Pythons; silence that
# module's warning only.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"rq_scheduler(\..*)?")

log = logging.getLogger(__name__)

_TAKE_DUE: Final = LuaScript("take_due")
# A mover call takes at most MOVE_TAKE due entries; it hands its wakes on to each queue in
# as many jobs as the queue has workers, of at most MOVE_BATCH wakes each.
MOVE_BATCH: Final = 500
MOVE_TAKE: Final = 1000
# How long the mover trusts its count of a queue's workers.
WORKERS_TTL_S: Final = 10.0


def move_batch_size(wakes: int, workers: int) -> int:
    """How many of a mover call's ``wakes`` for one queue go in one job: an even share
    for each of the queue's ``workers`` (one, when none is registered), at most
    ``MOVE_BATCH``. A burst reaches every worker at once, in as few jobs as that takes:
    each job's round trips to Redis are shared by all its wakes."""
    return max(1, min(MOVE_BATCH, -(-wakes // max(1, workers))))


class PrefixedScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler with its global keys under our prefix and an exact, batched mover.

    ``move_due(now_ms)`` replaces rq-scheduler's pass (whole-second "now", one round trip
    per job): a script takes up to ``MOVE_TAKE`` entries scored at or before ``now_ms``
    per call, oldest first, removing each wake from the schedule and deleting its job hash
    in the same step and returning the hash, so only the pass that took a wake hands it
    on. Each call's wakes go to their queues in one pipelined write, in target order, as
    ``wake_batch`` jobs: as many as the queue has workers, of at most ``MOVE_BATCH``
    wakes each (``move_batch_size``). A due job that is not one of our
    wakes is left to rq-scheduler's own ``enqueue_job``, exactly as its pass would move
    it. Nothing runs rq-scheduler's own loop (``run``, ``enqueue_jobs``) on it: the
    scheduler process calls ``move_due`` from its own.
    """

    def __init__(self, keys: Keys, *, clock: Clock = wall_clock_ms, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.scheduled_jobs_key = keys.scheduled_jobs()
        self.scheduler_lock_key = keys.scheduler_lock()
        self.scheduler_key = keys.scheduler()
        self.redis_scheduler_namespace_prefix = keys.scheduler_instances()
        self.next_due_ms: int | None = None
        self._workers: dict[str, tuple[float, int]] = {}  # queue -> (read at, count)

    def move_due(self, now_ms: int) -> int:
        """Hand on every job scored at or before ``now_ms``; how many were handed on.

        Round trips: one script call per ``MOVE_TAKE`` due entries plus one pipelined
        write per call that took wakes, whatever the size of the burst (a job that is not
        a wake costs what rq-scheduler's own pass costs). A mover that fails between a
        call and its write loses at most that call's wakes, and the reconcile pass wakes
        every live agent again. Afterwards ``next_due_ms`` is the earliest score left in
        the schedule (None: nothing left).
        """
        moved = 0
        others_moved: set[str] = set()
        while True:
            taken: Any = _TAKE_DUE.run(
                self.connection, [self.scheduled_jobs_key],
                [repr(wake_score(now_ms)), MOVE_TAKE, Job.redis_job_namespace_prefix,
                 WAKE_ID_PREFIX],
            )
            next_score, entries = taken
            self.next_due_ms = None if not next_score else round(float(next_score) * 1000)
            wakes: list[tuple[str, ScheduledWake]] = []
            others: list[str] = []
            for entry in entries:
                job_id = entry[0].decode()
                if len(entry) == 1:
                    others.append(job_id)
                    continue
                try:
                    job = self._restored(job_id, entry[1])
                    if job is None:
                        continue  # an entry without its job: dropped, as rq-scheduler does
                    if job.func_name != WAKE_FUNC:
                        self.enqueue_job(job)  # not ours after all: rq-scheduler's way
                        moved += 1
                        continue
                    wake = scheduled_wake(job, float(entry[2]))
                except redis.RedisError:
                    raise
                except Exception:
                    # One unreadable job spares the rest of the chunk.
                    log.exception("scheduled job %s is unreadable: dropped", job_id)
                    continue
                wakes.append((job.origin, wake))
            moved += self._hand_on(wakes)
            repeated = False
            for job_id in others:
                if job_id in others_moved:
                    repeated = True  # a repeating job due again: the next pass moves it
                    continue
                moved += self._enqueue_other(job_id)
                others_moved.add(job_id)
            if len(entries) < MOVE_TAKE or repeated:
                return moved

    def _restored(self, job_id: str, flat_hash: list[bytes]) -> Job | None:
        if not flat_hash:
            return None
        job = Job(id=job_id, connection=self.connection)
        job.restore(dict(zip(flat_hash[::2], flat_hash[1::2], strict=True)))
        return job

    def _hand_on(self, wakes: list[tuple[str, ScheduledWake]]) -> int:
        """Enqueue taken wakes in one pipelined write: per queue, in target order, in
        ``wake_batch`` jobs sized to the queue's workers (``move_batch_size``)."""
        if not wakes:
            return 0
        by_queue: dict[str, list[ScheduledWake]] = {}
        for queue_name, wake in wakes:
            by_queue.setdefault(queue_name, []).append(wake)
        sizes = {name: move_batch_size(len(items), self._worker_count(name))
                 for name, items in by_queue.items()}
        with self.connection.pipeline() as pipe:
            for queue_name, items in by_queue.items():
                items.sort(key=lambda wake: wake.target_ms)
                size = sizes[queue_name]
                chunks = [items[i : i + size] for i in range(0, len(items), size)]
                Queue(queue_name, connection=self.connection).enqueue_many(
                    [batch_job(DueWakes(wakes=tuple(chunk))) for chunk in chunks],
                    pipeline=pipe,
                )
            pipe.execute()
        return len(wakes)

    def _worker_count(self, queue_name: str) -> int:
        """How many rq workers serve ``queue_name``, read at most every ``WORKERS_TTL_S``
        (a worker that died unregistered still counts until rq cleans it up)."""
        now = time.monotonic()
        known = self._workers.get(queue_name)
        if known is not None and now - known[0] < WORKERS_TTL_S:
            return known[1]
        count = int(self.connection.scard(worker_registration.WORKERS_BY_QUEUE_KEY % queue_name))
        self._workers[queue_name] = (now, count)
        return count

    def _enqueue_other(self, job_id: str) -> int:
        """A due job that is not a wake, moved as rq-scheduler's own pass moves it."""
        try:
            job = self.job_class.fetch(job_id, connection=self.connection)
        except NoSuchJobError:
            self.cancel(job_id)
            return 0
        self.enqueue_job(job)
        return 1

