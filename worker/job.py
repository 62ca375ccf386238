"""The rq job behind every wake: ``dsh_schedule.worker.job.wake(agent, target_ms)``.

The process that runs the job installs its owner once (``install``); the scheduler side
only names this function by its import path, so the two packages never import each other.
"""

from __future__ import annotations

import logging
from typing import Any

from dsh_schedule.worker.due import DueOwner

log = logging.getLogger(__name__)

_owner: DueOwner | None = None


def install(owner: DueOwner) -> None:
    """Make ``owner`` perform the wakes this process runs."""
    global _owner
    _owner = owner


def wake(agent: str, target_ms: int | None) -> None:
    if _owner is None:
        raise RuntimeError("no due owner installed in this worker process")
    _owner.wake(agent, target_ms)


def wake_many(items: list[Any]) -> None:
    """A batch of wakes, in order: agent ids (a rebuild's immediate wakes, decided
    together) or ``[agent, target_ms]`` pairs (scheduled wakes the mover handed on).
    One wake's failure spares the rest."""
    if _owner is None:
        raise RuntimeError("no due owner installed in this worker process")
    if all(isinstance(item, str) for item in items):
        _owner.wake_batch(items)
        return
    for item in items:
        agent, target_ms = (item, None) if isinstance(item, str) else (item[0], item[1])
        try:
            _owner.wake(agent, target_ms)
        except Exception:
            log.exception("wake for %s failed", agent)
