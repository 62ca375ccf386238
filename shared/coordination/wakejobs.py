"""What a wake is to rq (docs/architecture.md#wake-projection): the job functions a worker
runs, a scheduled wake's id and score, and the tagged batches of ``wake_batch`` jobs (the
mover's due wakes, a rebuild's or a release's immediate ones), shared by the arming side
(``wake``) and the mover (``mover``).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from rq import Queue

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


def batch_job(batch: WakeBatch) -> Any:
    """The rq enqueue data of a ``wake_batch`` job."""
    return Queue.prepare_data(
        WAKE_BATCH_FUNC, args=(batch_payload(batch),), result_ttl=0, timeout=WAKE_TIMEOUT_S * 10
    )
