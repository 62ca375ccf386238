"""Rebuild after a full Redis flush, and Redis memory per live agent.

N agents with M future reminders each are leased and armed (the steady state whose Redis
memory is measured), then the database is flushed, the leases come back (as the hosts'
renewals bring them) and the clock runs from the ``rebuild`` enqueue pass until every
agent's current wake is armed again. On a real Redis this runs in a database of its own
that it verified empty, because flushing is the point.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis
from rq import Queue
from rq.job import Job

from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.agents import Plan, timed_calls
from dsh_schedule.loadtest.figures import MemoryFigure, RebuildFigure
from dsh_schedule.loadtest.runtime import Runtime, queue_idle
from dsh_schedule.loadtest.sessions import DAY_MS, reminders, write_session
from dsh_schedule.loadtest.stats import Progress, Stopwatch, cost_ratio
from dsh_schedule.scheduler.process import rebuild
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import is_embedded
from dsh_schedule.shared.coordination.keys import Keys

EMBEDDED_NOTE = "not measured: the embedded Redis has no MEMORY USAGE"


def measure_rebuild(rt: Runtime, plan: Plan, progress: Progress, *,
                    flush: Callable[[], object], db: int | None
                    ) -> tuple[RebuildFigure, MemoryFigure]:
    """Arm N agents x M reminders, measure their Redis memory, ``flush`` the database and
    time the rebuild until every agent is armed again; then the bare re-arm. ``flush``
    empties the whole database, which must be one this run owns."""
    n, m = plan.rebuild_agents, plan.rebuild_records
    progress.phase("rebuild", f"{n:,} agents x {m} reminders"
                   + ("" if db is None else f" in Redis database {db}"))
    names = [f"{plan.tag}-r{i}" for i in range(n)]
    _write_sessions(rt, names, m, progress)
    coord = Coordination(rt.client, rt.settings)
    used_before = _used_memory(rt.client)
    _grant(rt, coord, names, plan.threads)
    _enqueue, cold = _rebuild_until_armed(rt, coord, n, progress)
    steady = measure_memory(rt.client, coord, names, used_before)
    progress.note(f"armed cold in {cold or 0:.2f} s; {steady.bytes_per_agent} bytes per "
                  "agent; flushing")
    flush()
    restore = _grant(rt, coord, names, plan.threads)
    enqueue, seconds = _rebuild_until_armed(rt, coord, n, progress)
    armed = count_armed(rt.client, coord.keys, names)
    flush()
    bare_seconds, bare_bytes = _bare_rearm(rt, plan, n, progress)
    flush()
    figure = RebuildFigure(
        agents=n, records_per_agent=m, db=db, lease_restore_seconds=round(restore, 3),
        enqueue_seconds=round(enqueue, 3), seconds=None if seconds is None else round(seconds, 3),
        armed=armed, cold_seconds=None if cold is None else round(cold, 3),
        bare_seconds=None if bare_seconds is None else round(bare_seconds, 3),
        ratio=cost_ratio(seconds, bare_seconds),
    )
    memory = msgspec.structs.replace(
        steady, bare_bytes_per_job=bare_bytes,
        ratio=cost_ratio(steady.bytes_per_agent, bare_bytes))
    return figure, memory


def _write_sessions(rt: Runtime, names: Sequence[str], records: int,
                    progress: Progress) -> None:
    base = wall_clock_ms() + DAY_MS
    for i, name in enumerate(names):
        write_session(rt.store, name, reminders(records, agent_index=i, base_ms=base),
                      created_at_ms=base - 2 * DAY_MS, durable=False)
        progress.tick(f"writing sessions {i + 1}/{len(names)}")
    os.sync()


def _grant(rt: Runtime, coord: Coordination, names: Sequence[str], threads: int) -> float:
    """Lease every agent (as each host's renewal does after a flush); seconds taken."""
    now = wall_clock_ms()

    def grant(i: int) -> bool:
        coord.leases.grant(names[i], rt.settings.queue, now_ms=now,
                           ttl_s=rt.settings.lease_ttl_s)
        return True

    _lat, seconds, _ = timed_calls(grant, len(names), threads)
    return seconds


def _rebuild_until_armed(rt: Runtime, coord: Coordination, n: int,
                         progress: Progress) -> tuple[float, float | None]:
    """One ``rebuild`` pass, then wait until n wakes are scheduled and the queue is idle:
    (seconds of the enqueue pass, seconds until armed or None at timeout)."""
    key = coord.keys.scheduled_jobs()
    queue = Queue(rt.settings.queue, connection=rt.client)
    watch = Stopwatch()
    rebuild(coord, rt.settings, now_ms=wall_clock_ms())
    enqueue = watch.seconds()

    def armed() -> bool:
        return int(rt.client.zcard(key)) >= n and queue_idle(rt.client, queue)

    def status() -> None:
        progress.tick(f"{int(rt.client.zcard(key)):,}/{n:,} wakes armed")

    done = rt.run_until(armed, 600.0, status=status)
    return enqueue, watch.seconds() if done else None


def count_armed(client: redis.Redis, keys: Keys, names: Sequence[str]) -> int:
    """How many agents have a current wake that is in the schedule."""
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(keys.current_wake(name))
        wakes = [w for w in pipe.execute() if w is not None]
        for wake in wakes:
            pipe.zscore(keys.scheduled_jobs(), wake)
        return sum(1 for score in pipe.execute() if score is not None)


# -- memory -------------------------------------------------------------------------------


def measure_memory(client: redis.Redis, coord: Coordination, names: Sequence[str],
                   used_before: int | None) -> MemoryFigure:
    """``MEMORY USAGE`` of every key of each agent (its rq wake job included) plus its share
    of the keys all agents share, averaged over the agents."""
    if is_embedded(client):
        return MemoryFigure(agents=len(names), bytes_per_agent=None, by_key={},
                            used_memory_delta_per_agent=None, bare_bytes_per_job=None,
                            ratio=None, note=EMBEDDED_NOTE)
    keys = coord.keys
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(keys.current_wake(name))
        wakes: list[Any] = pipe.execute()
    kinds: dict[str, list[str]] = {
        "followup stream and group": [keys.followups(n) for n in names],
        "current wake pointer": [keys.current_wake(n) for n in names],
        "wake id counter": [keys.wake_counter(n) for n in names],
        "lock, phase, idle waiter": [k for n in names
                                     for k in (keys.lock(n), keys.phase(n), keys.idle_waiter(n))],
        "rq wake job": [Job.key_for(w.decode()) for w in wakes if w is not None],
        "share of agent-host hash": [keys.agent_host()],
        "share of served sets": [keys.served(h) for h in coord.leases.live_hosts(now_ms=0)],
        "share of lease-queue hash": [keys.lease_queue()],
        "share of scheduled-wakes zset": [keys.scheduled_jobs()],
    }
    by_key = {kind: round(_usage(client, ks) / len(names), 1) for kind, ks in kinds.items()}
    used_after = _used_memory(client)
    delta = None if used_before is None or used_after is None else used_after - used_before
    return MemoryFigure(
        agents=len(names), bytes_per_agent=round(sum(by_key.values()), 1), by_key=by_key,
        used_memory_delta_per_agent=None if delta is None else round(delta / len(names), 1),
        bare_bytes_per_job=None, ratio=None, note=None,
    )


def _usage(client: redis.Redis, keys: Sequence[str]) -> int:
    total = 0
    for start in range(0, len(keys), 1000):
        with client.pipeline(transaction=False) as pipe:
            for key in keys[start:start + 1000]:
                pipe.memory_usage(key, samples=0)
            total += sum(int(n) for n in pipe.execute() if n is not None)
    return total


def _used_memory(client: redis.Redis) -> int | None:
    if is_embedded(client):
        return None
    info: Any = client.info("memory")
    return int(info["used_memory"])


# -- the bare libraries -------------------------------------------------------------------


def _bare_rearm(rt: Runtime, plan: Plan, n: int,
                progress: Progress) -> tuple[float | None, float | None]:
    """n jobs whose only work is one ``enqueue_at``: seconds until all n are scheduled, and
    the bytes of one bare scheduled job (its hash and its share of the schedule)."""
    progress.note(f"bare: {n:,} jobs that each schedule one job")
    prefix = f"{rt.settings.prefix}bare:"
    key = Keys(prefix).scheduled_jobs()
    queue = Queue(rt.settings.queue, connection=rt.client)
    target = wall_clock_ms() + DAY_MS
    jobs = [Queue.prepare_data(bare.REARM, args=(prefix, rt.settings.queue,
                                                 f"{plan.tag}-br-{i}", target + i * 1000),
                               job_id=f"{plan.tag}-bq-{i}", result_ttl=0,
                               timeout=bare.JOB_TIMEOUT_S) for i in range(n)]
    watch = Stopwatch()
    for start in range(0, n, 500):
        queue.enqueue_many(jobs[start:start + 500])
    done = rt.run_until(lambda: int(rt.client.zcard(key)) >= n and queue_idle(rt.client, queue),
                        600.0)
    seconds = watch.seconds() if done else None
    if is_embedded(rt.client):
        return seconds, None
    jobs_keys = [Job.key_for(f"{plan.tag}-br-{i}") for i in range(n)]
    return seconds, round((_usage(rt.client, jobs_keys) + _usage(rt.client, [key])) / n, 1)
