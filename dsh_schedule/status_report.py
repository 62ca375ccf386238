"""What ``dsh-schedule status`` reports (dsh_schedule/status.py): the values of the two keys
the scheduler leaves, the ``Status`` of a deployment with its ``Health``, and
``render_status``, the few lines a person reads."""

from __future__ import annotations

import msgspec

from dsh_schedule.terminal import terminal_text


class Camel(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class SchedulerHeartbeat(Camel, frozen=True, kw_only=True, rename="camel"):
    """The value of the heartbeat key."""

    at: int  # the scheduler's wall clock when it wrote the heartbeat, epoch ms
    every: float  # the longest gap it expects between two refreshes, seconds
    ttl: int  # the TTL it wrote the key with, seconds
    host: str
    pid: int


class ReconcileSummary(Camel, frozen=True, kw_only=True, rename="camel"):
    """The value of the last-reconcile key: one rebuild or reconcile pass."""

    at: int  # epoch ms, the scheduler's wall clock
    kind: str  # "rebuild" or "reconcile"
    live: int
    woken: int
    retired: int
    swept: int = 0
    hosts: int | None = None  # the live hosts a reconcile pass read


class Health(Camel, frozen=True, kw_only=True, rename="camel"):
    """Whether reminders can fire, and one line saying why (or why not)."""

    ok: bool
    reason: str



class HeartbeatStatus(Camel, frozen=True, kw_only=True, rename="camel"):
    age_seconds: float
    fresh: bool
    fresh_within_seconds: float
    at: str
    host: str
    pid: int


class WorkerStatus(Camel, frozen=True, kw_only=True, rename="camel"):
    name: str
    hostname: str | None
    pid: int | None
    state: str
    queues: list[str]
    last_heartbeat: str | None
    # False: a worker of ours whose beat is overdue (killed, or hung); a stock rq worker,
    # which does not beat in ``Keys.worker_beats``, is taken as beating.
    beating: bool = True


class QueueStatus(Camel, frozen=True, kw_only=True, rename="camel"):
    name: str
    live_agents: int
    queued_jobs: int
    # How long the oldest job still waiting in the queue has waited (None: none waits).
    oldest_queued_seconds: float | None
    workers: list[WorkerStatus]


class WakeStatus(Camel, frozen=True, kw_only=True, rename="camel"):
    id: str
    agent: str | None
    due: str
    due_in_seconds: float


class LastReconcile(Camel, frozen=True, kw_only=True, rename="camel"):
    at: str
    age_seconds: float
    kind: str
    live: int
    woken: int
    retired: int
    swept: int
    hosts: int | None


class UnloadedStatus(Camel, frozen=True, kw_only=True, rename="camel"):
    """One host group's sessions no host has loaded (``Settings.wake_unloaded``)."""

    queue: str
    timers: int  # sessions with a timer and no live agent
    load_requests: int  # requests announced and not yet answered by a load


class Status(Camel, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
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
