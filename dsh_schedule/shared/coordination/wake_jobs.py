"""What a wake is to rq (docs/architecture.md#wake-projection): its job functions, id,
score and batches, and the job hash a scheduled wake is, shared by the arming side
(``wake``), the mover (``mover``) and the worker.

A scheduled wake is an rq-scheduler job scored at its target's exact millisecond
(``target_ms / 1000`` epoch seconds). The mover hands due wakes on in batched
``wake_batch`` jobs; immediate wakes (a new lease, a released phase, a rebuild) are
``wake_batch`` jobs too, of agents woken now.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import redis
from rq import Queue
from rq.job import Job, JobStatus

WAKE_FUNC: Final = "dsh_schedule.worker.job.wake"
WAKE_BATCH_FUNC: Final = "dsh_schedule.worker.job.wake_batch"
WAKE_ID_PREFIX: Final = "wake_"
WAKE_BATCH: Final = 100
WAKE_TIMEOUT_S: Final = 120


def wake_score(target_ms: int) -> float:
    """A wake's score in the schedule: its target in epoch seconds, to the millisecond."""
    return target_ms / 1000


def wake_job_id(agent: str, target_ms: int) -> str:
    """``wake_<hex of agent id>_<epoch second>`` (rq ids allow only [A-Za-z0-9_-])."""
    return f"wake_{agent.encode().hex()}_{target_ms // 1000}"


def wake_agent(job_id: str) -> str:
    """The agent a wake id names (``wake_job_id``, with or without its ``_<n>`` suffix);
    ``ValueError`` when the id is not one."""
    if not job_id.startswith(WAKE_ID_PREFIX):
        raise ValueError(f"not a wake id: {job_id!r}")
    return bytes.fromhex(job_id.removeprefix(WAKE_ID_PREFIX).split("_", 1)[0]).decode()


class ScheduledWake(msgspec.Struct, frozen=True, array_like=True):
    """A scheduled wake the mover handed on: the agent and the target it was armed for."""

    agent: str
    target_ms: int


def scheduled_wake(job: Job, score: float) -> ScheduledWake:
    """The wake a scheduled wake job stands for, from its id and its ``score`` in the
    schedule (the target, ``wake_score``); a job armed before wake jobs were slimmed
    carries the agent and the target as its rq arguments, and those are used
    (docs/decisions.md#wake-jobs-slimmed-to-a-listpack). ``ValueError`` (or rq's
    ``DeserializationError``) when the job is not a readable wake."""
    if job.args:
        agent, target_ms = job.args
        return ScheduledWake(agent, target_ms)
    return ScheduledWake(wake_agent(job.id), round(score * 1000))


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


def decode_wakes(payload: Any) -> WakeBatch:
    """The batch of a ``wake_batch`` job; ``msgspec.ValidationError`` when malformed."""
    batch: WakeBatch = msgspec.convert(payload, type=WakeBatch)
    return batch


def batch_job(batch: WakeBatch) -> Any:
    """The rq enqueue data of a ``wake_batch`` job."""
    return Queue.prepare_data(
        WAKE_BATCH_FUNC, args=(batch_payload(batch),), result_ttl=0, timeout=WAKE_TIMEOUT_S * 10
    )


# A scheduled wake's rq description: the agent is in its id, the target is its score.
WAKE_DESCRIPTION: Final = "wake"
# Fields of rq's ``to_dict`` a wake's job hash leaves out: rq restores a missing
# ``created_at`` as the moment it reads the job, and a wake's moment is its score.
_UNSTORED: Final = frozenset({"created_at"})


def wake_job_hash(client: redis.Redis, job_id: str, queue: str) -> dict[str, Any]:
    """The job hash of a scheduled wake: what rq-scheduler's ``enqueue_at`` writes (rq's
    own ``Job.to_dict``), slimmed (docs/decisions.md#wake-jobs-slimmed-to-a-listpack): no
    rq arguments (the agent is in the id, the target is the score: ``scheduled_wake``), a
    short description, no ``created_at`` and none of the empty fields, so every value stays
    under Redis's default ``hash-max-listpack-value`` whatever the agent id."""
    job = Job.create(
        WAKE_FUNC,
        connection=client,
        description=WAKE_DESCRIPTION,
        result_ttl=0,
        ttl=None,
        id=job_id,
        timeout=WAKE_TIMEOUT_S,
        status=JobStatus.SCHEDULED,
        origin=queue,
    )
    return {name: value for name, value in job.to_dict().items()
            if value != "" and name not in _UNSTORED}
