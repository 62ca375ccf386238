"""Rebuild and reconcile (docs/architecture.md#hosts-followups-and-rebuild): wake every live
agent, retire ended ones."""

from __future__ import annotations

import msgspec
import redis
from rq import Queue
from rq.job import Job

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.bridge import HostBridge
from dsh_schedule.scheduler.process import Reconciler, rebuild
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import Pair
from dsh_schedule.shared.coordination.wake import ArmRequest
from dsh_schedule.shared.coordination.wake_jobs import ImmediateWakes, decode_wakes
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, add_followup, new_session, reminder_texts


def test_rebuild_wakes_live_agents_and_removes_what_ended_agents_left(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    clock = FakeClock()
    store = MemoryStore()
    staying = HostBridge(store, coordination, settings, clock=clock)
    leaving = HostBridge(store, coordination, settings, clock=clock)
    for agent, bridge in (("live", staying), ("ended", leaving)):
        new_session(store, agent)
        bridge.install(agent)
        add_followup(coordination.followups, agent, "text",
                     [Pair(scheduleId="s", occurrenceAt="x")])
        coordination.wakes.arm([ArmRequest(agent, clock() + 60_000, settings.queue)])
    queue = Queue(settings.queue, connection=redis_client)
    queue.empty()
    clock.advance(20)
    staying.renew()  # the host of "ended" stops renewing; its lease runs out
    clock.advance(settings.lease_ttl_s)

    report = rebuild(coordination, settings, now_ms=clock())

    assert report.woken == ("live",) and report.retired == ("ended",)
    assert [(job.func_name, decode_wakes(job.args[0])) for job in queue.jobs] == [
        ("dsh_schedule.worker.job.wake_batch", ImmediateWakes(agents=("live",)))
    ]
    assert coordination.wakes.projections(["ended"])[0].wake is None
    assert coordination.followups.waiting("ended") == 0
    assert not redis_client.exists(coordination.keys.followups("ended"))
    assert redis_client.hget(coordination.keys.lease_queue(), "ended") is None
    assert coordination.wakes.projections(["live"])[0].wake is not None
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
    assert quick.leases.expired_hosts(now_ms=clock()) == ["host"]  # retried next pass
    assert quick.leases.still_served("host", 10) == ["stuck"]


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

    system.owner.wake([(agent, None) for agent in ("due", "later", "locked", "cold")])

    held.release()
    wakes = system.coordination.wakes
    assert wakes.projections(["later"])[0].wake is not None  # armed again for its target
    assert [p.wake for p in wakes.projections(["locked", "cold"])] == [None, None]
    assert system.coordination.followups.waiting("due") == 1  # dispatched in the batch
    assert [r.id for r in system.store.load("due")[1].active] == []


# -- the incremental reconcile pass -------------------------------------------------------


def _woken(queue: Queue) -> list[str]:
    """The agents of every rebuild-style batch waiting in the queue, then empty it."""
    agents = [a for job in queue.jobs if job.func_name.endswith("wake_batch")
              for a in decode_wakes(job.args[0]).agents]  # type: ignore[union-attr]
    queue.empty()
    return agents


def _system(redis_client: redis.Redis, settings: Settings, clock: FakeClock) -> EmbeddedSystem:
    return EmbeddedSystem(MemoryStore(), settings, clock=clock, sleep=clock.advance,
                          client=redis_client, injected_clock=True)


def _open(system: EmbeddedSystem, name: str, *, after_seconds: int | None = None) -> None:
    new_session(system.store, name)
    system.host.open_root(name)
    if after_seconds is not None:
        _d, create = system.host.agents[name].tools["schedule_create"]
        assert not create({"prompt": name, "after_seconds": after_seconds}).is_error


def test_the_sweep_wakes_every_live_agent_once_per_period_a_slice_per_pass(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    swept = msgspec.structs.replace(settings, reconcile_interval_s=30.0, sweep_period_s=300.0)
    clock = FakeClock()
    agents = [f"agent-{i:02d}" for i in range(10)]
    coordination.leases.install("host", agents, swept.queue, now_ms=clock(), ttl_s=86_400)
    reconciler = Reconciler(coordination, swept)
    reconciler.rebuild(now_ms=clock())
    Queue(swept.queue, connection=redis_client).empty()

    slices: list[tuple[str, ...]] = []
    for _ in range(20):  # two whole periods
        clock.advance(30)
        report = reconciler.reconcile(now_ms=clock())
        assert report.woken == report.swept  # nothing else is stale here
        slices.append(report.swept)

    # each pass wakes the tenth of the agents its 30 s are of the 300 s period
    assert [len(s) for s in slices] == [1] * 20
    assert sorted(a for s in slices[:10] for a in s) == agents
    assert sorted(a for s in slices[10:] for a in s) == agents
    # a pass long overdue (a paused scheduler) catches up one more interval, not everyone
    clock.advance(3_000)
    assert len(reconciler.reconcile(now_ms=clock()).swept) == 2


def test_a_rearm_lost_after_a_durable_create_is_repaired_by_the_sweep_and_delivered_once(
    redis_client: redis.Redis, settings: Settings
) -> None:
    quick = msgspec.structs.replace(settings, reconcile_interval_s=30.0, sweep_period_s=120.0)
    clock = FakeClock()
    system = _system(redis_client, quick, clock)
    names = ["a-other", "b-lost", "c-other", "d-other"]
    for name in names:
        _open(system, name)
    system.step()
    reconciler = Reconciler(system.coordination, quick)
    reconciler.rebuild(now_ms=clock())
    system.step()
    # the create is durable, but its re-arm never reached Redis (pointer and job gone)
    _d, create = system.host.agents["b-lost"].tools["schedule_create"]
    assert not create({"prompt": "water the plants", "after_seconds": 5}).is_error
    coord = system.coordination
    armed = coord.wakes.projections(["b-lost"])[0].wake
    assert armed is not None
    redis_client.zrem(coord.keys.scheduled_jobs(), armed)
    redis_client.delete(Job.key_for(armed), coord.keys.current_wake("b-lost"))
    clock.advance(10)
    system.step()
    assert reminder_texts(system.store, "b-lost") == []  # nothing wakes it by itself

    woken: list[tuple[str, ...]] = []
    while not reminder_texts(system.store, "b-lost") and len(woken) < 8:
        clock.advance(30)
        system.host.plugin.renew_leases()
        report = reconciler.reconcile(now_ms=clock())
        assert report.woken == report.swept  # nothing else wakes an agent here
        woken.append(report.woken)
        system.step()
        system.step()

    # the sweep reached it within one period (4 passes), one agent per pass
    assert len(woken) <= 4 and all(len(w) == 1 for w in woken)
    assert woken[-1] == ("b-lost",)
    assert len(reminder_texts(system.store, "b-lost")) == 1
    for _ in range(8):  # later passes and sweeps deliver nothing more
        clock.advance(30)
        system.host.plugin.renew_leases()
        reconciler.reconcile(now_ms=clock())
        system.step()
    assert len(reminder_texts(system.store, "b-lost")) == 1


def test_a_wake_whose_job_vanished_is_repaired_by_the_sweep_and_delivered_once(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """A partial loss the generation marker cannot see (one job's keys gone, the marker
    kept) is what the sweep is kept for."""
    quick = msgspec.structs.replace(settings, reconcile_interval_s=30.0, sweep_period_s=60.0)
    clock = FakeClock()
    system = _system(redis_client, quick, clock)
    _open(system, "s1", after_seconds=5)
    system.step()
    reconciler = Reconciler(system.coordination, quick)
    reconciler.rebuild(now_ms=clock())
    system.step()
    coord = system.coordination
    armed = coord.wakes.projections(["s1"])[0].wake
    assert armed is not None
    redis_client.zrem(coord.keys.scheduled_jobs(), armed)  # the pointer stays
    redis_client.delete(Job.key_for(armed))
    clock.advance(10)
    system.step()
    assert reminder_texts(system.store, "s1") == []

    swept: list[tuple[str, ...]] = []
    while not reminder_texts(system.store, "s1") and len(swept) < 4:
        clock.advance(30)
        system.host.plugin.renew_leases()
        swept.append(reconciler.reconcile(now_ms=clock()).swept)
        system.step()
        system.step()

    assert ("s1",) in swept and len(swept) <= 2  # within one period of the sweep
    assert len(reminder_texts(system.store, "s1")) == 1
