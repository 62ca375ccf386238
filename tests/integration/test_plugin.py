"""Composition, the load-order boundary and disposal of the Schedule plugin
(docs/architecture.md#management-tools and #hosts-followups-and-rebuild)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from rq import Queue

from dsh_schedule.host.plugin import CompositionError, SchedulePlugin
from dsh_schedule.host.reference import Agent, AgentRegistry
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.wake_jobs import ImmediateWakes, decode_wakes
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, add_followup, new_session, value


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def test_a_missing_service_is_a_composition_error(
    store: MemoryStore, coordination: Coordination, settings: Settings
) -> None:
    with pytest.raises(CompositionError):
        SchedulePlugin(store=None, coordination=coordination, settings=settings)
    with pytest.raises(CompositionError):
        SchedulePlugin(store=store, coordination=None, settings=settings)
    with pytest.raises(CompositionError):
        SchedulePlugin(store=store, coordination=coordination, settings=None)


def test_only_root_agents_created_after_loading_receive_schedule(
    store: MemoryStore, coordination: Coordination, settings: Settings
) -> None:
    registry = AgentRegistry()
    early = Agent("early")
    registry.publish(early)  # existed before the plugin loaded
    plugin = SchedulePlugin(
        store=store, coordination=coordination, settings=settings, clock=FakeClock()
    )
    plugin.load(registry)
    root, child = Agent("root"), Agent("root/child", is_root=False)
    for agent in (root, child):
        new_session(store, agent.agent_id)
        registry.publish(agent)
    assert early.tools == {} and child.tools == {}
    assert sorted(root.tools) == ["schedule_create", "schedule_delete", "schedule_list",
                                  *(["schedule_update"] if settings.lifecycle else [])]
    assert plugin.installed == ["root"]


def test_disposal_stops_new_work_cancels_the_wake_and_appends_nothing(
    store: MemoryStore, coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    clock = FakeClock()
    registry = AgentRegistry()
    plugin = SchedulePlugin(store=store, coordination=coordination, settings=settings, clock=clock)
    plugin.load(registry)
    agent = Agent("s1")
    new_session(store, "s1")
    registry.publish(agent)
    _d, create = agent.tools["schedule_create"]
    assert not create({"prompt": "x", "after_seconds": 600}).is_error
    assert coordination.wakes.projections(["s1"])[0].wake is not None
    before = store.read("s1").events

    plugin.dispose()

    assert store.read("s1").events == before  # no delete records on teardown
    assert [r.id for r in store.load("s1")[1].active] == ["schedule-1"]
    assert coordination.wakes.projections(["s1"])[0].wake is None
    assert not redis_client.zcard(coordination.wakes.scheduler.scheduled_jobs_key)
    assert not bool(coordination.leases.live_among(["s1"], now_ms=clock()))
    refused = create({"prompt": "y", "after_seconds": 600})
    assert refused.is_error and value(refused.content)["code"] == "internal_error"
    assert not any(e.type == SCHEDULE_CHANGE and e.data["operation"] == "delete"
                   for e in store.read("s1").events)
    assert len(store.read("s1").events) == len(before)
    # and agents created after disposal receive nothing
    late = Agent("late")
    registry.publish(late)
    assert late.tools == {}


def test_disposal_of_one_agent_failing_spares_the_others(
    store: MemoryStore, coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    import msgspec

    quick_settings = msgspec.structs.replace(settings, tool_lock_wait_s=0.1)
    quick = Coordination(redis_client, quick_settings)
    registry = AgentRegistry()
    plugin = SchedulePlugin(
        store=store, coordination=quick, settings=quick_settings, clock=FakeClock()
    )
    plugin.load(registry)
    for name in ("stuck", "fine"):
        new_session(store, name)
        registry.publish(Agent(name))
    held = redis_client.lock(quick.keys.lock("stuck"), timeout=30, thread_local=False)
    assert held.acquire(blocking=False)
    plugin.dispose()
    held.release()
    assert redis_client.hget(quick.keys.lease_queue(), "fine") is None
    assert redis_client.hget(quick.keys.lease_queue(), "stuck") is not None  # runs out


def test_renewal_renews_the_host_and_installs_everything_in_one_batch_after_a_flush(
    store: MemoryStore, coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    clock = FakeClock()
    registry = AgentRegistry()
    plugin = SchedulePlugin(store=store, coordination=coordination, settings=settings, clock=clock)
    plugin.load(registry)
    names = ["s1", "s2", "s3"]
    for name in names:
        new_session(store, name)
        registry.publish(Agent(name))
    queue = Queue(settings.queue, connection=redis_client)
    queue.empty()
    calls: list[list[str]] = []
    install = coordination.leases.install

    def recording(host: str, agents: list[str], *args: Any, **kwargs: Any) -> list[str]:
        calls.append(list(agents))
        return install(host, agents, *args, **kwargs)

    coordination.leases.install = recording  # type: ignore[method-assign]
    # a renewal of a valid host lease: the host's own lease only, nothing new, nothing woken
    clock.advance(settings.lease_renew_s)
    assert plugin.renew_leases() == []
    assert calls == [] and queue.count == 0
    # after a flush every lease is new again: one batched install, one batch of wakes
    redis_client.flushdb()
    clock.advance(settings.lease_renew_s)
    assert plugin.renew_leases() == names
    assert calls == [names]
    woken = [decode_wakes(job.args[0]) for job in queue.jobs]
    assert woken == [ImmediateWakes(agents=tuple(names))]
    assert all(bool(coordination.leases.live_among([n], now_ms=clock())) for n in names)


def _plugin_with_reminders(real_redis: redis.Redis, settings: Settings, store: MemoryStore,
                           names: list[str]) -> tuple[SchedulePlugin, Coordination]:
    coordination = Coordination(real_redis, settings)
    plugin = SchedulePlugin(store=store, coordination=coordination, settings=settings,
                            clock=FakeClock())
    registry = AgentRegistry()
    plugin.load(registry)
    for name in names:
        new_session(store, name)
        agent = Agent(name)
        registry.publish(agent)
        _d, create = agent.tools["schedule_create"]
        assert not create({"prompt": "x", "after_seconds": 600}).is_error
    return plugin, coordination


def test_disposing_many_agents_costs_the_same_round_trips_and_forgets_each(
    real_redis: redis.Redis, settings: Settings, store: MemoryStore,
    round_trips: list[int],
) -> None:
    def round_trips_to_dispose(names: list[str]) -> int:
        plugin, coordination = _plugin_with_reminders(real_redis, settings, store, names)
        for name in names:
            add_followup(coordination.followups, name, "text", [])
        agent_keys = [key for name in names for key in (
            coordination.keys.current_wake(name), coordination.keys.followups(name))]
        assert real_redis.exists(*agent_keys) == len(agent_keys)
        before = round_trips[0]
        plugin.dispose()
        trips = round_trips[0] - before
        assert real_redis.exists(*agent_keys) == 0
        assert real_redis.hmget(coordination.keys.agent_host(), names) == [None] * len(names)
        assert real_redis.smismember(coordination.keys.served(plugin.bridge.host),
                                     names) == [0] * len(names)
        assert real_redis.hmget(coordination.keys.lease_queue(), names) == [None] * len(names)
        return trips

    few = round_trips_to_dispose([f"few{i}" for i in range(3)])
    many = round_trips_to_dispose([f"many{i}" for i in range(60)])
    assert many == few <= 8, (few, many)  # locks taken and released, five drops
    assert not real_redis.zcard(Coordination(real_redis, settings).wakes.scheduler
                                .scheduled_jobs_key)
