"""The one wall clock: integer epoch milliseconds.

The pure core never reads it; the shell samples it and passes ``now`` in. Tests inject
any callable of the same type.
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000
