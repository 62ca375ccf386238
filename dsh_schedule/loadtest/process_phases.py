"""The phases where every part is a real process: idle agents, a burst of due reminders,
and the memory of a worker and a host that served long sessions.

Each phase runs in a runtime of its own (a prefix and queue of its own) on the ``--redis``
server: ``--workers`` real ``dsh-schedule worker`` processes (one for the memory phase),
one ``scheduler`` and one host process (the ``dsh-schedule host`` command, started through
``loadtest.host``). Figures are read from outside those processes: CPU time and memory
from ``/proc``, commands from Redis ``INFO``, and times from the session logs they wrote.
Each phase then measures the bare libraries on the same server in a runtime of its own:
rq-scheduler's own loop in a process and stock rq ``SimpleWorker`` processes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Final

from rq import Queue

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.agents import FAR_S, Plan, create_args, timed_calls
from dsh_schedule.loadtest.figures import (
    BurstFigure,
    CpuWindow,
    IdleFigure,
    ProcessMemoryFigure,
)
from dsh_schedule.loadtest.process_costs import CpuSampler, cores_between
from dsh_schedule.loadtest.process_runtime import RedisRuntime
from dsh_schedule.loadtest.rebuild import measure_memory
from dsh_schedule.loadtest.runtime import LoadtestError, queue_idle
from dsh_schedule.loadtest.sessions import (
    DAY_MS,
    SessionTails,
    reminders,
    served_session,
    write_session,
    write_sessions,
)
from dsh_schedule.loadtest.stats import (
    ArmCurve,
    Latency,
    Progress,
    Stopwatch,
    arm_curve,
    cost_ratio,
    latency,
    memory_total,
)
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.instant import format_instant, to_datetime

RuntimeFactory = Callable[[str, int], RedisRuntime]
"""A runtime of its own for a phase: (name suffix, number of ``dsh-schedule`` workers)."""

# Creates timed before a burst, on far-future reminders, to learn how far ahead the due
# second must lie for every burst create to be answered before it.
PROBE_CREATES: Final = 200
# Agents a host process opens per second, and wakes the workers run per second, at the
# very least: the waits for a phase's set-up are sized by these (and bounded by
# --max-seconds).
SETUP_PER_S: Final = 20
DELIVERIES_PER_S: Final = 20
EVENTS_PER_S: Final = 20_000


def _names(tag: str, count: int) -> list[str]:
    # Every agent id starts with the runtime's tag: its keys and wake ids are deleted by it.
    return [f"{tag}-{i}" for i in range(count)]


def _whole_second_after(ms: float) -> int:
    return math.ceil(ms / 1000) * 1000


# -- idle agents ------------------------------------------------------------------------


def measure_idle(open_runtime: RuntimeFactory, plan: Plan, progress: Progress) -> IdleFigure:
    """N live agents, each with one far-future reminder and nothing else to do: what every
    process costs per second over a window after a warm-up; then N idle rq-scheduler jobs."""
    n = plan.idle_agents
    progress.phase("idle", f"{n:,} live agents with one far-future reminder each; "
                   f"{plan.idle_window_s} s window after {plan.idle_warmup_s} s warm-up")
    tag = f"{plan.tag}-idle"
    rt = open_runtime("idle", plan.workers)
    try:
        names = _names(tag, n)
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


def _open_bare(open_runtime: RuntimeFactory, plan: Plan, progress: Progress, name: str,
               what: str) -> tuple[RedisRuntime, str, str]:
    """The runtime of the bare libraries' phase ``name`` (announced as ``what``), its job
    tag and its key prefix."""
    progress.note(f"bare: {what}, one rq-scheduler process, {plan.workers} stock rq worker(s)")
    rt = open_runtime(name, 0)
    return rt, f"{plan.tag}-{name}", f"{rt.settings.prefix}bare:"


def _bare_idle(open_runtime: RuntimeFactory, plan: Plan, progress: Progress) -> CpuWindow:
    n = plan.idle_agents
    rt, tag, prefix = _open_bare(open_runtime, plan, progress, "bidle",
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


# -- a burst of due reminders -------------------------------------------------------------


def measure_burst(open_runtime: RuntimeFactory, plan: Plan, progress: Progress) -> BurstFigure:
    """N agents, each with one reminder due in the same second: how late each dispatch
    (followup) and each delivered message came; then N rq jobs due at once."""
    n = plan.burst_agents
    progress.phase("burst", f"{n:,} reminders due in the same second on {n:,} agents")
    tag = f"{plan.tag}-burst"
    rt = open_runtime("burst", plan.workers)
    try:
        names = _names(tag, n)
        write_sessions(rt.store, names, [], created_at_ms=wall_clock_ms())
        os.sync()
        rt.start_workers()
        rt.start_mover()
        rt.start_host(names)
        live = Keys(rt.settings.prefix).agent_host()
        queue = Queue(rt.settings.queue, connection=rt.client)
        if not rt.wait(lambda: int(rt.client.hlen(live)) >= n and queue_idle(rt.client, queue),
                       120.0 + n / SETUP_PER_S, status=lambda: progress.tick(
                           f"{int(rt.client.hlen(live)):,}/{n:,} agents leased")):
            raise LoadtestError(f"burst: {int(rt.client.hlen(live)):,} of {n:,} agents were "
                                "leased in time")
        tools = ScheduleTools(rt.store, Coordination(rt.client, rt.settings), rt.settings,
                              wall_clock_ms)
        due_ms = _due_second(
            lambda i: not tools.call(names[i], "schedule_create",
                                     create_args(i, FAR_S)).is_error, n, plan)
        at = format_instant(due_ms)
        progress.note(f"creating {n:,} reminders due at {at}")
        created = [False] * n

        def create(i: int) -> bool:
            args = {"prompt": f"burst reminder {i}", "at": at}
            created[i] = not tools.call(names[i], "schedule_create", args).is_error
            return created[i]

        tails = SessionTails({name: rt.store.path(name) for name in names})
        _lat, _seconds, errors = timed_calls(create, n, plan.threads, progress)
        slack_s = (due_ms - wall_clock_ms()) / 1000
        tools.close()
        tails.forget(name for name, ok in zip(names, created, strict=True) if not ok)
        sampler = CpuSampler(rt.client, rt.pids())
        rt.sleep(max(0.0, (due_ms - wall_clock_ms()) / 1000))
        at_due = sampler.read()
        rt.wait(lambda: tails.poll() == 0, max(0.0, slack_s) + 60 + n / DELIVERIES_PER_S,
                status=lambda: progress.tick(f"{n - errors - tails.pending():,}/"
                                             f"{n - errors:,} delivered"), poll_s=1.0)
        spent = cores_between(at_due, sampler.read())
        cpu_s = {name: None if cores is None else round(cores * spent.seconds, 3)
                 for name, cores in spent.cores.items()}
        followup = [ms - due_ms for ms in tails.dispatched.values()]
        session = [ms - due_ms for ms in tails.delivered.values()]
    finally:
        rt.close()
    bare_lat, bare_slack_s, bare_count = _bare_burst(open_runtime, plan, progress)
    mine_followup, mine_session = latency(followup), latency(session)
    return BurstFigure(
        agents=n, created=n - errors, errors=errors, due_at=at, slack_s=round(slack_s, 3),
        dispatched=len(followup), delivered=len(session), missing=n - errors - len(session),
        followup=mine_followup, session=mine_session, bare_jobs=bare_count, bare=bare_lat,
        bare_slack_s=round(bare_slack_s, 3),
        ratio_p99=cost_ratio(mine_followup.p99_ms, bare_lat.p99_ms), cpu_s=cpu_s,
    )


def _due_second(probe: Callable[[int], bool], count: int, plan: Plan) -> int:
    """The whole second, ``lead_s`` past how long ``count`` more calls like ``probe`` take at
    the pace of the probe calls (with half again to spare), by which to be due."""
    k = min(count, PROBE_CREATES)
    _lat, seconds, _failed = timed_calls(probe, k, plan.threads)
    per_s = k / seconds if seconds > 0 else 1000.0
    return _whole_second_after(wall_clock_ms() + (plan.lead_s + 1.5 * count / per_s) * 1000)


def _bare_burst(open_runtime: RuntimeFactory, plan: Plan,
                progress: Progress) -> tuple[Latency, float, int]:
    n = plan.burst_agents
    rt, tag, prefix = _open_bare(open_runtime, plan, progress, "bburst",
                                 f"{n:,} rq jobs due at once")
    try:
        rt.start_bare_workers(rt.settings.queue, plan.workers)
        rt.start_bare_scheduler(prefix, rt.settings.queue)
        scheduler = bare.scheduler_for(prefix, rt.client)
        stream = f"{rt.settings.prefix}bare-marks"
        far = wall_clock_ms() + DAY_MS

        def enqueue(job: str, due: int, func: str, args: Sequence[Any]) -> bool:
            scheduler.enqueue_at(to_datetime(due), func, *args, job_id=job, job_result_ttl=0,
                                 job_ttl=None, timeout=bare.JOB_TIMEOUT_S,
                                 queue_name=rt.settings.queue)
            return True

        due_ms = _due_second(lambda i: enqueue(f"{tag}-p{i}", far, bare.NOOP, ()), n, plan)
        timed_calls(lambda i: enqueue(f"{tag}-{i}", due_ms, bare.MARK, (stream, due_ms)), n,
                    plan.threads)
        slack_s = (due_ms - wall_clock_ms()) / 1000
        rt.wait(lambda: int(rt.client.xlen(stream)) >= n, max(0.0, slack_s) + 60 + n / 100,
                poll_s=0.2)
        marks: Any = rt.client.xrange(stream)
        ran = [int(i.split(b"-")[0]) - int(f[b"due"]) for i, f in marks]
    finally:
        rt.close()
    return latency(ran), slack_s, len(ran)


# -- process memory -----------------------------------------------------------------------


class _Overgrown(Exception):
    """A process passed the memory guard; the phase stops waiting."""


def measure_process_memory(open_runtime: RuntimeFactory, plan: Plan,
                           progress: Progress) -> ProcessMemoryFigure:
    """K sessions of E events, each woken once by the worker and served once by the host
    (one reminder dispatched and delivered): the worker's and the host's resident memory
    after, and at their peak."""
    k, e = plan.memory_sessions, plan.memory_events
    progress.phase("memory", f"{k:,} sessions of {e:,} events, each woken and served once "
                   "(one worker, one host)")
    tag = f"{plan.tag}-mem"
    guard = _memory_guard()
    note: str | None = None
    rt = open_runtime("mem", 1)
    try:
        names = _names(tag, k)
        now = wall_clock_ms()
        events = served_session(e, now_ms=now)
        written = write_sessions(rt.store, names, events, created_at_ms=now - e * 1000 - 2 * DAY_MS)
        os.sync()
        progress.note(f"{written / 2**20:,.0f} MiB of sessions written")
        rt.start_workers()
        rt.start_mover()
        worker_start = rt.rss("worker-1")[0]
        tails = SessionTails({name: rt.store.path(name) for name in names})
        queue = Queue(rt.settings.queue, connection=rt.client)
        watch = Stopwatch()
        rt.start_host(names)

        def status() -> None:
            for role in ("worker-1", "host"):
                rss = rt.rss(role)[0]
                if rss is not None and rss > guard:
                    raise _Overgrown(f"{role} passed {guard / 2**20:,.0f} MiB")
            progress.tick(f"{k - tails.pending():,}/{k:,} sessions served")

        try:
            done = rt.wait(lambda: tails.poll() == 0 and queue_idle(rt.client, queue),
                           120.0 + k * e / EVENTS_PER_S, status=status, poll_s=1.0)
        except _Overgrown as exc:
            done, note = False, f"stopped early: {exc} (the memory guard, a quarter of RAM)"
        seconds = watch.seconds() if done else None
        served = k - tails.pending()
        worker, host, scheduler = rt.rss("worker-1"), rt.rss("host"), rt.rss("scheduler")
    finally:
        rt.close()
    if note is None and served < k:
        note = f"only {served:,} of {k:,} sessions were served in time"
    return ProcessMemoryFigure(
        sessions=k, events_per_session=e, session_bytes=written, served=served,
        seconds=None if seconds is None else round(seconds, 1),
        worker_rss_bytes=worker[0], worker_hwm_bytes=worker[1],
        worker_start_rss_bytes=worker_start,
        host_rss_bytes=host[0], host_hwm_bytes=host[1],
        scheduler_rss_bytes=scheduler[0],
        bare_worker_rss_bytes=_bare_worker_rss(open_runtime), note=note,
    )


def _bare_worker_rss(open_runtime: RuntimeFactory) -> int | None:
    """The resident memory of one stock rq ``SimpleWorker`` process, started and idle."""
    rt = open_runtime("bmem", 0)
    try:
        rt.start_bare_workers(rt.settings.queue, 1)
        rt.sleep(1.0)
        return rt.rss("worker-1")[0]
    finally:
        rt.close()


def _memory_guard() -> int:
    total = memory_total()
    return (total if total is not None else 16 * 2**30) // 4
