"""The phases where every part is a real process: idle agents (``process_idle``), a burst
of due reminders, and the memory of a worker and a host that served long sessions.

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
    ProcessMemoryFigure,
)
from dsh_schedule.loadtest.process_costs import CpuSampler, cores_between
from dsh_schedule.loadtest.process_runtime import RedisRuntime
from dsh_schedule.loadtest.runtime import LoadtestError, queue_idle
from dsh_schedule.loadtest.sessions import (
    DAY_MS,
    SessionTails,
    served_session,
    write_sessions,
)
from dsh_schedule.loadtest.stats import (
    Latency,
    Progress,
    Stopwatch,
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


def agent_names(tag: str, count: int) -> list[str]:
    # Every agent id starts with the runtime's tag: its keys and wake ids are deleted by it.
    return [f"{tag}-{i}" for i in range(count)]


def _whole_second_after(ms: float) -> int:
    return math.ceil(ms / 1000) * 1000


def open_bare(open_runtime: RuntimeFactory, plan: Plan, progress: Progress, name: str,
               what: str) -> tuple[RedisRuntime, str, str]:
    """The runtime of the bare libraries' phase ``name`` (announced as ``what``), its job
    tag and its key prefix."""
    progress.note(f"bare: {what}, one rq-scheduler process, {plan.workers} stock rq worker(s)")
    rt = open_runtime(name, 0)
    return rt, f"{plan.tag}-{name}", f"{rt.settings.prefix}bare:"


# -- a burst of due reminders -------------------------------------------------------------


def measure_burst(open_runtime: RuntimeFactory, plan: Plan, progress: Progress) -> BurstFigure:
    """N agents, each with one reminder due in the same second: how late each dispatch
    (followup) and each delivered message came; then N rq jobs due at once."""
    n = plan.burst_agents
    progress.phase("burst", f"{n:,} reminders due in the same second on {n:,} agents")
    tag = f"{plan.tag}-burst"
    rt = open_runtime("burst", plan.workers)
    try:
        names = agent_names(tag, n)
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
    rt, tag, prefix = open_bare(open_runtime, plan, progress, "bburst",
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
        names = agent_names(tag, k)
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
