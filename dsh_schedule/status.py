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

Healthy means: the scheduler heartbeat is fresh, every queue that has live agents has a
beating rq worker registered on it (rq's worker registry, ``rq.Worker.all(queue=…)``, less
the workers of ours whose beat is overdue, ``Keys.worker_beats``: a killed worker of ours
counts no more within its liveness window, 15 s by default; a stock rq worker, which does
not beat there, counts while rq's registry holds it), and no wake has waited in such a
queue longer than ``Settings.wake_wait_alarm_s``.

Every read here is O(queues + hosts + workers), whatever the number of agents: live agents
per queue from the hosts' served sets (``live_per_queue``), pending followups from the
counter the followup scripts keep (``Followups.pending_total``).

Reads Redis and rq only; imports none of the worker, scheduler or host modules (the
scheduler and the host import this one). What it reports and how it reads for a person:
``status_report``; the health check: ``status_health``.
"""

from __future__ import annotations

import os
import socket
from typing import Final

import msgspec
import redis

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.settings import Settings
from dsh_schedule.status_health import (
    HEARTBEAT_FRESH_S,
    HEARTBEAT_TTL_S,
    QueueFacts,
    check_health,
    instant_of,
    live_per_queue,
    read_heartbeat,
    read_queue,
    text_of,
)
from dsh_schedule.status_report import (
    Health,
    HeartbeatStatus,
    LastReconcile,
    QueueStatus,
    ReconcileSummary,
    SchedulerHeartbeat,
    Status,
    UnloadedStatus,
    WakeStatus,
    WorkerStatus,
    render_status,
)

__all__ = [
    "HEARTBEAT_EVERY_S", "HEARTBEAT_FRESH_S", "HEARTBEAT_TTL_S", "NEXT_WAKES", "RECONCILE_TTL_S",
    "Health", "HeartbeatStatus", "LastReconcile", "QueueFacts", "QueueStatus",
    "ReconcileSummary", "SchedulerHeartbeat", "Status", "UnloadedStatus", "WakeStatus",
    "WorkerStatus", "check_health", "live_per_queue", "read_heartbeat", "read_queue",
    "read_reconcile", "read_status", "render_status", "write_heartbeat", "write_reconcile",
]

HEARTBEAT_EVERY_S: Final = 1.0
RECONCILE_TTL_S: Final = 86_400
NEXT_WAKES: Final = 5
_WAKE_PREFIX: Final = "wake_"


def write_heartbeat(client: redis.Redis, keys: Keys, *, every_s: float, now_ms: int) -> None:
    """Refresh the scheduler heartbeat (one SET with a TTL)."""
    beat = SchedulerHeartbeat(at=now_ms, every=every_s, ttl=HEARTBEAT_TTL_S,
                              host=socket.gethostname(), pid=os.getpid())
    client.set(keys.scheduler_heartbeat(), msgspec.json.encode(beat), ex=HEARTBEAT_TTL_S)


def write_reconcile(client: redis.Redis, keys: Keys, summary: ReconcileSummary) -> None:
    """Keep the summary of the pass that just ran."""
    client.set(keys.scheduler_reconcile(), msgspec.json.encode(summary), ex=RECONCILE_TTL_S)


# -- reading ----------------------------------------------------------------------------


def read_reconcile(client: redis.Redis, keys: Keys, *, now_ms: int) -> LastReconcile | None:
    raw = client.get(keys.scheduler_reconcile())
    if raw is None:
        return None
    try:
        summary = msgspec.json.decode(raw, type=ReconcileSummary)
    except msgspec.DecodeError:
        return None
    return LastReconcile(
        at=instant_of(summary.at), age_seconds=max(now_ms - summary.at, 0) / 1000,
        kind=summary.kind, live=summary.live, woken=summary.woken, retired=summary.retired,
        swept=summary.swept, hosts=summary.hosts,
    )


def read_status(
    client: redis.Redis, settings: Settings, *, now_ms: int, next_count: int = NEXT_WAKES
) -> Status:
    """Everything ``dsh-schedule status`` shows, in a number of commands that grows with
    the queues, hosts and workers, never with the agents."""
    coord = Coordination(client, settings)
    keys = coord.keys
    live = live_per_queue(coord, now_ms=now_ms, default_queue=settings.queue)
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
    queue_names = sorted({*live, settings.queue})
    beats = coord.workers.beats()
    facts = {name: read_queue(client, name, beats=beats, now_ms=now_ms) for name in queue_names}
    queues = [
        QueueStatus(
            name=name,
            live_agents=live.get(name, 0),
            queued_jobs=facts[name].queued_jobs,
            oldest_queued_seconds=facts[name].oldest_queued_seconds,
            workers=facts[name].workers,
        )
        for name in queue_names
    ]
    waits = [q.oldest_queued_seconds for q in queues if q.oldest_queued_seconds is not None]
    heartbeat = read_heartbeat(client, keys)
    health = check_health(coord, settings, now_ms=now_ms, heartbeat=heartbeat, live=live,
                          facts=facts)
    return Status(
        prefix=settings.prefix,
        now=instant_of(now_ms),
        live_agents=sum(live.values()),
        ended_agents=int(ended),
        scheduled_wakes=int(scheduled),
        next_wakes=next_wakes,
        overdue_wakes=int(overdue),
        oldest_overdue_seconds=oldest_overdue,
        oldest_queued_seconds=max(waits, default=None),
        followups_pending=coord.followups.pending_total(),
        queues=queues,
        scheduler=heartbeat,
        last_reconcile=read_reconcile(client, keys, now_ms=now_ms),
        health=health,
        unloaded=tuple(
            UnloadedStatus(queue=o.queue, timers=o.timers, load_requests=o.requests)
            for o in coord.unloaded.outstanding()
        ) if settings.wake_unloaded else (),
    )


def _wake(member: bytes | str, score: float, now_ms: int) -> WakeStatus:
    wake_id = text_of(member)
    due_ms = round(float(score) * 1000)
    return WakeStatus(id=wake_id, agent=_agent_of(wake_id), due=instant_of(due_ms),
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

