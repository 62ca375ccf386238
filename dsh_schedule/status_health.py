"""Whether reminders can fire (dsh_schedule/status.py): the scheduler heartbeat's age, the
live agents per queue, each queue's workers and waiting jobs, and ``check_health`` over
them."""

from __future__ import annotations

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
from dsh_schedule.status_report import Health, HeartbeatStatus, SchedulerHeartbeat, WorkerStatus

HEARTBEAT_TTL_S: Final = 60
HEARTBEAT_FRESH_S: Final = 15.0
_LIVE_PER_QUEUE: Final = LuaScript("live_per_queue")
_ENQUEUED_AT: Final = "enqueued_at"


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
        at=instant_of(beat.at), host=beat.host, pid=beat.pid,
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
    return {text_of(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}


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
        raw = client.hget(rq_queue.job_class.key_for(text_of(first[0])), _ENQUEUED_AT)
        if isinstance(raw, bytes | str):
            try:
                enqueued_ms = round(utcparse(text_of(raw)).timestamp() * 1000)
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



def instant_of(ms: int) -> str:
    return format_instant(min(max(ms, MIN_MS), MAX_MS))


def text_of(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _opt_text(value: Any) -> str | None:
    if value is None:
        return None
    return text_of(value) if isinstance(value, bytes | str) else str(value)
