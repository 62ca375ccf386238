"""How a wake ends (``WakeOutcome``)."""

from __future__ import annotations

from enum import Enum


class WakeOutcome(Enum):
    """How a wake ended. Only ``SETTLED`` re-arms; every other outcome leaves the records
    active for a later wake (the phase release, a management call, a new lease, the
    reconcile pass, or the worker's own retry of a wake that failed: ``worker/retry.py``)."""

    SETTLED = "settled"
    NOT_LIVE = "not-live"
    LOCK_BUSY = "lock-busy"
    WAITING_FOR_IDLE = "waiting-for-idle"
    PREFLIGHT_FAILED = "preflight-failed"
    CORRUPT_LOG = "corrupt-log"
    DISPATCH_ABANDONED = "dispatch-abandoned"
    BARRIER_FAILED = "barrier-failed"
    STILL_DUE = "still-due"
    REDIS_UNAVAILABLE = "redis-unavailable"
    FAILED = "failed"
