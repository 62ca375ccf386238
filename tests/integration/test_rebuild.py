"""Rebuild and reconcile (docs/architecture.md#hosts-followups-and-rebuild): wake every live
agent, retire ended ones."""

from __future__ import annotations

import redis
from rq import Queue

from dsh_schedule.host.bridge import HostBridge
from dsh_schedule.scheduler.process import rebuild
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import Pair
from dsh_schedule.shared.coordination.wake import ImmediateWakes, decode_batch
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session


def test_rebuild_wakes_live_agents_and_removes_what_ended_agents_left(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    clock = FakeClock()
    store = MemoryStore()
    bridge = HostBridge(store, coordination, settings, clock=clock)
    for agent in ("live", "ended"):
        new_session(store, agent)
        bridge.install(agent)
        coordination.followups.add(agent, "text", [Pair(scheduleId="s", occurrenceAt="x")])
        coordination.wakes.arm(agent, clock() + 60_000, settings.queue)
    queue = Queue(settings.queue, connection=redis_client)
    queue.empty()
    clock.advance(20)
    bridge.renew(["live"])  # "ended" stops renewing; its lease runs out
    clock.advance(settings.lease_ttl_s)

    report = rebuild(coordination, settings, now_ms=clock())

    assert report.woken == ("live",) and report.retired == ("ended",)
    assert [(job.func_name, decode_batch(job.args[0])) for job in queue.jobs] == [
        ("dsh_schedule.worker.job.wake_batch", ImmediateWakes(agents=("live",)))
    ]
    assert coordination.wakes.current("ended") is None
    assert coordination.followups.waiting("ended") == 0
    assert not redis_client.exists(coordination.keys.followups("ended"))
    assert redis_client.hget(coordination.keys.lease_queue(), "ended") is None
    assert coordination.wakes.current("live") is not None
    assert coordination.followups.waiting("live") == 1


def test_rebuild_batches_many_agents_per_job_on_their_own_queues(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    clock = FakeClock()
    agents = [f"agent-{i:03d}" for i in range(250)]
    for i, agent in enumerate(agents):
        queue = "other" if i % 2 else settings.queue
        coordination.leases.grant(agent, queue, now_ms=clock(), ttl_s=60)

    report = rebuild(coordination, settings, now_ms=clock())

    assert sorted(report.woken) == agents
    for name, expected in [(settings.queue, agents[0::2]), ("other", agents[1::2])]:
        jobs = Queue(name, connection=redis_client).jobs
        assert [len(job.args[0]["agents"]) for job in jobs] == [100, 25]
        assert [a for job in jobs for a in job.args[0]["agents"]] == expected


def test_an_ended_agent_whose_lock_is_held_does_not_stop_the_pass(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    import msgspec

    quick_settings = msgspec.structs.replace(settings, tool_lock_wait_s=0.1)
    quick = Coordination(redis_client, quick_settings)
    clock = FakeClock()
    for agent in ("stuck", "gone"):
        quick.leases.grant(agent, quick_settings.queue, now_ms=clock(), ttl_s=1)
    held = redis_client.lock(quick.keys.lock("stuck"), timeout=30, thread_local=False)
    assert held.acquire(blocking=False)
    clock.advance(5)

    report = rebuild(quick, quick_settings, now_ms=clock())

    held.release()
    assert report.retired == ("gone",)
    assert quick.leases.expired_agents(now_ms=clock()) == ["stuck"]  # retried next pass


def test_a_rebuild_batch_decides_each_agent_under_its_own_lock(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    import msgspec

    from dsh_schedule.embedded import EmbeddedSystem

    quick = msgspec.structs.replace(settings, wake_lock_wait_s=0.1)
    clock = FakeClock()
    system = EmbeddedSystem(MemoryStore(), quick, clock=clock, sleep=clock.advance,
                            client=redis_client, injected_clock=True)
    for name in ("due", "later", "locked", "cold"):
        new_session(system.store, name)
        system.host.open_root(name)
        _d, create = system.host.agents[name].tools["schedule_create"]
        create({"prompt": name, "after_seconds": 5 if name == "due" else 600})
    system.step()
    system.flush_redis()
    for name in ("due", "later", "locked"):  # "cold" lost its lease with the flush
        system.coordination.leases.grant(name, quick.queue, now_ms=clock(), ttl_s=60)
    held = redis_client.lock(system.coordination.keys.lock("locked"), timeout=30,
                             thread_local=False)
    assert held.acquire(blocking=False)
    clock.advance(6)

    system.owner.wake_batch(["due", "later", "locked", "cold"])

    held.release()
    wakes = system.coordination.wakes
    assert wakes.current("later") is not None  # armed again for its target
    assert wakes.current("locked") is None and wakes.current("cold") is None
    assert system.coordination.followups.waiting("due") == 1  # dispatched in the batch
    assert [r.id for r in system.store.load("due")[1].active] == []
