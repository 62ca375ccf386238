"""The load test's phase for unloaded sessions (issue 37; docs/benchmarks.md): a store of
sessions each with one reminder a day ahead, none loaded, served by ``dsh-schedule host
--all-sessions`` beside the scheduler and the workers, all with
``DSH_SCHEDULE_WAKE_UNLOADED=on``.

It measures how long the host takes, from a cold start, to arm every session's timer
(the store's index written by its first scan), Redis's bytes per session, the Redis
commands per second and the processes' cores while nothing is due (and the host's RSS
then), and a burst: new sessions, never loaded, whose
reminders fall due in the same second (due → message in the session, and the host's
peak RSS).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import msgspec

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.loadtest.process_costs import CpuSampler, cores_between, redis_commands
from dsh_schedule.loadtest.process_runtime import RedisRuntime
from dsh_schedule.loadtest.runtime import LoadtestError
from dsh_schedule.loadtest.sessions import SessionTails, reminders, write_sessions
from dsh_schedule.loadtest.stats import Latency, Progress, latency
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.instant import format_instant

if TYPE_CHECKING:
    from dsh_schedule.loadtest.agents import Plan

DAY_MS: Final = 86_400_000
IDLE_WINDOW_S: Final = 30.0
ARMED_PER_S: Final = 500  # the slowest arming the wait allows for, on top of a minute
BURST_LEAD_S: Final = 20.0  # creates are done before the burst's second, with this lead
CREATE_MS: Final = 15  # the longest one create of the burst is allowed, on top of the lead


class UnloadedFigure(msgspec.Struct, frozen=True, kw_only=True):
    sessions: int
    armed: int
    arm_s: float | None  # host start -> every timer armed, cold (no index yet)
    redis_bytes_per_session: float | None
    idle_commands_per_s: float
    # Cores summed over the host, the workers and the scheduler while nothing is due, and
    # with the redis-server's; the host's RSS then (every timer armed, no session loaded).
    idle_cores: float | None
    idle_cores_with_redis: float | None
    host_idle_rss_bytes: int | None
    burst: int
    burst_created: int
    burst_delivered: int
    burst_session: Latency  # due -> reminder message in the session
    burst_create_s: float
    host_peak_rss_bytes: int | None


def measure_unloaded(open_runtime: Callable[[str, int], RedisRuntime], plan: Plan,
                     progress: Progress) -> UnloadedFigure:
    n, b = plan.unloaded_sessions, plan.unloaded_burst
    progress.phase("unloaded", f"{n:,} unloaded sessions, then {b:,} due in one second")
    rt = open_runtime("unloaded", plan.workers)
    rt.wake_unloaded()
    try:
        names = [f"{plan.tag}-u{i}" for i in range(n)]
        now = wall_clock_ms()
        write_sessions(rt.store, names, reminders(1, agent_index=0, base_ms=now + DAY_MS),
                       created_at_ms=now)
        os.sync()
        timers = Keys(rt.settings.prefix).unloaded(rt.settings.queue)
        rt.start_workers()
        rt.start_mover()
        empty = int(rt.client.info("memory")["used_memory"])  # the processes' own keys in
        started = time.monotonic()
        rt.start_named("host", ["-m", "dsh_schedule", "host", "--all-sessions"])
        armed_all = rt.wait(lambda: int(rt.client.zcard(timers)) >= n, 60 + n / ARMED_PER_S,
                            status=lambda: progress.tick(
                                f"{int(rt.client.zcard(timers)):,}/{n:,} timers armed"),
                            poll_s=0.5)
        arm_s = round(time.monotonic() - started, 1) if armed_all else None
        armed = int(rt.client.zcard(timers))
        used = int(rt.client.info("memory")["used_memory"])
        sampler = CpuSampler(rt.client, rt.pids())
        first = sampler.read()
        before = redis_commands(rt.client)
        rt.sleep(IDLE_WINDOW_S)
        idle = (redis_commands(rt.client) - before - 1) / IDLE_WINDOW_S
        window = cores_between(first, sampler.read())
        idle_rss, _hwm = rt.rss("host")
        created, late, create_s = _burst(rt, plan, progress)
        _rss, hwm = rt.rss("host")
    finally:
        rt.close()
    return UnloadedFigure(
        sessions=n, armed=armed, arm_s=arm_s,
        redis_bytes_per_session=round((used - empty) / n, 1) if n else None,
        idle_commands_per_s=round(idle, 2), host_peak_rss_bytes=hwm,
        idle_cores=_summed(window.cores, with_redis=False),
        idle_cores_with_redis=_summed(window.cores, with_redis=True),
        host_idle_rss_bytes=idle_rss,
        burst=plan.unloaded_burst, burst_created=created, burst_delivered=len(late),
        burst_session=latency(late), burst_create_s=create_s)


def _summed(cores: dict[str, float | None], *, with_redis: bool) -> float | None:
    """The cores of the processes (and the redis-server's), summed; None if one is
    unknown."""
    picked = [c for name, c in cores.items() if with_redis or name != "redis-server"]
    return None if any(c is None for c in picked) else round(sum(c or 0.0 for c in picked), 4)


def _burst(rt: RedisRuntime, plan: Plan, progress: Progress) -> tuple[int, list[int], float]:
    """``unloaded_burst`` new sessions, created with no host, their reminders at one
    second: how many were created, how late each message came (ms), the creates' seconds."""
    b = plan.unloaded_burst
    names = [f"{plan.tag}-b{i}" for i in range(b)]
    coord = Coordination(rt.client, rt.settings)
    due_ms = wall_clock_ms() + int(BURST_LEAD_S * 1000) + b * CREATE_MS
    due_ms -= due_ms % 1000
    tools = ScheduleTools(rt.store, coord, rt.settings, wall_clock_ms)
    at = format_instant(due_ms)
    progress.note(f"creating {b:,} sessions with a reminder due at {at}")
    started = time.monotonic()
    created = 0
    for name in names:
        rt.store.create(SessionHeader(id=name, createdAt=wall_clock_ms(), timeZone="UTC"))
        created += not tools.call(name, "schedule_create", {"prompt": "p", "at": at}).is_error
    create_s = round(time.monotonic() - started, 1)
    tools.close()
    if wall_clock_ms() >= due_ms:
        raise LoadtestError(f"unloaded burst: the creates ran past the due second ({at})")
    tails = SessionTails({name: rt.store.path(name) for name in names})
    rt.sleep(max(0.0, (due_ms - wall_clock_ms()) / 1000))
    rt.wait(lambda: tails.poll() == 0, 120 + b / 20,
            status=lambda: progress.tick(f"{b - tails.pending():,}/{b:,} delivered"),
            poll_s=1.0)
    return created, [ms - due_ms for ms in tails.delivered.values()], create_s
