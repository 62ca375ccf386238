"""The rq job behind every wake: ``worker.job.wake(agent, target_ms)``.

The process that runs the job installs its owner once (``install``); the scheduler side
only names this function by its import path, so the two packages never import each other.
"""

from __future__ import annotations

import logging

from worker.due import DueOwner

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


def wake_many(agents: list[str]) -> None:
    """A rebuild's batch: wake each agent in turn; one agent's failure spares the rest."""
    for agent in agents:
        try:
            wake(agent, None)
        except Exception:
            log.exception("wake for %s failed", agent)
