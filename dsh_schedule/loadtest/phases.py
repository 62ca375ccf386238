"""The measured in-process phases: due transactions and delivery lateness (the creates
are ``creates``, the long session ``long_session``).

Each phase opens its own agents, spread over ``--hosts`` reference hosts in this process,
measures, runs the bare-library counterpart on the same runtime, and disposes of its agents.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import redis
from rq import Queue

from dsh_schedule.host.gate import Delivery
from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.agents import (
    Hosts,
    Plan,
    RecordingFollowups,
    create_args,
    open_agents,
    queue_is_idle,
    timed_calls,
)
from dsh_schedule.loadtest.figures import DueFigure, LatenessFigure
from dsh_schedule.loadtest.runtime import Runtime
from dsh_schedule.loadtest.stats import (
    Latency,
    Progress,
    Stopwatch,
    cost_ratio,
    latency,
    per_second,
    rate_ratio,
)
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.followups import (
    Pair,
)
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.events import USER_MESSAGE
from dsh_schedule.shared.core.instant import parse_instant, to_datetime

# -- due transactions -------------------------------------------------------------------


class _DueRun(msgspec.Struct, frozen=True, kw_only=True):
    workers: int
    created: int
    dispatched: int
    move_seconds: float
    seconds: float
    bare_seconds: float


def measure_due(rt: Runtime, plan: Plan, progress: Progress) -> DueFigure:
    """Due transactions on one worker of their own, then on ``rt.workers`` of them."""
    runs = [_due_run(rt, plan, progress, workers) for workers in sorted({1, rt.workers})]
    one, many = runs[0], runs[-1]
    per_worker = per_second(one.dispatched, one.seconds)
    bare_per_worker = per_second(plan.due_agents, one.bare_seconds)
    return DueFigure(
        workers=many.workers, count=one.created, dispatched=one.dispatched,
        move_seconds=one.move_seconds, seconds=one.seconds, per_worker_per_s=per_worker,
        bare_per_worker_per_s=bare_per_worker, ratio=rate_ratio(per_worker, bare_per_worker),
        all_workers_per_s=per_second(many.dispatched, many.seconds),
        bare_all_workers_per_s=per_second(plan.due_agents, many.bare_seconds),
    )


def _due_run(rt: Runtime, plan: Plan, progress: Progress, workers: int) -> _DueRun:
    progress.phase("due", f"{plan.due_agents} agents with one overdue reminder each, "
                   f"{workers} worker(s)")
    with rt.pool(workers) as queue:
        settings = msgspec.structs.replace(rt.settings, queue=queue)
        names = [f"{plan.tag}-d{workers}-{i}" for i in range(plan.due_agents)]
        hosts = open_agents(rt, plan, names, settings=settings)
        handlers = [hosts.tool(n) for n in names]
        _, _, errors = timed_calls(lambda i: not handlers[i](create_args(i, 1)).is_error,
                                   len(names), plan.threads, progress)
        time.sleep(2.1)  # every wake's whole-second score is now in the past
        hosts.renew_leases()
        start_ms = wall_clock_ms()
        watch = Stopwatch()
        rt.move_due()
        move_seconds = watch.seconds()
        rt.run_until(lambda: queue_is_idle(rt, queue), 300.0,
                     status=lambda: progress.tick("running the wakes"))
        seconds = (wall_clock_ms() - start_ms) / 1000
        dispatched = sum(_xlens(rt.client, hosts.coordination.keys, names))
        hosts.close()
        bare_seconds = bare_noops(rt, plan, queue, len(names), progress)
    return _DueRun(workers=workers, created=len(names) - errors, dispatched=dispatched,
                   move_seconds=round(move_seconds, 3), seconds=round(seconds, 3),
                   bare_seconds=round(bare_seconds, 3))



def _xlens(client: redis.Redis, keys: Keys, names: Sequence[str]) -> list[int]:
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.xlen(keys.followups(name))
        return [int(n) for n in pipe.execute()]


def bare_noops(rt: Runtime, plan: Plan, queue_name: str, count: int,
               progress: Progress) -> float:
    """Seconds for the workers to run ``count`` no-op jobs, from the first enqueue."""
    progress.note(f"bare: {count} no-op jobs")
    queue = Queue(queue_name, connection=rt.client)
    jobs = [Queue.prepare_data(bare.NOOP, job_id=f"{plan.tag}-bn-{queue_name}-{i}",
                               result_ttl=0, timeout=bare.JOB_TIMEOUT_S) for i in range(count)]
    watch = Stopwatch()
    for start in range(0, count, 500):
        queue.enqueue_many(jobs[start:start + 500])
    rt.run_until(lambda: queue_is_idle(rt, queue_name), 300.0)
    return watch.seconds()


# -- delivery lateness ------------------------------------------------------------------


class _Deliveries:
    """The host's delivery callback: when each reminder's message entered the session."""

    def __init__(self) -> None:
        self.session_ms: dict[tuple[str, Pair], int] = {}
        self._lock = threading.Lock()

    def __call__(self, agent: str, delivery: Delivery) -> None:
        times = [e.time for e in delivery.events if e.type == USER_MESSAGE]
        with self._lock:
            for pair in delivery.pairs:
                self.session_ms.setdefault((agent, pair), times[0])


def measure_lateness(rt: Runtime, plan: Plan, progress: Progress) -> LatenessFigure:
    progress.phase("lateness", f"{plan.late_reminders} reminders on {plan.late_agents} agents "
                   f"due over {plan.window_s} s")
    names = [f"{plan.tag}-l{i}" for i in range(plan.late_agents)]
    deliveries = _Deliveries()
    hosts = open_agents(rt, plan, names, recording=True, on_delivery=deliveries)
    written = hosts.coordination.followups
    assert isinstance(written, RecordingFollowups)
    rt.start_mover()  # up before the first create
    due = _create_spread(hosts, names, plan)
    last_due_s = (max(due.values(), default=wall_clock_ms()) - wall_clock_ms()) / 1000
    rt.run_until(
        lambda: len(deliveries.session_ms) >= len(due), last_due_s + 60.0, hosts=hosts.hosts,
        status=lambda: progress.tick(f"{len(deliveries.session_ms)}/{len(due)} delivered"),
    )
    followup = [written.written_ms[k] - d for k, d in due.items() if k in written.written_ms]
    session = [deliveries.session_ms[k] - d for k, d in due.items() if k in deliveries.session_ms]
    hosts.close()
    bare_lat = bare_lateness(rt, plan, progress)
    rt.stop_mover()
    mine = latency(followup)
    return LatenessFigure(
        hosts=plan.hosts, reminders=len(due), delivered=len(session),
        missing=len(due) - len(session),
        window_s=plan.window_s, mover_interval_s=rt.settings.mover_interval_s,
        followup=mine, session=latency(session), bare=bare_lat,
        ratio_p99=cost_ratio(mine.p99_ms, bare_lat.p99_ms),
    )


def _create_spread(hosts: Hosts, names: Sequence[str],
                   plan: Plan) -> dict[tuple[str, Pair], int]:
    """Create the reminders, due from ``lead_s`` over ``window_s``; their due times."""
    due: dict[tuple[str, Pair], int] = {}
    for i in range(plan.late_reminders):
        name = names[i % len(names)]
        seconds = plan.lead_s + (i * plan.window_s) // plan.late_reminders
        result = hosts.tool(name)(create_args(i, seconds))
        if result.is_error:
            continue
        at = result.value["scheduledAt"]
        due[(name, Pair(scheduleId=result.value["id"], occurrenceAt=at))] = parse_instant(at)
    return due


def bare_lateness(rt: Runtime, plan: Plan, progress: Progress) -> Latency:
    """Jobs scheduled at whole seconds over the same window, moved by the same mover and
    run by the same workers; how late each ran."""
    progress.note(f"bare: {plan.late_reminders} jobs scheduled over {plan.window_s} s")
    stream = f"{rt.settings.prefix}bare-marks"
    scheduler = bare.scheduler_for(rt.settings.prefix, rt.client)
    first_s = wall_clock_ms() // 1000 + plan.lead_s
    for i in range(plan.late_reminders):
        due_ms = (first_s + (i * plan.window_s) // plan.late_reminders) * 1000
        scheduler.enqueue_at(
            to_datetime(due_ms), bare.MARK, stream, due_ms, job_id=f"{plan.tag}-bm-{i}",
            job_result_ttl=0, job_ttl=None, timeout=bare.JOB_TIMEOUT_S,
            queue_name=rt.settings.queue)
    rt.run_until(lambda: int(rt.client.xlen(stream)) >= plan.late_reminders,
                 plan.lead_s + plan.window_s + 60.0)
    marks: Any = rt.client.xrange(stream)
    return latency([int(i.split(b"-")[0]) - int(f[b"due"]) for i, f in marks])
