"""Figures of the load test: latency summaries, rates, ratios to the bare libraries, progress.

Every figure is plain data (msgspec Structs), so the JSON result always carries every key;
a figure that was not measured is ``None`` with a note saying why.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import TextIO

import msgspec


class Latency(msgspec.Struct, frozen=True, kw_only=True):
    """A distribution of durations in milliseconds (nearest-rank percentiles)."""

    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    mean_ms: float | None


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None for no values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def latency(values_ms: Sequence[float]) -> Latency:
    ordered = sorted(values_ms)
    return Latency(
        count=len(ordered),
        p50_ms=_round(percentile(ordered, 50)),
        p99_ms=_round(percentile(ordered, 99)),
        max_ms=_round(ordered[-1] if ordered else None),
        mean_ms=_round(sum(ordered) / len(ordered) if ordered else None),
    )


def per_second(count: int, seconds: float) -> float | None:
    return _round(count / seconds, 1) if seconds > 0 and count > 0 else None


def cost_ratio(ours: float | None, bare: float | None) -> float | None:
    """How many times the bare libraries' cost ours is (>1: costlier). For costs."""
    if ours is None or bare is None or bare <= 0:
        return None
    return _round(ours / bare, 2)


def rate_ratio(ours: float | None, bare: float | None) -> float | None:
    """The same cost ratio for rates (bare rate / our rate)."""
    if ours is None or bare is None or ours <= 0:
        return None
    return _round(bare / ours, 2)


class ArmCurve(msgspec.Struct, frozen=True, kw_only=True):
    """How fast agents were armed at the start and at the end of arming them all: a rate
    that bends (a cost growing with the agents already armed) shows as a last tenth much
    slower than the first."""

    first_tenth_per_s: float | None  # agents armed per second until a tenth were
    last_tenth_per_s: float | None  # from nine tenths armed until all were


def arm_curve(samples: Sequence[tuple[float, int]], total: int) -> ArmCurve:
    """The rates of ``ArmCurve`` from ``(seconds since the start, agents armed)`` samples
    in time order; a rate the samples cannot resolve (no time between them) is None."""

    def first_at(count: float) -> tuple[float, int] | None:
        return next(((t, n) for t, n in samples if n >= count), None)

    def rate(start: tuple[float, int] | None, end: tuple[float, int] | None) -> float | None:
        if start is None or end is None or end[0] <= start[0]:
            return None
        return _round((end[1] - start[1]) / (end[0] - start[0]), 1)

    tenth, nine_tenths = first_at(total / 10), first_at(total * 9 / 10)
    return ArmCurve(first_tenth_per_s=rate((0.0, 0), tenth),
                    last_tenth_per_s=rate(nine_tenths, first_at(total)))


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class Stopwatch:
    """Monotonic seconds since it was started."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self._start


class Progress:
    """Progress lines on stderr, at most one a second per phase (plus phase boundaries)."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._quiet = quiet
        self._clock = Stopwatch()
        self._phase = ""
        self._last = -math.inf

    def phase(self, name: str, detail: str = "") -> None:
        self._phase = name
        self._last = -math.inf
        self._write(f"{name}: {detail}" if detail else f"{name}: started")

    def tick(self, detail: str) -> None:
        now = self._clock.seconds()
        if now - self._last >= 1.0:
            self._last = now
            self._write(f"{self._phase}: {detail}")

    def note(self, detail: str) -> None:
        self._write(f"{self._phase}: {detail}")

    def _write(self, line: str) -> None:
        if not self._quiet:
            print(f"[loadtest {self._clock.seconds():6.1f}s] {line}", file=self._stream,
                  flush=True)


class Machine(msgspec.Struct, frozen=True, kw_only=True):
    cpus: int | None
    memory_total_bytes: int | None
    python: str
    platform: str
    redis_version: str | None
    load_average: list[float] | None
    """1, 5 and 15-minute load averages at the end of the run (others share the CPUs)."""


def machine(redis_version: str | None) -> Machine:
    return Machine(
        cpus=os.cpu_count(),
        memory_total_bytes=memory_total(),
        python=platform.python_version(),
        platform=platform.platform(),
        redis_version=redis_version,
        load_average=load_average(),
    )


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def memory_total() -> int | None:
    """``MemTotal`` of ``/proc/meminfo`` in bytes (None when it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None
