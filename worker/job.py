"""The rq job behind every wake: ``worker.job.wake(agent, target_ms)``.

The process that runs the job installs its owner once (``install``); the scheduler side
only names this function by its import path, so the two packages never import each other.
"""

from __future__ import annotations

from worker.due import DueOwner

_owner: DueOwner | None = None


def install(owner: DueOwner) -> None:
    """Make ``owner`` perform the wakes this process runs."""
    global _owner
    _owner = owner


def wake(agent: str, target_ms: int | None) -> None:
    if _owner is None:
        raise RuntimeError("no due owner installed in this worker process")
    _owner.wake(agent, target_ms)
