"""What the next occurrence of a calendar rule costs, in process (docs/benchmarks.md).

Not a test (nothing here asserts a timing): a measurement to run by hand::

    .venv/bin/python -m tests.bench.cron_next --calls 200000 --seed 1

Each call draws a rule (half from a table of the rules people ask for, half generated at
random from the whole grammar), a zone (any zone the tool accepts) and an instant in
2020-2040, and times one ``next_after`` alone with ``perf_counter_ns`` (and once more
with ``thread_time_ns``, the CPU time, which a busy machine's pre-emptions do not
inflate); then the same for
``latest_at_or_before`` (the catch-up question) and for parsing an expression uncached.
It prints one JSON line of percentiles in microseconds.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import random
import time
from collections.abc import Callable
from typing import Any

from dsh_schedule.shared.core.cron import CronRule, parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.timesel import is_valid_zone, load_zone

COMMON = [
    "0 9 * * MON-FRI",
    "30 8 * * 1-5",
    "0 9 * * *",
    "*/5 * * * *",
    "*/15 9-17 * * 1-5",
    "0 0 1 * *",
    "0 12 * * SUN",
    "30 2 * * *",
    "0 0 29 2 *",
    "0 9 1,15 * *",
    "0 18 * * FRI",
    "0 9 13 * 5",
    "0 */2 * * *",
    "45 23 31 12 *",
    "0 7 * JUN-AUG SAT,SUN",
]


def random_field(rng: random.Random, low: int, high: int) -> str:
    items = []
    for _ in range(rng.randint(1, 3)):
        first = rng.randint(low, high)
        last = rng.randint(first, high)
        form = rng.choice(["*", "value", "range", "step", "from"])
        items.append(
            {
                "*": "*",
                "value": str(first),
                "range": f"{first}-{last}",
                "step": f"*/{rng.randint(1, high - low + 1)}",
                "from": f"{first}/{rng.randint(1, high - low + 1)}",
            }[form]
        )
    return ",".join(items)


def random_rule(rng: random.Random) -> CronRule:
    """A rule of the whole grammar that is accepted and can occur."""
    while True:
        shift = rng.randint(0, 4)
        minutes = ",".join(
            str(shift + 5 * v) for v in sorted(rng.sample(range(12), rng.randint(1, 4)))
        )
        text = " ".join(
            [
                minutes,
                random_field(rng, 0, 23),
                random_field(rng, 1, 31),
                random_field(rng, 1, 12),
                random_field(rng, 0, 7),
            ]
        )
        try:
            rule = parse_rule(text)
        except ToolError:
            continue
        if rule.possible:
            return rule


def zones() -> list[str]:
    text = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return sorted(name for name in text.split() if is_valid_zone(name))


def percentiles(samples: list[int]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(share: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))] / 1000, 2)

    return {
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": round(ordered[-1] / 1000, 2),
    }


def timed(
    calls: list[Callable[[], Any]], clock: Callable[[], int] = time.perf_counter_ns
) -> list[int]:
    samples = []
    for call in calls:
        start = clock()
        call()
        samples.append(clock() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    names = zones()
    common = [parse_rule(text) for text in COMMON]
    generated = [random_rule(rng) for _ in range(2000)]
    low, high = parse_instant("2020-01-01T00:00:00.000Z"), parse_instant("2040-01-01T00:00:00.000Z")
    draws = [
        (
            rng.choice(common) if rng.random() < 0.5 else rng.choice(generated),
            load_zone(rng.choice(names)),
            rng.randint(low, high),
        )
        for _ in range(args.calls)
    ]
    for rule, zone, instant in draws[:2000]:  # warm the zone and date caches
        next_after(rule, zone, instant)
    texts = [rule.expression for rule, _, _ in draws[:20_000]]
    print(
        json.dumps(
            {
                "calls": args.calls,
                "zones": len(names),
                "next_after_us": percentiles(
                    timed([lambda r=r, z=z, t=t: next_after(r, z, t) for r, z, t in draws])
                ),
                "next_after_cpu_us": percentiles(
                    timed(
                        [lambda r=r, z=z, t=t: next_after(r, z, t) for r, z, t in draws],
                        time.thread_time_ns,
                    )
                ),
                "latest_at_or_before_us": percentiles(
                    timed([lambda r=r, z=z, t=t: latest_at_or_before(r, z, t) for r, z, t in draws])
                ),
                "parse_uncached_us": percentiles(
                    timed([lambda s=s: parse_rule.__wrapped__(s) for s in texts])
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
