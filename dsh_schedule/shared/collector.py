"""The garbage collector's settings for the long-running processes: the worker, the
scheduler and the host (docs/decisions.md#delivery, "The collector").

A due transaction or a delivery allocates many short-lived objects, and CPython's default
collector then runs a young-generation pass every 700 net allocations, walking the
survivors each time; under a burst that was a fifth of a worker's time. Start-up objects
(imports, settings, the agents a host serves) never become garbage, so they are frozen out
of the collector's sight, and the youngest generation is collected less often. Cycles are
still collected: this changes when, not whether.
"""

from __future__ import annotations

import gc
from typing import Final

# Net allocations between young-generation passes (CPython's default is 700).
YOUNG_THRESHOLD: Final = 50_000


def tune_for_service() -> None:
    """Freeze everything allocated so far and collect the young generation less often.
    Call once a process has started, before it begins serving."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
