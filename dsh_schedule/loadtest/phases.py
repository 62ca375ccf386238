"""The measured phases: creates, the long session, due transactions, delivery lateness.

Each phase opens its own agents, spread over ``--hosts`` reference hosts in this process,
measures, runs the bare-library counterpart on the same runtime, and disposes of its agents.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
import redis
from rq import Queue

from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.plugin import ToolHandler
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.figures import CreateFigure, DueFigure, LatenessFigure
from dsh_schedule.loadtest.runtime import Runtime, queue_idle
from dsh_schedule.loadtest.sessions import write_session
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
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import (
    READ_COUNT,
    FollowupEntry,
    Followups,
    Pair,
    StreamRead,
)
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.events import USER_MESSAGE
from dsh_schedule.shared.core.instant import parse_instant, to_datetime
from dsh_schedule.shared.settings import MAX_ACTIVE_CEILING, Settings

FAR_S: Final = 30 * 86_400
OpResult = tuple[list[float], float, int]


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of one load-test run (bounded by ``loadtest.add_arguments``)."""

    tag: str
    hosts: int
    workers: int
    threads: int
    create_agents: int
    creates: int
    session_sizes: tuple[int, ...]
    session_calls: int
    due_agents: int
    late_agents: int
    late_reminders: int
    window_s: int
    lead_s: int
    rebuild_agents: int
    rebuild_records: int
    rebuild_db: int
    max_seconds: float
    idle_agents: int
    idle_window_s: int
    idle_warmup_s: int
    burst_agents: int
    memory_sessions: int
    memory_events: int


class RecordingFollowups(Followups):
    """The host's followup reader, noting when each reminder's entry was written: the
    millisecond part of its stream id, which Redis assigns from its own clock."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        super().__init__(client, keys)
        self.written_ms: dict[tuple[str, Pair], int] = {}
        self._lock = threading.Lock()

    def read_streams(self, agents: Sequence[str], consumer: str, *,
                  count: int = READ_COUNT) -> dict[str, StreamRead]:
        found = super().read_streams(agents, consumer, count=count)
        for agent, read in found.items():
            self._note(agent, read.entries)
        return found

    def claim_stale(self, agent: str, consumer: str, *, min_idle_ms: int) -> list[FollowupEntry]:
        return self._note(agent, super().claim_stale(agent, consumer, min_idle_ms=min_idle_ms))

    def _note(self, agent: str, entries: list[FollowupEntry]) -> list[FollowupEntry]:
        with self._lock:
            for entry in entries:
                ms = int(entry.entry_id.split("-", 1)[0])
                for pair in entry.pairs:
                    self.written_ms.setdefault((agent, pair), ms)
        return entries


class Hosts:
    """Reference hosts in this process, sharing one store and one Redis coordination, with
    the agents spread over them; each agent is a root agent of exactly one host."""

    def __init__(self, hosts: Sequence[ReferenceHost], coordination: Coordination) -> None:
        self.hosts = tuple(hosts)
        self.coordination = coordination
        self._host_of: dict[str, ReferenceHost] = {}

    def open(self, names: Sequence[str]) -> None:
        for i, name in enumerate(names):
            host = self.hosts[i % len(self.hosts)]
            host.open_root(name)
            self._host_of[name] = host

    def tool(self, name: str, tool: str = "schedule_create") -> ToolHandler:
        return self._host_of[name].agents[name].tools[tool][1]

    def renew_leases(self) -> None:
        for host in self.hosts:
            host.plugin.renew_leases()

    def close(self) -> None:
        for host in self.hosts:
            host.close()


def open_agents(rt: Runtime, plan: Plan, names: Sequence[str], *, recording: bool = False,
                on_delivery: Callable[[str, Delivery], None] | None = None,
                settings: Settings | None = None) -> Hosts:
    """New sessions, opened as root agents of ``plan.hosts`` new hosts (each install leases
    the agent and enqueues its first wake); waits until those wakes ran."""
    now = wall_clock_ms()
    for name in names:
        write_session(rt.store, name, [], created_at_ms=now, durable=False)
    os.sync()
    settings = rt.settings if settings is None else settings
    coordination = Coordination(rt.client, settings)
    if recording:
        coordination.followups = RecordingFollowups(rt.client, coordination.keys)
    hosts = Hosts([ReferenceHost(rt.store, coordination, settings, on_delivery=on_delivery)
                   for _ in range(plan.hosts)], coordination)
    hosts.open(names)
    rt.run_until(lambda: _idle(rt, settings.queue), 120.0)
    return hosts


def timed_calls(op: Callable[[int], bool], count: int, threads: int,
                progress: Progress | None = None) -> OpResult:
    """Run ``op(0..count-1)`` on ``threads`` threads (thread t takes i = t mod threads);
    returns the latencies in ms, the wall seconds and the number of failed calls."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    failures = [0] * threads

    def work(t: int) -> None:
        for i in range(t, count, threads):
            start = time.perf_counter()
            ok = op(i)
            lat[t].append((time.perf_counter() - start) * 1000)
            failures[t] += not ok
            if t == 0 and progress is not None:
                progress.tick(f"{i + 1}/{count}")

    watch = Stopwatch()
    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return [x for part in lat for x in part], watch.seconds(), sum(failures)


def create_args(i: int, seconds: int) -> dict[str, Any]:
    return {"prompt": f"load reminder {i}", "after_seconds": seconds}


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
        rt.run_until(lambda: _idle(rt, queue), 300.0,
                     status=lambda: progress.tick("running the wakes"))
        seconds = (wall_clock_ms() - start_ms) / 1000
        dispatched = sum(_xlens(rt.client, hosts.coordination.keys, names))
        hosts.close()
        bare_seconds = bare_noops(rt, plan, queue, len(names), progress)
    return _DueRun(workers=workers, created=len(names) - errors, dispatched=dispatched,
                   move_seconds=round(move_seconds, 3), seconds=round(seconds, 3),
                   bare_seconds=round(bare_seconds, 3))


def _idle(rt: Runtime, queue: str) -> bool:
    return queue_idle(rt.client, Queue(queue, connection=rt.client))


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
    rt.run_until(lambda: _idle(rt, queue_name), 300.0)
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
