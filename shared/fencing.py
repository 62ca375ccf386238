"""Retrying a fenced append: a conflict is normal, not an error.

An append names the log length it decided on; when another writer got there first the
store raises ``FenceConflict`` and the caller re-reads, re-folds and re-decides
(docs/architecture.md#session-logs). A conflict that persists for every attempt is
``FenceRetriesExhausted``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, TypeVar

from dsh_schedule.shared.core.errors import FenceConflict, ScheduleError

FENCE_ATTEMPTS: Final = 4

T = TypeVar("T")
log = logging.getLogger(__name__)


class FenceRetriesExhausted(ScheduleError):
    """Every attempt of a fenced transaction met a conflicting writer."""

    def __init__(self, what: str, attempts: int) -> None:
        self.what = what
        self.attempts = attempts
        super().__init__(f"{what}: the log kept moving under {attempts} attempts")


def retry_fenced(what: str, attempt: Callable[[int], T], *, attempts: int = FENCE_ATTEMPTS) -> T:
    """Run ``attempt(n)`` for n = 0, 1, … until it returns without ``FenceConflict``.

    Each attempt must re-read and re-decide from scratch: the decision is recomputed, so
    a conflict can never slip a stale decision in.
    """
    for n in range(attempts):
        try:
            return attempt(n)
        except FenceConflict as conflict:
            log.info("%s: fence conflict (%s), re-deciding", what, conflict)
    raise FenceRetriesExhausted(what, attempts)
