"""The embedded runtime (docs/integrations/README.md#the-embedded-runtime): a worker and a
scheduler in this process, as threads, delivering as a deployment does; and the
``schedule_runtime`` fixture, whose clock only the test moves."""

from __future__ import annotations

import asyncio
import threading
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from dsh_schedule import embedded_runtime
from dsh_schedule.host.aio import AsyncAgentRegistry
from dsh_schedule.host.gate import Delivery
from dsh_schedule.runtime import EmbeddedRuntime, ManualClock
from dsh_schedule.shared.settings import Settings
from tests.support import delivered_counts, dispatch_counts

CREATE_IN_AN_HOUR = ("schedule_create", {"prompt": "stretch", "after_seconds": 3600})


def runtime_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dsh-schedule-")]


def test_the_fixture_delivers_a_reminder_once_its_clock_is_advanced(
        schedule_runtime: EmbeddedRuntime) -> None:
    # given a reminder an hour away, created through the tools
    host = schedule_runtime.reference_host()
    schedule_runtime.create_session("chat-1", time_zone="Europe/Berlin")
    host.open_root("chat-1")
    (created,) = host.prompt("chat-1", "remind me in an hour", tool_calls=[CREATE_IN_AN_HOUR])
    assert not created.is_error, created.content

    # when the scheduler and the worker have run, the clock standing still, nothing is due
    schedule_runtime.settle()
    assert host.pump("chat-1") == []

    # when the test advances the clock by 59 minutes, still nothing
    schedule_runtime.advance(59 * 60)
    assert host.pump("chat-1") == []

    # then once it passes the hour, the reminder is delivered, once
    schedule_runtime.advance(60)
    (delivery,) = host.pump("chat-1")
    assert delivery.text.startswith("[SCHEDULE REMINDER]")
    assert 'reminder_prompt_json: "stretch"' in delivery.text
    assert [pair.scheduleId for pair in delivery.pairs] == ["schedule-1"]
    schedule_runtime.advance(3600)
    assert host.pump("chat-1") == []
    assert dispatch_counts(schedule_runtime.store, "chat-1") == {"schedule-1": 1}
    assert delivered_counts(schedule_runtime.store, "chat-1") == {"schedule-1": 1}


def test_a_repeating_reminder_comes_at_each_advanced_interval(
        schedule_runtime: EmbeddedRuntime) -> None:
    host = schedule_runtime.reference_host()
    schedule_runtime.create_session("chat-2")
    host.open_root("chat-2")
    host.prompt("chat-2", "every ten minutes", tool_calls=[
        ("schedule_create", {"prompt": "drink water", "every_seconds": 600})])

    counts = []
    for _ in range(3):
        schedule_runtime.advance(600)
        counts.append(len(host.pump("chat-2")))

    assert counts == [1, 1, 1]


def test_an_asyncio_host_on_the_wall_clock_receives_the_reminder(tmp_path: Path) -> None:
    async def scenario(runtime: EmbeddedRuntime) -> list[Delivery]:
        plugin = runtime.async_plugin()
        agents = AsyncAgentRegistry()
        plugin.load(agents)
        runtime.create_session("chat-3")
        await agents.create("chat-3")
        result = await plugin.tools.call("chat-3", "schedule_create",
                                         {"prompt": "stand up", "after_seconds": 1})
        assert not result.is_error, result.content
        stop = asyncio.Event()
        delivered: list[Delivery] = []

        async def on_delivery(agent: str, delivery: Delivery) -> None:
            delivered.append(delivery)
            stop.set()

        await asyncio.wait_for(plugin.serve(on_delivery, stop, poll_s=0.1), 30)
        await plugin.dispose()
        return delivered

    with embedded_runtime(tmp_path / "sessions") as runtime:
        (delivery,) = asyncio.run(scenario(runtime))

    assert 'reminder_prompt_json: "stand up"' in delivery.text


def test_close_joins_its_threads_and_removes_its_scratch_sessions() -> None:
    runtime = embedded_runtime()
    sessions = runtime.settings.sessions
    runtime.create_session("s")
    assert len(runtime_threads()) == 2 and sessions.exists()

    runtime.close()
    runtime.close()  # a second close does nothing

    assert runtime_threads() == []
    assert not sessions.exists()


def test_it_is_asked_for_by_name_and_refuses_a_redis_url() -> None:
    with pytest.raises(ValueError, match="a Redis of its own"):
        EmbeddedRuntime(settings=Settings(redis_url="redis://127.0.0.1:6379/0"))


def test_advance_needs_a_manual_clock(tmp_path: Path) -> None:
    with embedded_runtime(tmp_path) as runtime, pytest.raises(TypeError, match="ManualClock"):
        runtime.advance(1)


def test_the_manual_clock_stands_still_until_advanced() -> None:
    clock = ManualClock(start_ms=1_000)
    assert (clock(), clock()) == (1_000, 1_000)
    clock.advance(1.5)
    assert clock() == 2_500


def test_the_fixture_is_a_pytest_plugin_of_the_installed_package() -> None:
    plugins = {e.name: e.value for e in entry_points(group="pytest11")}
    assert plugins["dsh_schedule"] == "dsh_schedule.testing"
