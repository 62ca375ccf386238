"""Worker liveness and the recovery of a dead worker's wakes, on Redis alone
(docs/architecture.md#a-dead-workers-wakes): exactly the agents a dead worker held are
woken, once, and only once their locks and maintenance phases have expired; a worker that
beats again, or held nothing, wakes nobody."""

from __future__ import annotations

import time

import redis
from rq import Queue

from dsh_schedule.scheduler.process import recover_dead_workers
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.wake_jobs import decode_wakes
from dsh_schedule.shared.coordination.workers import Held
from dsh_schedule.shared.settings import Settings


def _beat(coord: Coordination, name: str, within_ms: int) -> None:
    with coord.client.pipeline(transaction=False) as pipe:
        coord.workers.beat_on(pipe, name, next_within_ms=within_ms)
        pipe.execute()


def _hold(coord: Coordination, name: str, queue: str, *agents: str) -> None:
    coord.workers.holding_on(coord.client, name, Held("job-1", queue, agents))


def _woken(coord: Coordination, queue: str) -> list[str]:
    woken: list[str] = []
    for job in Queue(queue, connection=coord.client).get_jobs():
        woken.extend(decode_wakes(job.args[0]).agents)  # type: ignore[union-attr]
    return woken


def _lease(coord: Coordination, settings: Settings, *agents: str) -> None:
    coord.leases.install("host", list(agents), settings.queue,
                            now_ms=time.time_ns() // 1_000_000, ttl_s=60)


def test_a_dead_worker_s_agents_are_woken_once_and_nobody_else(
    coordination: Coordination, settings: Settings
) -> None:
    _lease(coordination, settings, "a1", "a2", "other")
    _beat(coordination, "dead", -1)
    _hold(coordination, "dead", settings.queue, "a1", "a2")
    _beat(coordination, "alive", 60_000)
    _hold(coordination, "alive", settings.queue, "other")
    assert sorted(recover_dead_workers(coordination)) == ["a1", "a2"]
    assert sorted(_woken(coordination, settings.queue)) == ["a1", "a2"]
    assert recover_dead_workers(coordination) == []  # forgotten: never woken twice
    assert coordination.client.hkeys(coordination.keys.worker_holds()) == [b"alive"]
    assert coordination.client.zrange(coordination.keys.workers(), 0, -1) == [b"alive"]


def test_a_dead_worker_s_agents_wait_for_their_locks_and_maintenance(
    coordination: Coordination, settings: Settings, redis_client: redis.Redis
) -> None:
    _lease(coordination, settings, "a1", "a2")
    _beat(coordination, "dead", -1)
    _hold(coordination, "dead", settings.queue, "a1", "a2")
    redis_client.set(coordination.keys.lock("a1"), "token", px=400)
    redis_client.set(coordination.keys.phase("a2"), "maintenance:x", px=700)
    assert recover_dead_workers(coordination) == []
    assert _woken(coordination, settings.queue) == []
    time.sleep(0.3)
    assert recover_dead_workers(coordination) == []  # looked at again only once they expire
    time.sleep(0.5)
    assert recover_dead_workers(coordination) == ["a1", "a2"]


def test_a_turn_is_not_waited_for(coordination: Coordination, settings: Settings,
                                  redis_client: redis.Redis) -> None:
    _lease(coordination, settings, "a1")
    _beat(coordination, "dead", -1)
    _hold(coordination, "dead", settings.queue, "a1")
    redis_client.set(coordination.keys.phase("a1"), "turn:host", px=60_000)
    assert recover_dead_workers(coordination) == ["a1"]  # the wake registers a waiter


def test_a_worker_that_beats_again_or_held_nothing_wakes_nobody(
    coordination: Coordination, settings: Settings
) -> None:
    _lease(coordination, settings, "a1")
    _beat(coordination, "idle", -1)  # died holding nothing
    _beat(coordination, "paused", -1)
    _hold(coordination, "paused", settings.queue, "a1")
    coordination.client.set(coordination.keys.lock("a1"), "token", px=300)
    assert recover_dead_workers(coordination) == []
    assert coordination.client.zscore(coordination.keys.workers(), "idle") is None
    _beat(coordination, "paused", 60_000)  # it resumed before its agents were free
    time.sleep(0.4)
    assert recover_dead_workers(coordination) == []
    assert _woken(coordination, settings.queue) == []


def test_a_malformed_holds_entry_is_dropped(coordination: Coordination) -> None:
    _beat(coordination, "dead", -1)
    coordination.client.hset(coordination.keys.worker_holds(), "dead", "[[[")
    assert recover_dead_workers(coordination) == []
    assert coordination.client.zcard(coordination.keys.workers()) == 0
    assert coordination.client.hlen(coordination.keys.worker_holds()) == 0
