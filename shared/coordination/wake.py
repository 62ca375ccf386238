"""The wake projection on rq-scheduler (docs/architecture.md#wake-projection).

Each live agent with work has one *current* wake: an rq-scheduler job scheduled at its
next decision time on the queue beside its session store. Arming happens under the
per-agent lock. A wake id that may be queued or running is never re-scheduled (rq's
success handling would overwrite or delete it): a new id is used instead. Immediate
wakes (a new lease, a released phase, a rebuild) are plain rq jobs with rq's own ids.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

import msgspec
import redis
from redis.client import Pipeline
from rq import Queue
from rq.job import Job, JobStatus

from dsh_schedule.shared.coordination.keys import Keys

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from rq_scheduler import Scheduler

# rq-scheduler samples datetime.utcnow(), deprecated on newer Pythons; silence that
# module's warning only.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"rq_scheduler(\..*)?")

log = logging.getLogger(__name__)

WAKE_FUNC: Final = "dsh_schedule.worker.job.wake"
WAKE_BATCH_FUNC: Final = "dsh_schedule.worker.job.wake_batch"
WAKE_BATCH: Final = 100
MOVE_BATCH: Final = 25
WAKE_TIMEOUT_S: Final = 120


class PrefixedScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler with its global keys under our prefix, moving wakes in batches.

    rq-scheduler's own pass (``enqueue_jobs``) picks the due jobs; a due wake is taken out
    of the schedule and its (agent, target) handed on in a ``wake_many`` job of up to
    ``MOVE_BATCH`` wakes per queue, so a worker pays rq's per-job cost once per batch.
    """

    def __init__(self, keys: Keys, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scheduled_jobs_key = keys.scheduled_jobs()
        self.scheduler_lock_key = keys.scheduler_lock()
        self.scheduler_key = keys.scheduler()
        self.redis_scheduler_namespace_prefix = keys.scheduler_instances()
        self.moved = 0
        self._batches: dict[str, list[ScheduledWake]] = {}
        self._take = self.connection.register_script(_UNSCHEDULE)

    def enqueue_jobs(self) -> Any:
        self._batches = {}
        try:
            return super().enqueue_jobs()
        finally:
            self.flush_batches()

    def enqueue_job(self, job: Job) -> None:
        if job.func_name != WAKE_FUNC:
            super().enqueue_job(job)
            self.moved += 1
            return
        # Only the pass that takes the wake out of the schedule hands it on.
        if self._take(keys=[self.scheduled_jobs_key, job.key], args=[job.id]):
            agent, target_ms = job.args
            self._batches.setdefault(job.origin, []).append(ScheduledWake(agent, target_ms))
            self.moved += 1

    def flush_batches(self) -> None:
        """Enqueue the collected wakes, in target order, ``MOVE_BATCH`` per rq job."""
        batches, self._batches = self._batches, {}
        if not batches:
            return
        with self.connection.pipeline() as pipe:
            for queue_name, items in batches.items():
                items.sort(key=lambda wake: wake.target_ms)
                chunks = [items[i : i + MOVE_BATCH] for i in range(0, len(items), MOVE_BATCH)]
                Queue(queue_name, connection=self.connection).enqueue_many(
                    [_batch_job(DueWakes(wakes=tuple(chunk))) for chunk in chunks],
                    pipeline=pipe,
                )
            pipe.execute()


# KEYS[1] the schedule (sorted set), KEYS[2] the wake's rq job hash; ARGV[1] the job id.
# Only a wake still waiting in the schedule is ours to delete; one already moved to the
# queue runs, finds nothing due (or re-arms) and removes itself.
_UNSCHEDULE = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
"""


def _batch_job(batch: WakeBatch) -> Any:
    """The rq enqueue data of a ``wake_batch`` job."""
    return Queue.prepare_data(
        WAKE_BATCH_FUNC, args=(batch_payload(batch),), result_ttl=0, timeout=WAKE_TIMEOUT_S * 10
    )


class ArmRequest(NamedTuple):
    """One agent's wake to arm: its target (None: no wake) and its queue."""

    agent: str
    target_ms: int | None
    queue: str


class ScheduledWake(msgspec.Struct, frozen=True, array_like=True):
    """A scheduled wake the mover handed on: the agent and the target it was armed for."""

    agent: str
    target_ms: int


class DueWakes(msgspec.Struct, frozen=True, tag="due"):
    """The mover's batch: scheduled wakes that came due, each handled on its own."""

    wakes: tuple[ScheduledWake, ...]


class ImmediateWakes(msgspec.Struct, frozen=True, tag="immediate"):
    """A rebuild's batch: live agents woken now, decided together."""

    agents: tuple[str, ...]


WakeBatch = DueWakes | ImmediateWakes


def batch_payload(batch: WakeBatch) -> dict[str, Any]:
    """The rq job argument for a batch (plain JSON-able data, tagged by kind)."""
    payload: dict[str, Any] = msgspec.to_builtins(batch)
    return payload


def decode_batch(payload: Any) -> WakeBatch:
    """The batch of a ``wake_batch`` job; ``msgspec.ValidationError`` when malformed."""
    batch: WakeBatch = msgspec.convert(payload, type=WakeBatch)
    return batch


def wake_job_id(agent: str, target_ms: int) -> str:
    """``wake_<hex of agent id>_<epoch second>`` (rq ids allow only [A-Za-z0-9_-])."""
    return f"wake_{agent.encode().hex()}_{target_ms // 1000}"


class WakeProjection:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        self.scheduler = PrefixedScheduler(keys, connection=client)
        self._unschedule_script = client.register_script(_UNSCHEDULE)

    def current(self, agent: str) -> str | None:
        value = self._client.get(self._keys.current_wake(agent))
        return value.decode() if isinstance(value, bytes) else None

    def is_scheduled(self, job_id: str) -> bool:
        return self._client.zscore(self.scheduler.scheduled_jobs_key, job_id) is not None

    def arm(self, agent: str, target_ms: int | None, queue: str) -> str | None:
        """Make ``target_ms`` the agent's one current wake (None: no wake). Hold the lock."""
        return self.arm_many([ArmRequest(agent, target_ms, queue)])[0]

    def arm_many(self, requests: Sequence[ArmRequest]) -> list[str | None]:
        """``arm`` for many agents in one read and one write round trip; hold every
        agent's lock. Returns each agent's current wake id (None: no wake)."""
        with self._client.pipeline(transaction=False) as pipe:
            for r in requests:
                pipe.get(self._keys.current_wake(r.agent))
            current = [v.decode() if isinstance(v, bytes) else None for v in pipe.execute()]
        with self._client.pipeline(transaction=False) as pipe:
            for r, previous in zip(requests, current, strict=True):
                if r.target_ms is not None:
                    base = wake_job_id(r.agent, r.target_ms)
                    pipe.exists(Job.key_for(base))
                    pipe.zscore(self.scheduler.scheduled_jobs_key, previous or base)
            facts = iter(pipe.execute())
        results: list[str | None] = []
        with self._client.pipeline() as pipe:
            for r, previous in zip(requests, current, strict=True):
                if r.target_ms is None:
                    self._retire(r.agent, previous, pipe)
                    results.append(None)
                    continue
                job_id = wake_job_id(r.agent, r.target_ms)
                taken, previous_score = next(facts), next(facts)
                if (
                    previous is not None
                    and (previous == job_id or previous.startswith(f"{job_id}_"))
                    and previous_score is not None
                ):
                    results.append(previous)  # already armed for this second
                    continue
                if taken:
                    # Queued, running or failed under this id: never re-schedule it.
                    job_id = f"{job_id}_{self._client.incr(self._keys.wake_counter(r.agent))}"
                self._schedule(r.agent, r.target_ms, r.queue, job_id, previous, pipe)
                results.append(job_id)
            pipe.execute()
        return results

    def _schedule(
        self, agent: str, target_ms: int, queue: str, job_id: str, previous: str | None,
        pipe: Pipeline,
    ) -> None:
        """What rq-scheduler's ``enqueue_at`` writes (a scheduled rq job and its whole-
        second score), plus the current-wake pointer and the superseded wake's removal."""
        job = Job.create(
            WAKE_FUNC,
            args=(agent, target_ms),
            connection=self._client,
            result_ttl=0,
            ttl=None,
            id=job_id,
            timeout=WAKE_TIMEOUT_S,
            status=JobStatus.SCHEDULED,
            origin=queue,
        )
        job.save(pipeline=pipe)
        pipe.zadd(self.scheduler.scheduled_jobs_key, {job_id: target_ms // 1000})
        pipe.set(self._keys.current_wake(agent), job_id)
        if previous is not None and previous != job_id:
            self._unschedule(previous, pipe)
        log.debug("armed %s for %s at %d", job_id, agent, target_ms)

    def trigger(self, agent: str, queue: str) -> None:
        """Enqueue an immediate wake; the wake decides everything under the lock."""
        Queue(queue, connection=self._client).enqueue(
            WAKE_FUNC, agent, None, result_ttl=0, job_timeout=WAKE_TIMEOUT_S
        )

    def trigger_many(self, agents_by_queue: dict[str, list[str]]) -> int:
        """Enqueue immediate wakes for many agents: one rq job per ``WAKE_BATCH`` agents
        of a queue, all in one pipelined round trip. Returns the number of jobs."""
        jobs = 0
        with self._client.pipeline() as pipe:
            for queue_name, agents in agents_by_queue.items():
                queue = Queue(queue_name, connection=self._client)
                batches = [agents[i : i + WAKE_BATCH] for i in range(0, len(agents), WAKE_BATCH)]
                queue.enqueue_many(
                    [_batch_job(ImmediateWakes(agents=tuple(batch))) for batch in batches],
                    pipeline=pipe,
                )
                jobs += len(batches)
            pipe.execute()
        return jobs

    def cancel(self, agent: str) -> None:
        """Remove the agent's current wake (disposal)."""
        self._retire(agent, self.current(agent))

    def _retire(self, agent: str, previous: str | None, pipe: Pipeline | None = None) -> None:
        client = pipe if pipe is not None else self._client
        if previous is not None:
            self._unschedule(previous, pipe)
        client.delete(self._keys.current_wake(agent), self._keys.wake_counter(agent))

    def _unschedule(self, job_id: str, pipe: Pipeline | None = None) -> None:
        self._unschedule_script(
            keys=[self.scheduler.scheduled_jobs_key, Job.key_for(job_id)],
            args=[job_id],
            client=pipe if pipe is not None else self._client,
        )

    def move_due(self, now_ms: int | None = None) -> int:
        """One rq-scheduler pass: hand every due wake to its queue; how many it moved.

        ``now_ms`` replaces rq-scheduler's own clock sample (in-process runs on an
        injected clock); the score comparison stays rq-scheduler's whole seconds.
        """
        before = self.scheduler.moved
        if now_ms is None:
            self.scheduler.enqueue_jobs()
        else:
            try:
                for job in list(self.scheduler.get_jobs(until=now_ms // 1000)):
                    self.scheduler.enqueue_job(job)
            finally:
                self.scheduler.flush_batches()
        return int(self.scheduler.moved - before)
