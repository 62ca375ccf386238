"""How a wake ends (``WakeOutcome``), and the crash points tests stop a worker at
(docs/architecture.md#testing).
"""

from __future__ import annotations

import logging
import os
import signal
from enum import Enum
from typing import Final

log = logging.getLogger(__name__)

CRASH_ENV: Final = "DSH_SCHEDULE_CRASH_AT"


class WakeOutcome(Enum):
    """How a wake ended. Only ``SETTLED`` re-arms; every other outcome leaves the records
    active for a later wake (the phase release, a management call, a new lease or the
    reconcile pass)."""

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


_paused_once = False


def crash_point(name: str) -> None:
    """Test-only: SIGKILL this process at the named point (docs/architecture.md#testing).

    ``pause-<point>`` stops the process there once (SIGSTOP) instead, so a test can let
    its lock and phase expire and then resume it.
    """
    global _paused_once
    hook = os.environ.get(CRASH_ENV)
    if hook == name:
        log.warning("crash hook %s: killing the worker", name)
        os.kill(os.getpid(), signal.SIGKILL)
    elif hook == f"pause-{name}" and not _paused_once:
        _paused_once = True
        log.warning("crash hook %s: pausing the worker", hook)
        os.kill(os.getpid(), signal.SIGSTOP)
