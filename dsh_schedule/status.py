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
from rq.utils import utcparse

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.clock import skew_note
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, format_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.terminal import terminal_text

HEARTBEAT_TTL_S: Final = 60
HEARTBEAT_EVERY_S: Final = 1.0
HEARTBEAT_FRESH_S: Final = 15.0
RECONCILE_TTL_S: Final = 86_400
NEXT_WAKES: Final = 5
_WAKE_PREFIX: Final = "wake_"
_LIVE_PER_QUEUE: Final = LuaScript("live_per_queue")
_ENQUEUED_AT: Final = "enqueued_at"


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
    # False: a worker of ours whose beat is overdue (killed, or hung); a stock rq worker,
    # which does not beat in ``Keys.worker_beats``, is taken as beating.
    beating: bool = True


class QueueStatus(_Camel, frozen=True, kw_only=True, rename="camel"):
    name: str
    live_agents: int
    queued_jobs: int
    # How long the oldest job still waiting in the queue has waited (None: none waits).
    oldest_queued_seconds: float | None
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


class UnloadedStatus(_Camel, frozen=True, kw_only=True, rename="camel"):
    """One host group's sessions no host has loaded (``Settings.wake_unloaded``)."""

    queue: str
    timers: int  # sessions with a timer and no live agent
    load_requests: int  # requests announced and not yet answered by a load


class Status(_Camel, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    prefix: str
    now: str
    live_agents: int
    ended_agents: int  # their host's lease expired, not yet retired by a reconcile pass
    scheduled_wakes: int
    next_wakes: list[WakeStatus]
    overdue_wakes: int
    oldest_overdue_seconds: float | None
    # The longest any job has waited in a queue (a wake moved there, not yet taken).
    oldest_queued_seconds: float | None
    followups_pending: int
    queues: list[QueueStatus]
    scheduler: HeartbeatStatus | None
    last_reconcile: LastReconcile | None
    health: Health
    # Only with wake_unloaded: the timers of unloaded sessions, apart from live agents.
    unloaded: tuple[UnloadedStatus, ...] = ()


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


def live_per_queue(coord: Coordination, *, now_ms: int, default_queue: str) -> dict[str, int]:
    """How many live agents each queue has: one script call over the live hosts' served
    sets (a host serves every agent on its own queue; an agent whose lease names none is
    on ``default_queue``). O(hosts)."""
    hosts = coord.leases.live_hosts(now_ms=now_ms)
    if not hosts:
        return {}
    keys = coord.keys
    flat: Any = _LIVE_PER_QUEUE.run(
        coord.client, [keys.lease_queue()], [keys.served(""), default_queue, *hosts])
    return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


class QueueFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What one queue holds and who serves it, as ``health`` and ``status`` read it."""

    workers: list[WorkerStatus]
    queued_jobs: int
    oldest_queued_seconds: float | None

    @property
    def beating(self) -> bool:
        return any(worker.beating for worker in self.workers)


def read_queue(client: redis.Redis, queue: str, *, beats: tuple[int, dict[str, int]],
               now_ms: int) -> QueueFacts:
    """The rq workers registered on ``queue`` whose worker key is still alive, whether each
    beats (``beats``: Redis's clock and ``WorkerLiveness.beats``), the jobs waiting in it,
    and how long the oldest has (its rq ``enqueued_at``, by ``now_ms``)."""
    redis_now, beat_by = beats
    rq_queue = Queue(queue, connection=client)
    found: list[WorkerStatus] = []
    for worker in Worker.all(queue=rq_queue):
        beat = worker.last_heartbeat
        name = str(worker.name)
        due = beat_by.get(name)
        found.append(WorkerStatus(
            name=name,
            hostname=_opt_text(worker.hostname),
            pid=worker.pid,
            state=_opt_text(getattr(worker.get_state(), "value", worker.get_state()))
            or "unknown",
            queues=[str(n) for n in worker.queue_names()],
            last_heartbeat=None if beat is None else beat.isoformat(),
            beating=due is None or due >= redis_now,
        ))
    with client.pipeline(transaction=False) as pipe:
        pipe.llen(rq_queue.key)
        pipe.lrange(rq_queue.key, 0, 0)
        queued, first = pipe.execute()
    oldest: float | None = None
    if first:
        raw = client.hget(rq_queue.job_class.key_for(_text(first[0])), _ENQUEUED_AT)
        if isinstance(raw, bytes | str):
            try:
                enqueued_ms = round(utcparse(_text(raw)).timestamp() * 1000)
            except ValueError:
                pass
            else:
                oldest = max(now_ms - enqueued_ms, 0) / 1000
    return QueueFacts(workers=found, queued_jobs=int(queued), oldest_queued_seconds=oldest)


def check_health(
    coord: Coordination,
    settings: Settings,
    *,
    now_ms: int,
    queues: Sequence[str] | None = None,
    also: Sequence[str] = (),
    heartbeat: HeartbeatStatus | None = None,
    live: dict[str, int] | None = None,
    facts: dict[str, QueueFacts] | None = None,
) -> Health:
    """Healthy: the scheduler heartbeat is fresh, and each queue checked has a beating
    worker and no wake that has waited in it longer than ``settings.wake_wait_alarm_s``. The queues
    checked are ``queues`` (a host asks about its own) or, by default, every queue that
    has live agents, plus ``also`` (queues named by the caller, live agents or not).
    ``live`` and ``facts``: what the caller read already. RedisError propagates."""
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
        if live is None:
            live = live_per_queue(coord, now_ms=now_ms, default_queue=settings.queue)
        wanted.update(live)
    else:
        wanted.update(dict.fromkeys(queues))
    for queue in also:
        wanted.setdefault(queue, None)
    if facts is None:
        beats = coord.workers.beats()
        facts = {queue: read_queue(client, queue, beats=beats, now_ms=now_ms)
                 for queue in wanted}
    for queue in sorted(wanted):
        problems.extend(_queue_problems(queue, wanted[queue], facts[queue],
                                        settings.wake_wait_alarm_s))
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


def _queue_problems(queue: str, live: int | None, facts: QueueFacts,
                    wake_wait_alarm_s: float) -> list[str]:
    problems: list[str] = []
    has = (f"queue {queue!r} has" if live is None
           else f"queue {queue!r} has {live} live agent(s) and")
    if not facts.workers:
        problems.append(f"{has} no worker")
    elif not facts.beating:
        problems.append(f"{has} no beating worker (its {len(facts.workers)} registered "
                        "worker(s) stopped beating: killed, or hung)")
    waited = facts.oldest_queued_seconds
    if waited is not None and waited > wake_wait_alarm_s:
        problems.append(f"a wake has waited {waited:.1f} s in queue {queue!r} (at most "
                        f"{wake_wait_alarm_s:g} s: wake_wait_alarm_s)")
    return problems


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
        now=_instant(now_ms),
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
    queued = sum(queue.queued_jobs for queue in status.queues)
    if status.oldest_queued_seconds is not None:
        lines.append(f"queued wakes: {queued} job(s) waiting for a worker, the oldest for "
                     f"{status.oldest_queued_seconds:.1f} s")
    for wake in status.next_wakes:
        named = "agent " + wake.agent if wake.agent is not None else wake.id
        lines.append(f"  next: {wake.due} (in {wake.due_in_seconds:.1f} s) "
                     f"{terminal_text(named)}")
    lines.append(f"followups pending: {status.followups_pending}")
    for queue in status.queues:
        workers = ", ".join(
            f"{terminal_text(w.name)} ({terminal_text(w.state)}"
            f"{'' if w.beating else ', NOT BEATING'})" for w in queue.workers) or "none"
        oldest = ("" if queue.oldest_queued_seconds is None
                  else f", the oldest waiting {queue.oldest_queued_seconds:.1f} s")
        lines.append(
            f"queue {terminal_text(queue.name)}: {queue.live_agents} live agent(s), "
            f"{queue.queued_jobs} queued job(s){oldest}; workers: {workers}"
        )
    for group in status.unloaded:
        lines.append(
            f"unloaded sessions of {terminal_text(group.queue)}: {group.timers} timer(s), "
            f"{group.load_requests} load request(s) outstanding")
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
