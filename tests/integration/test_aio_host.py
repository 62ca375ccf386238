"""The asyncio host API (dsh_schedule/host/aio.py) keeps the sync API's guarantees: async
tools, an async turn that always releases its phase, pushed delivery through a
``redis.asyncio`` wait, and ``serve`` delivering each reminder exactly once — with real
``worker`` and ``scheduler`` processes against the suite's real Redis."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis

from dsh_schedule.host.aio import AsyncAgentRegistry, AsyncSchedulePlugin
from dsh_schedule.host.aiobridge import settle
from dsh_schedule.host.bridge import TurnBusy
from dsh_schedule.host.gate import Delivery
from dsh_schedule.integrations.session import SessionRecorder
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.worker.due import DueOwner, WakeOutcome
from tests.conftest import REAL_REDIS_URL
from tests.support import Processes, delivered_counts, dispatch_counts, process_env, value


def make_plugin(settings: Settings, client: redis.Redis) -> AsyncSchedulePlugin:
    return AsyncSchedulePlugin(store=JsonlStore(settings.sessions), settings=settings,
                               coordination=Coordination(client, settings))


@pytest.fixture
def beside(tmp_path: Path, settings: Settings, real_redis: redis.Redis) -> Iterator[Processes]:
    """A worker and a scheduler on the test's prefix and queue."""
    env = process_env(REAL_REDIS_URL, settings.sessions, PREFIX=settings.prefix,
                      QUEUE=settings.queue, LOCK_TTL="5", MAINTENANCE_TTL="5",
                      MOVER_INTERVAL="0.05", RECONCILE_INTERVAL="2")
    processes = Processes(tmp_path, env)
    processes.spawn("worker", "worker")
    processes.spawn("scheduler", "scheduler")
    try:
        yield processes
    finally:
        processes.close()


async def user_turn(plugin: AsyncSchedulePlugin, agent_tools: dict[str, object],
                    *calls: dict[str, object]) -> list[dict[str, object]]:
    """A person's turn in which the model calls schedule_create with each of ``calls``."""
    recorder = SessionRecorder(plugin.store)
    answers = []
    async with plugin.bridge.turn("s1"):
        turn = await recorder.user_turn("s1", "remind me", client_time_zone="UTC")
        for args in calls:
            _definition, handler = agent_tools["schedule_create"]  # type: ignore[misc]
            result = await handler(args)
            await turn.tool("schedule_create", args, result.content, is_error=result.is_error)
            answers.append(value(result.content))
        await turn.end()
    return answers


@pytest.mark.redis
@pytest.mark.slow
def test_async_tools_a_turn_and_pushed_delivery(settings: Settings, real_redis: redis.Redis,
                                                beside: Processes) -> None:
    async def scenario() -> tuple[list[Delivery], list[str]]:
        plugin = make_plugin(settings, real_redis)
        agents = AsyncAgentRegistry()
        plugin.load(agents)
        plugin.store.create(SessionHeader(id="s1", createdAt=0))
        agent = await agents.create("s1")
        try:
            # given a reminder one second away, created through an async tool handler
            [made] = await user_turn(plugin, agent.tools,
                                     {"prompt": "stretch", "after_seconds": 1})
            assert made["id"] == "schedule-1"

            # when the host waits on the ready stream and delivers what it names
            delivered: list[Delivery] = []
            deadline = time.monotonic() + 30
            while not delivered and time.monotonic() < deadline:
                for named in await plugin.bridge.ready(5.0):
                    if not await plugin.bridge.has_followup(named):
                        continue
                    async with plugin.bridge.turn(named):
                        async for delivery in plugin.bridge.deliveries(named):
                            turn = SessionRecorder(plugin.store).reminder_turn(named, delivery)
                            await turn.start_step()
                            await turn.assistant("Time to stretch!")
                            await turn.end()
                            delivered.append(delivery)
            # then nothing more is named with a followup afterwards
            later = [a for a in await plugin.bridge.ready(0.5)
                     if await plugin.bridge.waiting(a)]
            return delivered, later
        finally:
            await plugin.dispose()

    delivered, later = asyncio.run(scenario())
    assert [[p.scheduleId for p in d.pairs] for d in delivered] == [["schedule-1"]]
    assert 'reminder_prompt_json: "stretch"' in delivered[0].text
    assert later == []
    store = JsonlStore(settings.sessions)
    assert dispatch_counts(store, "s1") == delivered_counts(store, "s1") == {"schedule-1": 1}
    assert [e.type for e in store.read("s1").events][-4:] == [
        "step/start", "assistant/message", "step/end", "turn/end"]
    assert beside.dead() == {}


@pytest.mark.redis
@pytest.mark.slow
def test_serve_delivers_each_reminder_once_in_a_turn_of_its_own(
        settings: Settings, real_redis: redis.Redis, beside: Processes) -> None:
    async def scenario() -> list[tuple[str, int, str]]:
        plugin = make_plugin(settings, real_redis)
        agents = AsyncAgentRegistry()
        plugin.load(agents)
        plugin.store.create(SessionHeader(id="s1", createdAt=0))
        agent = await agents.create("s1")
        seen: list[tuple[str, int, str]] = []
        stop = asyncio.Event()

        async def on_delivery(agent_id: str, delivery: Delivery) -> None:
            turn = SessionRecorder(plugin.store).reminder_turn(agent_id, delivery)
            await turn.start_step()
            await turn.assistant("noted")
            await turn.end()
            seen.append((agent_id, delivery.turn, delivery.pairs[0].scheduleId))
            if len(seen) == 2:
                stop.set()

        try:
            await user_turn(plugin, agent.tools, {"prompt": "one", "after_seconds": 1},
                            {"prompt": "two", "after_seconds": 2})
            await asyncio.wait_for(plugin.serve(on_delivery, stop, poll_s=0.5), 40)
        finally:
            await plugin.dispose()
        return seen

    seen = asyncio.run(scenario())
    assert [(agent, schedule) for agent, _turn, schedule in seen] == [
        ("s1", "schedule-1"), ("s1", "schedule-2")]
    assert seen[0][1] != seen[1][1]  # two turns
    store = JsonlStore(settings.sessions)
    assert delivered_counts(store, "s1") == {"schedule-1": 1, "schedule-2": 1}


async def _dispatched_agents(plugin: AsyncSchedulePlugin, settings: Settings,
                             names: list[str]) -> None:
    """Agents installed on ``plugin``, each with one reminder dispatched (its followup
    announced), by a due owner in this process."""
    registry = AsyncAgentRegistry()
    plugin.load(registry)
    handles = {}
    for name in names:
        plugin.store.create(SessionHeader(id=name, createdAt=0))
        handles[name] = await registry.create(name)
    for name in names:
        _definition, handler = handles[name].tools["schedule_create"]
        result = await handler({"prompt": f"for {name}", "after_seconds": 1})
        assert not result.is_error, result.content
    await asyncio.sleep(1.05)
    owner = DueOwner(plugin.store, plugin.coordination, settings, clock=wall_clock_ms)
    outcomes = await asyncio.to_thread(owner.wake, [(name, None) for name in names])
    assert set(outcomes.values()) == {WakeOutcome.SETTLED}


async def _finish(plugin: AsyncSchedulePlugin, agent: str, delivery: Delivery) -> None:
    turn = SessionRecorder(plugin.store).reminder_turn(agent, delivery)
    await turn.start_step()
    await turn.assistant("noted")
    await turn.end()


@pytest.mark.redis
def test_serve_serves_agents_at_once_so_a_slow_turn_holds_up_no_other(
        settings: Settings, real_redis: redis.Redis) -> None:
    names = [f"s{i}" for i in range(4)]

    async def scenario() -> list[str]:
        plugin = make_plugin(settings, real_redis)
        seen: list[str] = []
        stop = asyncio.Event()
        every_turn_open = asyncio.Barrier(len(names))

        async def on_delivery(agent: str, delivery: Delivery) -> None:
            # the model of each turn answers only once every agent's turn is open
            await asyncio.wait_for(every_turn_open.wait(), 10)
            await _finish(plugin, agent, delivery)
            seen.append(agent)
            if len(seen) == len(names):
                stop.set()

        try:
            await _dispatched_agents(plugin, settings, names)
            await asyncio.wait_for(plugin.serve(on_delivery, stop, poll_s=0.2), 30)
        finally:
            await plugin.dispose()
        return seen

    seen = asyncio.run(scenario())
    assert sorted(seen) == names
    store = JsonlStore(settings.sessions)
    for name in names:
        assert delivered_counts(store, name) == {"schedule-1": 1}


@pytest.mark.redis
def test_serve_holds_at_most_max_turns_turns_at_once(
        settings: Settings, real_redis: redis.Redis) -> None:
    names = [f"s{i}" for i in range(5)]

    async def scenario() -> tuple[list[str], int]:
        plugin = make_plugin(settings, real_redis)
        seen: list[str] = []
        stop = asyncio.Event()
        open_turns = [0, 0]  # now, most

        async def on_delivery(agent: str, delivery: Delivery) -> None:
            open_turns[0] += 1
            open_turns[1] = max(open_turns)
            await asyncio.sleep(0.2)  # a model that takes its time
            await _finish(plugin, agent, delivery)
            open_turns[0] -= 1
            seen.append(agent)
            if len(seen) == len(names):
                stop.set()

        try:
            await _dispatched_agents(plugin, settings, names)
            await asyncio.wait_for(
                plugin.serve(on_delivery, stop, poll_s=0.2, max_turns=2), 30)
        finally:
            await plugin.dispose()
        return seen, open_turns[1]

    seen, most = asyncio.run(scenario())
    assert sorted(seen) == names
    assert most == 2


@pytest.mark.redis
def test_a_waiting_ready_is_woken_by_the_end_of_a_turn(settings: Settings,
                                                       real_redis: redis.Redis) -> None:
    async def scenario() -> list[str]:
        plugin = make_plugin(settings, real_redis)
        agents = AsyncAgentRegistry()
        plugin.load(agents)
        plugin.store.create(SessionHeader(id="s1", createdAt=0))
        await agents.create("s1")
        try:
            assert await plugin.bridge.ready(0.0) == ["s1"]  # named once at install
            waiting = asyncio.ensure_future(plugin.bridge.ready(60.0))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            async with plugin.bridge.turn("s1"):
                pass
            # the end of the turn names the agent at once, not after 60 s
            return await asyncio.wait_for(waiting, 10)
        finally:
            await plugin.dispose()

    assert asyncio.run(scenario()) == ["s1"]


@pytest.mark.redis
def test_a_cancelled_turn_entry_releases_the_phase_it_claimed(
        settings: Settings, real_redis: redis.Redis) -> None:
    async def scenario() -> None:
        plugin = make_plugin(settings, real_redis)
        try:
            holder = plugin.bridge.turn("s1")
            await holder.__aenter__()
            # a second turn waits for the first; cancelled while it waits
            entering = asyncio.ensure_future(plugin.bridge.turn("s1", wait_s=10).__aenter__())
            await asyncio.sleep(0.3)
            entering.cancel()
            await holder.__aexit__(None, None, None)  # now the waiting entry claims ...
            with pytest.raises(asyncio.CancelledError):
                await entering  # ... and, cancelled, leaves again before it returns
            async with plugin.bridge.turn("s1", wait_s=1.0):
                pass  # so the phase is free
            with pytest.raises(TurnBusy):
                async with plugin.bridge.turn("s1", wait_s=0.0), \
                        plugin.bridge.turn("s1", wait_s=0.1):
                    pass
        finally:
            await plugin.dispose()

    asyncio.run(scenario())


def test_settle_finishes_the_step_before_passing_on_a_cancellation() -> None:
    started, release = threading.Event(), threading.Event()
    undone: list[str] = []

    def step() -> str:
        started.set()
        release.wait(10)
        return "done"

    async def scenario() -> None:
        task = asyncio.ensure_future(settle(step, undo=undone.append))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.1)
        assert not task.done()  # still waiting for its thread
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert undone == ["done"]


def test_ready_on_the_embedded_redis_waits_in_a_thread(settings: Settings) -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        plugin = make_plugin(settings, fakeredis.FakeRedis())
        agents = AsyncAgentRegistry()
        plugin.load(agents)
        await agents.create("s1")
        await agents.create("child", is_root=False)
        try:
            return await plugin.bridge.ready(0.1), list(plugin.installed)
        finally:
            await plugin.dispose()

    named, installed = asyncio.run(scenario())
    assert named == ["s1"]
    assert installed == ["s1"]  # a root agent only
