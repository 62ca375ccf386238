"""The creates phase: one-shot creates on ``--hosts`` in-process hosts against the bare
library's enqueue and fsynced append, then ``every_seconds`` beside ``cron`` creates, and
creates with the lifecycle off beside creates and updates with it on, in alternating blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.agents import (
    FAR_S,
    OpResult,
    Plan,
    create_args,
    open_agents,
    timed_calls,
)
from dsh_schedule.loadtest.figures import CreateFigure
from dsh_schedule.loadtest.runtime import Runtime
from dsh_schedule.loadtest.stats import (
    Latency,
    Progress,
    cost_ratio,
    latency,
    per_second,
    rate_ratio,
)
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.core.instant import to_datetime
from dsh_schedule.shared.settings import MAX_ACTIVE_CEILING

# The cron creates' zones: with and without daylight saving, a 30-minute change, UTC.
CRON_ZONES: Final = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                     "Asia/Tokyo", "UTC")


# The cron creates' times of day: every five minutes of the day, 288 distinct rules (which
# the rule parser's cache holds, as it would a host's few hundred rules).
CRON_TIMES: Final = 288


def recurring_args(kind: str, i: int, month: int) -> dict[str, Any]:
    """An ``every_seconds`` create, or a weekday ``cron`` rule of ``month`` at one of
    ``CRON_TIMES`` times of day in one of ``CRON_ZONES``."""
    prompt = f"load reminder {i}"
    if kind == "every":
        return {"prompt": prompt, "every_seconds": FAR_S + i}
    minute_of_day = i % CRON_TIMES * 5
    expression = f"{minute_of_day % 60} {minute_of_day // 60} * {month} MON-FRI"
    return {"prompt": prompt,
            "cron": {"expression": expression, "time_zone": CRON_ZONES[i % len(CRON_ZONES)]}}


# Recurring creates run in this many alternating blocks of each kind, so that what else
# the machine does weighs on both kinds alike.
RECURRING_BLOCKS: Final = 4


def _recurring_creates(rt: Runtime, plan: Plan, progress: Progress
                       ) -> dict[str, tuple[float | None, Latency, int]]:
    """``plan.creates`` creates of each recurring kind, each kind on fresh agents of its
    own, in alternating blocks: per kind its rate, latency and failures."""
    progress.note("every_seconds and cron creates, alternating")
    settings = msgspec.structs.replace(rt.settings, calendar=True)
    kinds = ("every", "cron")
    hosts = {kind: open_agents(rt, plan, [f"{plan.tag}-{kind}{i}"
                                          for i in range(plan.create_agents)], settings=settings)
             for kind in kinds}
    handlers = {kind: [hosts[kind].tool(f"{plan.tag}-{kind}{i}")
                       for i in range(plan.create_agents)] for kind in kinds}
    # The month after next: like every_seconds = FAR_S, nothing falls due while the load
    # test runs.
    month = (to_datetime(wall_clock_ms()).month + 1) % 12 + 1
    block = max(1, plan.creates // RECURRING_BLOCKS)
    lat: dict[str, list[float]] = {kind: [] for kind in kinds}
    seconds = dict.fromkeys(kinds, 0.0)
    errors = dict.fromkeys(kinds, 0)
    for first in range(0, plan.creates, block):
        count = min(block, plan.creates - first)
        for kind in kinds:
            def create(i: int, kind: str = kind, first: int = first) -> bool:
                calls = handlers[kind]
                args = recurring_args(kind, first + i, month)
                return not calls[(first + i) % len(calls)](args).is_error

            part, spent, failed = timed_calls(create, count, plan.threads)
            lat[kind] += part
            seconds[kind] += spent
            errors[kind] += failed
    for kind in kinds:
        hosts[kind].close()
    return {kind: (per_second(plan.creates - errors[kind], seconds[kind]), latency(lat[kind]),
                   errors[kind]) for kind in kinds}


def _lifecycle_calls(rt: Runtime, plan: Plan, progress: Progress) -> dict[str, float | None]:
    """``plan.creates`` calls of each of: creates with the lifecycle off, creates with it on
    (fresh agents each), prompt updates of the records the second made; in alternating
    blocks: per kind its rate (None when a call failed)."""
    progress.note("creates with the lifecycle off and on, and updates, alternating")
    # No cap in the way of the run's own creates: what is timed is the check, not a refusal.
    switched = {
        "off": rt.settings,
        "on": msgspec.structs.replace(rt.settings, lifecycle=True,
                                      max_active=MAX_ACTIVE_CEILING),
    }
    hosts = {key: open_agents(rt, plan, [f"{plan.tag}-l{key}{i}"
                                         for i in range(plan.create_agents)], settings=settings)
             for key, settings in switched.items()}
    agents = plan.create_agents

    def create(key: str) -> Callable[[int], bool]:
        def call(i: int) -> bool:
            name = f"{plan.tag}-l{key}{i % agents}"
            return not hosts[key].tool(name)(create_args(i, FAR_S + i)).is_error
        return call

    def update(i: int) -> bool:
        name = f"{plan.tag}-lon{i % agents}"
        # The create of call i was the (i // agents + 1)-th of its agent.
        args = {"id": f"schedule-{i // agents + 1}", "prompt": f"load reminder {i}, edited"}
        return not hosts["on"].tool(name, "schedule_update")(args).is_error

    calls = {"off": create("off"), "on": create("on"), "update": update}
    seconds = dict.fromkeys(calls, 0.0)
    errors = dict.fromkeys(calls, 0)
    block = max(1, plan.creates // RECURRING_BLOCKS)
    for first in range(0, plan.creates, block):
        count = min(block, plan.creates - first)
        # Which create goes first changes from block to block (the update needs its creates).
        order = ("off", "on", "update") if first // block % 2 == 0 else ("on", "off", "update")
        for key in order:
            op = calls[key]

            def shifted(i: int, op: Callable[[int], bool] = op, first: int = first) -> bool:
                return op(first + i)

            _, spent, failed = timed_calls(shifted, count, plan.threads)
            seconds[key] += spent
            errors[key] += failed
    for group in hosts.values():
        group.close()
    return {key: per_second(plan.creates, seconds[key]) if errors[key] == 0 else None
            for key in calls}


# -- creates ----------------------------------------------------------------------------


def measure_create(rt: Runtime, plan: Plan, progress: Progress) -> CreateFigure:
    progress.phase("create", f"{plan.creates} creates on {plan.create_agents} agents, "
                   f"{plan.threads} threads")
    names = [f"{plan.tag}-c{i}" for i in range(plan.create_agents)]
    hosts = open_agents(rt, plan, names)
    handlers = [hosts.tool(n) for n in names]

    def create(i: int) -> bool:
        return not handlers[i % len(handlers)](create_args(i, FAR_S + i)).is_error

    ours, seconds, errors = timed_calls(create, plan.creates, plan.threads, progress)
    hosts.close()
    progress.note("bare: enqueue_at + fsynced append")
    bare_lat, bare_seconds, _ = bare_creates(rt, plan, names)
    mine, lib = latency(ours), latency(bare_lat)
    per_s = per_second(plan.creates - errors, seconds)
    bare_per_s = per_second(plan.creates, bare_seconds)
    recurring = _recurring_creates(rt, plan, progress)
    every_per_s, every_latency, every_errors = recurring["every"]
    cron_per_s, cron_latency, cron_errors = recurring["cron"]
    lifecycle = _lifecycle_calls(rt, plan, progress)
    return CreateFigure(
        hosts=plan.hosts, agents=plan.create_agents, threads=plan.threads, count=plan.creates,
        errors=errors + every_errors + cron_errors,
        seconds=round(seconds, 3), per_s=per_s, latency=mine, bare_per_s=bare_per_s,
        bare_latency=lib, ratio_per_s=rate_ratio(per_s, bare_per_s),
        ratio_p50=cost_ratio(mine.p50_ms, lib.p50_ms),
        ratio_p99=cost_ratio(mine.p99_ms, lib.p99_ms),
        every_per_s=every_per_s, every_latency=every_latency, cron_per_s=cron_per_s,
        cron_latency=cron_latency, cron_vs_every=rate_ratio(cron_per_s, every_per_s),
        lifecycle_off_per_s=lifecycle["off"], lifecycle_create_per_s=lifecycle["on"],
        lifecycle_update_per_s=lifecycle["update"],
        lifecycle_create_vs_off=_over(lifecycle["on"], lifecycle["off"]),
        lifecycle_update_vs_off=_over(lifecycle["update"], lifecycle["off"]),
    )


def _over(rate: float | None, base: float | None) -> float | None:
    return None if rate is None or not base else round(rate / base, 3)


def bare_creates(rt: Runtime, plan: Plan, names: Sequence[str]) -> OpResult:
    root = rt.store.root / f"{plan.tag}-bare"
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"{n}.jsonl" for n in names]
    scheduler = bare.scheduler_for(f"{rt.settings.prefix}bare:", rt.client)
    start = wall_clock_ms() + FAR_S * 1000

    def create(i: int) -> bool:
        bare.bare_create(scheduler, rt.settings.queue, paths[i % len(paths)],
                         f"{plan.tag}-bc-{i}", start + i)
        return True

    return timed_calls(create, plan.creates, plan.threads)
