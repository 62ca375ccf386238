"""The one wall clock: integer epoch milliseconds.

The pure core never reads it; the shell samples it and passes ``now`` in. Tests inject
any callable of the same type. Decisions about time across processes read the clock
they share instead, Redis's (``dsh_schedule.shared.coordination.clock``); this one is
what a process believes, and what that shared clock compares it with.

Test-only: ``DSH_SCHEDULE_TEST_CLOCK_SKEW`` (seconds, may be negative or fractional),
read once when the process starts, shifts this wall clock, so a test can run a process
whose machine's clock is wrong. Never set it in production.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Final

log = logging.getLogger(__name__)

Clock = Callable[[], int]

SKEW_ENV: Final = "DSH_SCHEDULE_TEST_CLOCK_SKEW"


class _Skew:
    """The test-only shift of this process's wall clock, in milliseconds."""

    ms: int = 0


def skew_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Shift the wall clock by ``DSH_SCHEDULE_TEST_CLOCK_SKEW`` seconds (0 when unset or
    unreadable)."""
    text = environ.get(SKEW_ENV, "").strip()
    try:
        _Skew.ms = round(float(text) * 1000) if text else 0
    except ValueError:
        _Skew.ms = 0
    if _Skew.ms:
        log.warning("test clock skew: this process's wall clock is shifted by %+d ms",
                    _Skew.ms)


def wall_clock_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000 + _Skew.ms


skew_from_env()
