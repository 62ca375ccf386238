"""Failpoints: the named points of the due transaction where a test makes a worker process
die or stop (docs/architecture.md#testing).

Every point is named here and nowhere else (``Failpoint``). A process arms at most one,
from ``DSH_SCHEDULE_CRASH_AT`` when it starts (``arm_from_env``): ``<point>`` kills it
with SIGKILL when it reaches the point; ``pause-<point>`` stops it there once with SIGSTOP,
so a test can let its lock and phase expire and then resume it. Unarmed, reaching a point
costs one comparison. Test-only: never set the variable in production.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from enum import Enum
from typing import Final

log = logging.getLogger(__name__)

CRASH_ENV: Final = "DSH_SCHEDULE_CRASH_AT"


class Failpoint(Enum):
    """A point of the due transaction (docs/architecture.md#the-due-transaction)."""

    BEFORE_FOLLOWUP = "before-followup"  # decided and framed; nothing written
    AFTER_FOLLOWUP = "after-followup"  # the followup is in its stream; no dispatch yet
    AFTER_APPEND = "after-append"  # the dispatch is in the log; no barrier flush yet


class _Armed:
    """The one point armed in this process, and what reaching it does."""

    point: Failpoint | None = None
    pause: bool = False


def arm_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Arm the point ``DSH_SCHEDULE_CRASH_AT`` names (nothing when unset or unknown)."""
    hook = environ.get(CRASH_ENV, "")
    pause = hook.startswith("pause-")
    name = hook.removeprefix("pause-")
    _Armed.point = next((p for p in Failpoint if p.value == name), None)
    _Armed.pause = pause


def reach(point: Failpoint) -> None:
    """This process has reached ``point``: die or stop there when it is armed."""
    if _Armed.point is not point:
        return
    if _Armed.pause:
        _Armed.point = None  # once
        log.warning("crash hook pause-%s: pausing the worker", point.value)
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        log.warning("crash hook %s: killing the worker", point.value)
        os.kill(os.getpid(), signal.SIGKILL)


arm_from_env()
