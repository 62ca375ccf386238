"""The idle-agents phase, every part a real process: many agents with nothing due, their
Redis memory and the CPU the processes spend while they wait (``cpu_window``), against
rq-scheduler's own loop and stock rq workers on the same server.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rq import Queue

from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.agents import Plan, timed_calls
from dsh_schedule.loadtest.figures import (
    CpuWindow,
    IdleFigure,
)
from dsh_schedule.loadtest.process_costs import CpuSampler, cores_between
from dsh_schedule.loadtest.process_phases import (
    SETUP_PER_S,
    RuntimeFactory,
    agent_names,
    open_bare,
)
from dsh_schedule.loadtest.process_runtime import RedisRuntime
from dsh_schedule.loadtest.rebuild import measure_memory
from dsh_schedule.loadtest.runtime import LoadtestError, queue_idle
from dsh_schedule.loadtest.sessions import (
    DAY_MS,
    reminders,
    write_session,
)
from dsh_schedule.loadtest.stats import (
    ArmCurve,
    Progress,
    Stopwatch,
    arm_curve,
    cost_ratio,
)
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.instant import to_datetime


def measure_idle(open_runtime: RuntimeFactory, plan: Plan, progress: Progress) -> IdleFigure:
    """N live agents, each with one far-future reminder and nothing else to do: what every
    process costs per second over a window after a warm-up; then N idle rq-scheduler jobs."""
    n = plan.idle_agents
    progress.phase("idle", f"{n:,} live agents with one far-future reminder each; "
                   f"{plan.idle_window_s} s window after {plan.idle_warmup_s} s warm-up")
    tag = f"{plan.tag}-idle"
    rt = open_runtime("idle", plan.workers)
    try:
        names = agent_names(tag, n)
        base = wall_clock_ms() + DAY_MS
        for i, name in enumerate(names):
            write_session(rt.store, name, reminders(1, agent_index=i, base_ms=base),
                          created_at_ms=base - 2 * DAY_MS, durable=False)
            progress.tick(f"writing sessions {i + 1:,}/{n:,}")
        os.sync()
        before = _used_memory(rt)
        rt.start_workers()
        rt.start_mover()
        scheduled = Keys(rt.settings.prefix).scheduled_jobs()
        queue = Queue(rt.settings.queue, connection=rt.client)

        def armed() -> bool:
            return int(rt.client.zcard(scheduled)) >= n and queue_idle(rt.client, queue)

        def arm_all(what: str, start: Callable[[], object]) -> tuple[float, ArmCurve]:
            """``start``, then wait until every agent is armed: the seconds it took from
            the start, and the arming curve."""
            watch = Stopwatch()
            start()
            samples: list[tuple[float, int]] = []

            def sample() -> None:
                count = int(rt.client.zcard(scheduled))
                samples.append((watch.seconds(), count))
                progress.tick(f"{count:,}/{n:,} agents armed{what}")

            if not rt.wait(armed, 120.0 + n / SETUP_PER_S, status=sample):
                raise LoadtestError(f"idle: {int(rt.client.zcard(scheduled)):,} of {n:,} "
                                    f"agents were armed{what} in time")
            seconds = watch.seconds()
            samples.append((seconds, n))
            curve = arm_curve(samples, n)
            progress.note(f"{n:,} agents armed{what} in {seconds:.1f} s; "
                          f"{curve.first_tenth_per_s} agents/s over the first tenth, "
                          f"{curve.last_tenth_per_s} over the last")
            return seconds, curve

        ready_s, arming = arm_all("", lambda: rt.start_host(names))
        bytes_per_agent = round((_used_memory(rt) - before) / n, 1)
        progress.note("warming up")
        rt.sleep(plan.idle_warmup_s)
        progress.note(f"measuring {plan.idle_window_s} s")
        ours = cpu_window(rt, plan.idle_window_s, n)
        host_rss = _rss_mib(rt, ["host"])
        worker_rss = _rss_mib(rt, [r for r in rt.pids() if r.startswith("worker-")])
        by_key = measure_memory(rt.client, Coordination(rt.client, rt.settings), names,
                                None).by_key
        progress.note(f"host {host_rss} MiB, worker {worker_rss} MiB; Redis per agent "
                      f"{by_key}; losing every key at once")
        recovered_s, flush_arming = arm_all(" again after the flush",
                                            lambda: rt.delete_own_keys(at_once=True))
        progress.note(f"every wake back {recovered_s:.1f} s after the flush")
    finally:
        rt.close()
    progress.note(f"ours: {ours.cores_per_1000_agents} cores per 1,000 agents, "
                  f"{ours.commands_per_s:,.0f} Redis commands/s")
    bare_window = _bare_idle(open_runtime, plan, progress)
    return IdleFigure(
        agents=n, host_processes=1, workers=plan.workers, ready_seconds=round(ready_s, 1),
        warmup_s=plan.idle_warmup_s, ours=ours, bare=bare_window,
        ratio=cost_ratio(ours.total_cores, bare_window.total_cores),
        ratio_commands=cost_ratio(ours.commands_per_s, bare_window.commands_per_s),
        bytes_per_agent=bytes_per_agent, bytes_by_key=by_key, host_rss_mib=host_rss,
        worker_rss_mib=worker_rss, flush_recovery_seconds=round(recovered_s, 1),
        arming=arming, flush_arming=flush_arming,
    )


def _rss_mib(rt: RedisRuntime, roles: list[str]) -> float | None:
    """The largest resident size (VmRSS) of the processes in ``roles``, in MiB."""
    sizes = [rss for role in roles if (rss := rt.rss(role)[0]) is not None]
    return round(max(sizes) / 2**20, 1) if sizes else None


def _used_memory(rt: RedisRuntime) -> int:
    info: Any = rt.client.info("memory")
    return int(info["used_memory"])


def _bare_idle(open_runtime: RuntimeFactory, plan: Plan, progress: Progress) -> CpuWindow:
    n = plan.idle_agents
    rt, tag, prefix = open_bare(open_runtime, plan, progress, "bidle",
                                 f"{n:,} far-future rq-scheduler jobs")
    try:
        scheduler = bare.scheduler_for(prefix, rt.client)
        target = wall_clock_ms() + DAY_MS

        def schedule(i: int) -> bool:
            scheduler.enqueue_at(
                to_datetime(target + (i % 3600) * 1000), bare.NOOP, job_id=f"{tag}-{i}",
                job_result_ttl=0, job_ttl=None, timeout=bare.JOB_TIMEOUT_S,
                queue_name=rt.settings.queue)
            return True

        timed_calls(schedule, n, plan.threads)
        rt.start_bare_workers(rt.settings.queue, plan.workers)
        rt.start_bare_scheduler(prefix, rt.settings.queue)
        rt.sleep(plan.idle_warmup_s)
        window = cpu_window(rt, plan.idle_window_s, n)
    finally:
        rt.close()
    progress.note(f"bare: {window.cores_per_1000_agents} cores per 1,000 jobs, "
                  f"{window.commands_per_s:,.0f} Redis commands/s")
    return window


def cpu_window(rt: RedisRuntime, seconds: float, agents: int) -> CpuWindow:
    """CPU seconds per second of each process of ``rt`` and of the redis-server over
    ``seconds``, during which this process sends Redis nothing."""
    sampler = CpuSampler(rt.client, rt.pids())
    first = sampler.read()
    rt.sleep(seconds)
    last = sampler.read()
    window = cores_between(first, last)
    measured = [v for v in window.cores.values() if v is not None]
    total = round(sum(measured), 6) if measured else None
    return CpuWindow(
        seconds=window.seconds, processes=window.cores, total_cores=total,
        cores_per_1000_agents=None if total is None else round(total * 1000 / agents, 6),
        commands_per_s=window.commands_per_s, commands_by_type=window.commands_by_type,
        redis_cpu_from=sampler.redis_source,
    )
