"""The operator's view of a deployment (docs/architecture.md#operations): what
``dsh-schedule status`` shows, what ``dsh-schedule health`` and ``SchedulePlugin.health()``
decide, and the two keys the scheduler leaves for them.

- **The scheduler heartbeat** (``Keys.scheduler_heartbeat``): every scheduler loop writes
  it after a pass, at most every ``HEARTBEAT_EVERY_S``, with a TTL of ``HEARTBEAT_TTL_S``.
  Its age is that TTL minus the PTTL Redis has left, so reading it needs no clock but
  Redis's. It is fresh while its age is at most ``HEARTBEAT_FRESH_S`` or three times the
  gap the scheduler said to expect between refreshes, whichever is more.
- **The last reconcile** (``Keys.scheduler_reconcile``): a summary of the last rebuild or
  reconcile pass, kept for ``RECONCILE_TTL_S``.

Healthy means: the scheduler heartbeat is fresh, and every queue that has live agents has
an rq worker registered on it (rq's worker registry, ``rq.Worker.all(queue=…)``; our worker
leaves it within 90 s of being killed, a stock rq worker within rq's 480 s).

Reads Redis and rq only; imports none of the worker, scheduler or host modules (the
scheduler and the host import this one).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import redis
from rq import Queue, Worker

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.clock import skew_note
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, format_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.terminal import terminal_text

HEARTBEAT_TTL_S: Final = 60
HEARTBEAT_EVERY_S: Final = 1.0
HEARTBEAT_FRESH_S: Final = 15.0
RECONCILE_TTL_S: Final = 86_400
NEXT_WAKES: Final = 5
CHECK_BATCH: Final = 1_000
_WAKE_PREFIX: Final = "wake_"


class _Camel(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class SchedulerHeartbeat(_Camel, frozen=True, kw_only=True, rename="camel"):
    """The value of the heartbeat key."""

    at: int  # the scheduler's wall clock when it wrote the heartbeat, epoch ms
    every: float  # the longest gap it expects between two refreshes, seconds
    ttl: int  # the TTL it wrote the key with, seconds
    host: str
    pid: int


class ReconcileSummary(_Camel, frozen=True, kw_only=True, rename="camel"):
    """The value of the last-reconcile key: one rebuild or reconcile pass."""

    at: int  # epoch ms, the scheduler's wall clock
    kind: str  # "rebuild" or "reconcile"
    live: int
    woken: int
    retired: int
    swept: int = 0
    hosts: int | None = None  # the live hosts a reconcile pass read


class Health(_Camel, frozen=True, kw_only=True, rename="camel"):
    """Whether reminders can fire, and one line saying why (or why not)."""

    ok: bool
    reason: str


def write_heartbeat(client: redis.Redis, keys: Keys, *, every_s: float, now_ms: int) -> None:
    """Refresh the scheduler heartbeat (one SET with a TTL)."""
    beat = SchedulerHeartbeat(at=now_ms, every=every_s, ttl=HEARTBEAT_TTL_S,
                              host=socket.gethostname(), pid=os.getpid())
    client.set(keys.scheduler_heartbeat(), msgspec.json.encode(beat), ex=HEARTBEAT_TTL_S)


def write_reconcile(client: redis.Redis, keys: Keys, summary: ReconcileSummary) -> None:
    """Keep the summary of the pass that just ran."""
    client.set(keys.scheduler_reconcile(), msgspec.json.encode(summary), ex=RECONCILE_TTL_S)


# -- reading ----------------------------------------------------------------------------


class HeartbeatStatus(_Camel, frozen=True, kw_only=True, rename="camel"):
    age_seconds: float
    fresh: bool
    fresh_within_seconds: float
    at: str
    host: str
    pid: int


class WorkerStatus(_Camel, frozen=True, kw_only=True, rename="camel"):
    name: str
    hostname: str | None
    pid: int | None
    state: str
    queues: list[str]
    last_heartbeat: str | None


class QueueStatus(_Camel, frozen=True, kw_only=True, rename="camel"):
    name: str
    live_agents: int
    followups_pending: int
    queued_jobs: int
    workers: list[WorkerStatus]


class WakeStatus(_Camel, frozen=True, kw_only=True, rename="camel"):
    id: str
    agent: str | None
    due: str
    due_in_seconds: float


class LastReconcile(_Camel, frozen=True, kw_only=True, rename="camel"):
    at: str
    age_seconds: float
    kind: str
    live: int
    woken: int
    retired: int
    swept: int
    hosts: int | None


class Status(_Camel, frozen=True, kw_only=True, rename="camel"):
    prefix: str
    now: str
    live_agents: int
    ended_agents: int  # their host's lease expired, not yet retired by a reconcile pass
    scheduled_wakes: int
    next_wakes: list[WakeStatus]
    overdue_wakes: int
    oldest_overdue_seconds: float | None
    followups_pending: int
    queues: list[QueueStatus]
    scheduler: HeartbeatStatus | None
    last_reconcile: LastReconcile | None
    health: Health


def read_heartbeat(client: redis.Redis, keys: Keys) -> HeartbeatStatus | None:
    """The scheduler heartbeat and its age by Redis's clock (None: none left)."""
    with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.scheduler_heartbeat())
        pipe.pttl(keys.scheduler_heartbeat())
        raw, pttl = pipe.execute()
    if raw is None or pttl is None or pttl < 0:
        return None
    try:
        beat = msgspec.json.decode(raw, type=SchedulerHeartbeat)
    except msgspec.DecodeError:
        return None
    age_s = max(beat.ttl * 1000 - int(pttl), 0) / 1000
    within = max(HEARTBEAT_FRESH_S, 3 * beat.every)
    return HeartbeatStatus(
        age_seconds=age_s, fresh=age_s <= within, fresh_within_seconds=within,
        at=_instant(beat.at), host=beat.host, pid=beat.pid,
    )


def read_reconcile(client: redis.Redis, keys: Keys, *, now_ms: int) -> LastReconcile | None:
    raw = client.get(keys.scheduler_reconcile())
    if raw is None:
        return None
    try:
        summary = msgspec.json.decode(raw, type=ReconcileSummary)
    except msgspec.DecodeError:
        return None
    return LastReconcile(
        at=_instant(summary.at), age_seconds=max(now_ms - summary.at, 0) / 1000,
        kind=summary.kind, live=summary.live, woken=summary.woken, retired=summary.retired,
        swept=summary.swept, hosts=summary.hosts,
    )


def live_by_queue(coord: Coordination, *, now_ms: int) -> dict[str, list[str]]:
    """The live agents of each queue their lease names (the served sets of the live
    hosts, then the queues of their members)."""
    live = coord.leases.live_agents(now_ms=now_ms)
    by_queue: dict[str, list[str]] = {}
    for start in range(0, len(live), CHECK_BATCH):
        batch = live[start : start + CHECK_BATCH]
        for agent, queue in zip(batch, coord.leases.queues_of(batch), strict=True):
            by_queue.setdefault(queue, []).append(agent)
    return by_queue


def workers_on(client: redis.Redis, queue: str) -> list[WorkerStatus]:
    """The rq workers registered on ``queue`` whose worker key is still alive."""
    found: list[WorkerStatus] = []
    for worker in Worker.all(queue=Queue(queue, connection=client)):
        beat = worker.last_heartbeat
        found.append(WorkerStatus(
            name=str(worker.name),
            hostname=_opt_text(worker.hostname),
            pid=worker.pid,
            state=_opt_text(getattr(worker.get_state(), "value", worker.get_state()))
            or "unknown",
            queues=[str(name) for name in worker.queue_names()],
            last_heartbeat=None if beat is None else beat.isoformat(),
        ))
    return found


def check_health(
    coord: Coordination,
    *,
    now_ms: int,
    queues: Sequence[str] | None = None,
    also: Sequence[str] = (),
    heartbeat: HeartbeatStatus | None = None,
    by_queue: dict[str, list[str]] | None = None,
) -> Health:
    """Healthy: the scheduler heartbeat is fresh and each queue checked has a worker. The
    queues checked are ``queues`` (a host asks about its own) or, by default, every queue
    that has live agents, plus ``also`` (queues named by the caller, live agents or not).
    RedisError propagates."""
    client = coord.client
    if heartbeat is None:
        heartbeat = read_heartbeat(client, coord.keys)
    problems: list[str] = []
    if heartbeat is None:
        problems.append(
            f"no scheduler heartbeat: no scheduler has run a pass in the last "
            f"{HEARTBEAT_TTL_S} s"
        )
    elif not heartbeat.fresh:
        problems.append(
            f"the scheduler heartbeat is {heartbeat.age_seconds:.1f} s old "
            f"(fresh: at most {heartbeat.fresh_within_seconds:g} s)"
        )
    wanted: dict[str, int | None] = {}
    if queues is None:
        if by_queue is None:
            by_queue = live_by_queue(coord, now_ms=now_ms)
        wanted.update((queue, len(agents)) for queue, agents in by_queue.items())
    else:
        wanted.update(dict.fromkeys(queues))
    for queue in also:
        wanted.setdefault(queue, None)
    for queue in sorted(wanted):
        if not Worker.all(queue=Queue(queue, connection=client)):
            live = wanted[queue]
            problems.append(
                f"queue {queue!r} has no worker" if live is None
                else f"queue {queue!r} has {live} live agent(s) and no worker"
            )
    clocks = skew_note(client, coord.keys, now_ms=now_ms)  # said, never unhealthy
    if problems or heartbeat is None:
        return Health(ok=False, reason="; ".join(problems) + clocks)
    if not wanted:
        workers = "no queue has live agents"
    else:
        names = ", ".join(f"{queue!r}" for queue in sorted(wanted))
        workers = f"{names} {'has' if len(wanted) == 1 else 'have'} a worker"
    return Health(
        ok=True,
        reason=f"the scheduler heartbeat is {heartbeat.age_seconds:.1f} s old; {workers}"
        + clocks,
    )


def read_status(
    client: redis.Redis, settings: Settings, *, now_ms: int, next_count: int = NEXT_WAKES
) -> Status:
    """Everything ``dsh-schedule status`` shows. Reads each live agent's followup stream
    length (pipelined, ``CHECK_BATCH`` per round trip): an operator's command, not a
    scrape."""
    coord = Coordination(client, settings)
    keys = coord.keys
    by_queue = live_by_queue(coord, now_ms=now_ms)
    pending: dict[str, int] = {}
    for queue, agents in by_queue.items():
        total = 0
        for start in range(0, len(agents), CHECK_BATCH):
            with client.pipeline(transaction=False) as pipe:
                for agent in agents[start : start + CHECK_BATCH]:
                    pipe.xlen(keys.followups(agent))
                total += sum(int(n) for n in pipe.execute())
        pending[queue] = total
    schedule = keys.scheduled_jobs()
    now_score = now_ms / 1000
    with client.pipeline(transaction=False) as pipe:
        pipe.zcard(schedule)
        pipe.zrange(schedule, 0, max(next_count, 1) - 1, withscores=True)
        pipe.zcount(schedule, "-inf", repr(now_score))
        scheduled, first, overdue = pipe.execute()
    ended = coord.leases.count_served(coord.leases.expired_hosts(now_ms=now_ms))
    next_wakes = [_wake(member, score, now_ms) for member, score in first][:next_count]
    oldest_overdue = (
        max(now_ms - round(float(first[0][1]) * 1000), 0) / 1000
        if overdue and first else None
    )
    queue_names = sorted({*by_queue, settings.queue})
    queues = [
        QueueStatus(
            name=name,
            live_agents=len(by_queue.get(name, [])),
            followups_pending=pending.get(name, 0),
            queued_jobs=int(Queue(name, connection=client).count),
            workers=workers_on(client, name),
        )
        for name in queue_names
    ]
    heartbeat = read_heartbeat(client, keys)
    health = check_health(coord, now_ms=now_ms, heartbeat=heartbeat, by_queue=by_queue)
    return Status(
        prefix=settings.prefix,
        now=_instant(now_ms),
        live_agents=sum(len(agents) for agents in by_queue.values()),
        ended_agents=int(ended),
        scheduled_wakes=int(scheduled),
        next_wakes=next_wakes,
        overdue_wakes=int(overdue),
        oldest_overdue_seconds=oldest_overdue,
        followups_pending=sum(pending.values()),
        queues=queues,
        scheduler=heartbeat,
        last_reconcile=read_reconcile(client, keys, now_ms=now_ms),
        health=health,
    )


def render_status(status: Status) -> str:
    """``status`` for a person: a few lines. Every name that came from Redis is shown
    through ``terminal_text``: an id holding an escape sequence or a newline can neither
    act on the terminal nor fake a line."""
    lines: list[str] = []
    beat = status.scheduler
    if beat is None:
        lines.append("scheduler: no heartbeat")
    else:
        lines.append(
            f"scheduler: heartbeat {beat.age_seconds:.1f} s old "
            f"({'fresh' if beat.fresh else 'STALE'}; host {terminal_text(beat.host)}, "
            f"pid {beat.pid})"
        )
    last = status.last_reconcile
    if last is None:
        lines.append("last reconcile: none recorded")
    else:
        lines.append(
            f"last {terminal_text(last.kind)}: {last.at} ({last.age_seconds:.1f} s ago): "
            + f"{last.live} live, "
            + ("" if last.hosts is None else f"{last.hosts} host(s), ")
            + f"{last.woken} woken, {last.retired} retired"
        )
    ended = f" ({status.ended_agents} ended, not yet retired)" if status.ended_agents else ""
    lines.append(f"live agents: {status.live_agents}{ended}")
    overdue = (f"{status.overdue_wakes} overdue, the oldest by "
               f"{status.oldest_overdue_seconds:.1f} s"
               if status.oldest_overdue_seconds is not None else "none overdue")
    lines.append(f"scheduled wakes: {status.scheduled_wakes}; {overdue}")
    for wake in status.next_wakes:
        named = "agent " + wake.agent if wake.agent is not None else wake.id
        lines.append(f"  next: {wake.due} (in {wake.due_in_seconds:.1f} s) "
                     f"{terminal_text(named)}")
    lines.append(f"followups pending: {status.followups_pending}")
    for queue in status.queues:
        workers = ", ".join(f"{terminal_text(w.name)} ({terminal_text(w.state)})"
                            for w in queue.workers) or "none"
        lines.append(
            f"queue {terminal_text(queue.name)}: {queue.live_agents} live agent(s), "
            f"{queue.followups_pending} followup(s) pending, {queue.queued_jobs} queued "
            f"job(s); workers: {workers}"
        )
    verdict = "ok" if status.health.ok else "UNHEALTHY"
    lines.append(f"health: {verdict}: {terminal_text(status.health.reason)}")
    return "\n".join(lines)


def _wake(member: bytes | str, score: float, now_ms: int) -> WakeStatus:
    wake_id = _text(member)
    due_ms = round(float(score) * 1000)
    return WakeStatus(id=wake_id, agent=_agent_of(wake_id), due=_instant(due_ms),
                      due_in_seconds=(due_ms - now_ms) / 1000)


def _agent_of(wake_id: str) -> str | None:
    """The agent a wake id names: ``wake_<hex of the agent id>_<second>[_<n>]``."""
    if not wake_id.startswith(_WAKE_PREFIX):
        return None
    hexed = wake_id[len(_WAKE_PREFIX):].split("_", 1)[0]
    try:
        return bytes.fromhex(hexed).decode()
    except ValueError:
        return None


def _instant(ms: int) -> str:
    return format_instant(min(max(ms, MIN_MS), MAX_MS))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt_text(value: Any) -> str | None:
    if value is None:
        return None
    return _text(value) if isinstance(value, bytes | str) else str(value)
