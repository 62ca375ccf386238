"""A reminder in a session no host has loaded, on the ``schedule_runtime`` fixture with the
mode on: the host's ``on_due_unloaded`` re-creates the agent and the reminder is delivered
into the session once (docs/integrations/README.md#reminders-in-closed-threads)."""

from __future__ import annotations

import asyncio

import pytest

from dsh_schedule.host.aio import AsyncAgentRegistry
from dsh_schedule.host.gate import Delivery
from dsh_schedule.runtime import EmbeddedRuntime
from dsh_schedule.shared.settings import Settings


@pytest.fixture
def schedule_settings() -> Settings:
    return Settings(wake_unloaded=True)


def test_a_reminder_in_a_session_never_loaded_is_delivered_once(
        schedule_runtime: EmbeddedRuntime) -> None:
    # given: a host that loads sessions on demand, and a session it has never loaded
    host = schedule_runtime.reference_host(all_sessions=True)
    schedule_runtime.create_session("chat-1")
    made = schedule_runtime.call_tool("chat-1", "schedule_create",
                                      {"prompt": "stretch", "after_seconds": 3600})
    assert not made.is_error, made.content
    schedule_runtime.settle()
    assert "chat-1" not in host.agents
    # when: its reminder falls due
    schedule_runtime.advance(3600)
    # then: the host loaded it and the reminder is delivered, once
    assert "chat-1" in host.agents
    (delivery,) = host.pump("chat-1")
    assert '"stretch"' in delivery.text
    schedule_runtime.advance(60)
    assert host.pump("chat-1") == []


def test_an_asyncio_host_reopens_a_session_never_loaded_and_serves_its_reminder(
        schedule_runtime: EmbeddedRuntime) -> None:
    async def scenario() -> list[tuple[str, str]]:
        # given: an asyncio host whose callback creates a session's root agent again
        agents = AsyncAgentRegistry()
        reopened: list[str] = []

        async def reopen(session_id: str) -> None:
            reopened.append(session_id)
            await agents.create(session_id)

        plugin = schedule_runtime.async_plugin(on_due_unloaded=reopen)
        plugin.load(agents)
        schedule_runtime.create_session("chat-2")
        made = schedule_runtime.call_tool("chat-2", "schedule_create",
                                          {"prompt": "water", "after_seconds": 600})
        assert not made.is_error, made.content
        delivered: list[tuple[str, str]] = []
        stop = asyncio.Event()

        async def deliver(agent: str, delivery: Delivery) -> None:
            delivered.append((agent, delivery.text))
            stop.set()

        serving = asyncio.create_task(plugin.serve(deliver, stop, poll_s=0.1))
        # when: its reminder falls due (advance waits for the load, on another thread)
        await asyncio.to_thread(schedule_runtime.advance, 600)
        await asyncio.wait_for(serving, 10)
        await plugin.dispose()
        assert reopened == ["chat-2"]
        return delivered

    # then: the reminder was delivered into the session, once
    ((agent, text),) = asyncio.run(scenario())
    assert agent == "chat-2" and '"water"' in text
