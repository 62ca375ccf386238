"""Composition, the load-order boundary and disposal of the Schedule plugin
(docs/architecture.md#management-tools and #hosts-followups-and-rebuild)."""

from __future__ import annotations

import pytest
import redis

from dsh_schedule.host.plugin import CompositionError, SchedulePlugin
from dsh_schedule.host.reference import Agent, AgentRegistry
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session, value


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def test_a_missing_service_is_a_composition_error(
    store: MemoryStore, coordination: Coordination
) -> None:
    with pytest.raises(CompositionError):
        SchedulePlugin(store=None, coordination=coordination)
    with pytest.raises(CompositionError):
        SchedulePlugin(store=store, coordination=None)


def test_only_root_agents_created_after_loading_receive_schedule(
    store: MemoryStore, coordination: Coordination
) -> None:
    registry = AgentRegistry()
    early = Agent("early")
    registry.publish(early)  # existed before the plugin loaded
    plugin = SchedulePlugin(store=store, coordination=coordination, clock=FakeClock())
    plugin.load(registry)
    root, child = Agent("root"), Agent("root/child", is_root=False)
    for agent in (root, child):
        new_session(store, agent.agent_id)
        registry.publish(agent)
    assert early.tools == {} and child.tools == {}
    assert sorted(root.tools) == ["schedule_create", "schedule_delete", "schedule_list"]
    assert plugin.installed == ["root"]


def test_disposal_stops_new_work_cancels_the_wake_and_appends_nothing(
    store: MemoryStore, coordination: Coordination, redis_client: redis.Redis
) -> None:
    clock = FakeClock()
    registry = AgentRegistry()
    plugin = SchedulePlugin(store=store, coordination=coordination, clock=clock)
    plugin.load(registry)
    agent = Agent("s1")
    new_session(store, "s1")
    registry.publish(agent)
    _d, create = agent.tools["schedule_create"]
    assert not create({"prompt": "x", "after_seconds": 600}).is_error
    assert coordination.wakes.current("s1") is not None
    before = store.read("s1").events

    plugin.dispose()

    assert store.read("s1").events == before  # no delete records on teardown
    assert [r.id for r in store.load("s1")[1].active] == ["schedule-1"]
    assert coordination.wakes.current("s1") is None
    assert not redis_client.zcard(coordination.wakes.scheduler.scheduled_jobs_key)
    assert not coordination.leases.is_live("s1", now_ms=clock())
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
    store: MemoryStore, coordination: Coordination, redis_client: redis.Redis
) -> None:
    import msgspec

    quick = Coordination(redis_client, msgspec.structs.replace(
        coordination.settings, tool_lock_wait_s=0.1))
    registry = AgentRegistry()
    plugin = SchedulePlugin(store=store, coordination=quick, clock=FakeClock())
    plugin.load(registry)
    for name in ("stuck", "fine"):
        new_session(store, name)
        registry.publish(Agent(name))
    held = redis_client.lock(quick.keys.lock("stuck"), timeout=30, thread_local=False)
    assert held.acquire(blocking=False)
    plugin.dispose()
    held.release()
    assert quick.leases.queue_of("fine") is None
    assert quick.leases.queue_of("stuck") is not None  # its lease will run out
