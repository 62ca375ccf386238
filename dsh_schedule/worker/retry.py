"""The backoff of a worker's retried wakes (docs/architecture.md#owed-re-arms).

A wake that stopped on a failure of its own agent (the disk refused its preflight, its
append or its barrier, or anything unexpected) leaves the agent's records active with no
wake armed for them: the worker owes the agent a wake, retried after a delay that doubles
with each failure in a row, from ``RETRY_FIRST_S`` to ``RETRY_MAX_S``, so a disk that
recovers sees the reminders delivered within ``RETRY_MAX_S`` (plus a beat), with no tool
call, and a disk that stays broken costs one wake an agent every ``RETRY_MAX_S``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

from dsh_schedule.worker.outcome import WakeOutcome

RETRY_FIRST_S: Final = 2.0
RETRY_MAX_S: Final = 30.0

# The outcomes that leave an agent with no wake armed and nobody else to arm one: each is
# retried. A corrupt log is not (it waits for a repair; a retry would only say so again);
# a lock or phase held, an agent not live, and Redis unavailable each have their owner.
RETRIED: Final = frozenset({
    WakeOutcome.PREFLIGHT_FAILED,
    WakeOutcome.DISPATCH_ABANDONED,
    WakeOutcome.BARRIER_FAILED,
    WakeOutcome.STILL_DUE,
    WakeOutcome.FAILED,
})


class WakeRetries:
    """How many wakes in a row each agent's failed; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, int] = {}

    def failed(self, agent: str) -> float:
        """Count one more failure; the delay before the agent's next try, in seconds."""
        with self._lock:
            failures = self._failures.get(agent, 0) + 1
            self._failures[agent] = failures
        return min(RETRY_FIRST_S * float(2 ** min(failures - 1, 32)), RETRY_MAX_S)

    def ended(self, agents: Iterable[str]) -> None:
        """These agents' wakes ended without a failure of their own: start over."""
        with self._lock:
            for agent in agents:
                self._failures.pop(agent, None)
