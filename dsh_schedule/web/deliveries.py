"""Deliveries read from session logs: when a session's latest reminder was delivered, and
the lateness of recent deliveries (delivered message time minus occurrence) as the
operations page's histogram. Reading only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from dsh_schedule.shared.core.events import Event
from dsh_schedule.web.transcript import is_reminder_message, occurrence_ms, reminder_pairs

SCAN_EVENTS: Final = 2000  # how far back a summary or the histogram looks in one log
RECENT_DELIVERIES: Final = 500  # the histogram counts at most the latest this many

# Lateness buckets, upper bounds in seconds (the last is open).
LATENESS_BOUNDS: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Bucket:
    label: str
    count: int
    share: float  # of the largest bucket, 0..1 (bar length)


@dataclass(frozen=True)
class Lateness:
    """The lateness of recent deliveries: delivered message time minus occurrence."""

    count: int
    buckets: tuple[Bucket, ...]
    median_ms: int | None
    p90_ms: int | None
    max_ms: int | None



def last_delivery_ms(events: Sequence[Event]) -> int | None:
    """When the latest reminder was delivered into the log (within the last
    ``SCAN_EVENTS`` events)."""
    for index in range(len(events) - 1, max(len(events) - SCAN_EVENTS, 0) - 1, -1):
        event = events[index]
        if is_reminder_message(event):
            return event.time
    return None



def deliveries(events: Sequence[Event]) -> list[tuple[int, int]]:
    """``(delivered at, lateness)`` in ms for every reminder each delivered message
    carries, within the last ``SCAN_EVENTS`` events."""
    found = []
    for event in events[max(len(events) - SCAN_EVENTS, 0):]:
        if not is_reminder_message(event):
            continue
        for _schedule_id, occurrence in reminder_pairs(event):
            at = occurrence_ms(occurrence)
            if at is not None:
                found.append((event.time, event.time - at))
    return found


def _bucket_label(index: int) -> str:
    if index == 0:
        return f"< {LATENESS_BOUNDS[0]:g} s"
    if index == len(LATENESS_BOUNDS):
        return f"≥ {LATENESS_BOUNDS[-1]:g} s"
    return f"{LATENESS_BOUNDS[index - 1]:g}–{LATENESS_BOUNDS[index]:g} s"


def _percentile(ordered: Sequence[int], fraction: float) -> int:
    """The nearest-rank percentile of a sorted, non-empty sequence."""
    rank = max(math.ceil(fraction * len(ordered)), 1)
    return ordered[rank - 1]


def lateness(found: Iterable[tuple[int, int]], *, limit: int = RECENT_DELIVERIES) -> Lateness:
    """The histogram of the latest ``limit`` deliveries' lateness. A negative lateness (a
    message whose time lies before its occurrence: clocks of different machines) counts
    in the first bucket."""
    recent = sorted(found)[-limit:] if limit > 0 else []
    counts = [0] * (len(LATENESS_BOUNDS) + 1)
    for _at, late_ms in recent:
        seconds = late_ms / 1000
        index = next((i for i, bound in enumerate(LATENESS_BOUNDS) if seconds < bound),
                     len(LATENESS_BOUNDS))
        counts[index] += 1
    most = max(counts)
    buckets = tuple(Bucket(label=_bucket_label(i), count=n, share=n / most if most else 0.0)
                    for i, n in enumerate(counts))
    ordered = sorted(late for _at, late in recent)
    return Lateness(
        count=len(ordered),
        buckets=buckets,
        median_ms=_percentile(ordered, 0.5) if ordered else None,
        p90_ms=_percentile(ordered, 0.9) if ordered else None,
        max_ms=ordered[-1] if ordered else None,
    )
