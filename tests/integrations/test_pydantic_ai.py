"""The Pydantic AI adapter in process: tools from the catalog's schemas, sequential, the
agent id from the run's dependencies, error values as failed tool results, the host
contract recorded before the tool call, and the thread's history carried between runs."""

from __future__ import annotations

import asyncio
import inspect
import json
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from dsh_schedule.host.aio import AsyncSchedulePlugin
from dsh_schedule.integrations.pydantic_ai import (
    InMemoryHistory,
    ScheduleDeps,
    run_user_turn,
    schedule_tools,
)
from dsh_schedule.integrations.session import time_context_reading
from dsh_schedule.shared.core.catalog import tool_definitions
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.store.codec import NESTING_OMITTED
from dsh_schedule.shared.store.jsonl import JsonlStore

ZONE = "Europe/Berlin"


def calls_then_reports(*calls: tuple[str, dict[str, object]]) -> FunctionModel:
    """A model that makes ``calls`` in its first response, then reports every tool
    result it got as ``[[outcome, content], …]``, and on later prompts counts the
    messages it was shown."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)] \
            if isinstance(last, ModelRequest) else []
        if returns:
            report = [[p.outcome, p.model_response_str(wrap_if_error=False)] for p in returns]
            return ModelResponse(parts=[TextPart(json.dumps(report))])
        if len(messages) > 1:
            return ModelResponse(parts=[TextPart(f"seen {len(messages)} messages")])
        return ModelResponse(parts=[ToolCallPart(name, args) for name, args in calls])

    return FunctionModel(respond)


def test_the_tools_carry_the_catalog_schemas_and_run_sequentially(
        plugin: AsyncSchedulePlugin) -> None:
    tools = schedule_tools(plugin)
    definitions = tool_definitions(lifecycle=plugin.tools.lifecycle)
    assert [t.name for t in tools] == [d.name for d in definitions]
    for tool, definition in zip(tools, definitions, strict=True):
        assert tool.function_schema.json_schema == definition.input_schema
        assert tool.description == definition.description
        assert tool.sequential is True
        assert tool.takes_ctx is True


def test_the_agent_id_comes_from_the_runs_dependencies(plugin: AsyncSchedulePlugin) -> None:
    for session in ("a", "b"):
        plugin.store.create(SessionHeader(id=session, createdAt=0))
    model = calls_then_reports(("schedule_create", {"prompt": "x", "after_seconds": 60}))
    agent = Agent(model, deps_type=ScheduleDeps, tools=schedule_tools(plugin))

    asyncio.run(agent.run("remind me", deps=ScheduleDeps("b")))

    assert list(plugin.store.read("a").events) == []
    assert [e.type for e in plugin.store.read("b").events] == ["schedule/change"]


def test_arguments_arrive_as_sent_and_errors_are_failed_results(
        plugin: AsyncSchedulePlugin) -> None:
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    model = calls_then_reports(
        ("schedule_create", {"prompt": "x", "after_seconds": 60, "every_seconds": None}),
        ("schedule_create", {"prompt": "x", "after_seconds": 60}),
        ("schedule_list", {}),
    )
    agent = Agent(model, deps_type=ScheduleDeps, tools=schedule_tools(plugin))

    result = asyncio.run(run_user_turn(agent, plugin, ScheduleDeps("s1"), "remind me",
                                       history=InMemoryHistory()))

    (refused, refused_content), (made, made_content), (listed, listed_content) = \
        json.loads(result.output)
    assert (refused, json.loads(refused_content)["code"]) == ("failed", "invalid_selector")
    assert (made, json.loads(made_content)["id"]) == ("success", "schedule-1")
    assert (listed, [v["id"] for v in json.loads(listed_content)]) == ("success",
                                                                         ["schedule-1"])
    # sequential: the calls ran, and were recorded, in the order the model made them
    results = [e.data for e in plugin.store.read("s1").events if e.type == "tool/result"]
    assert [r["isError"] for r in results] == [True, False, False]


@pytest.mark.parametrize("client_zone", [ZONE, "Europe/Lisbon"])
def test_a_recorded_run_confirms_a_local_time_from_the_persons_zone(
        plugin: AsyncSchedulePlugin, client_zone: str) -> None:
    plugin.store.create(SessionHeader(id="s1", createdAt=0, timeZone=ZONE))
    day = (datetime.now(ZoneInfo(ZONE)) + timedelta(days=1)).date().isoformat()
    model = calls_then_reports(("schedule_create", {
        "prompt": "call the office", "at": {"date": day, "time": "09:00:00"}}))
    agent = Agent(model, deps_type=ScheduleDeps, tools=schedule_tools(plugin))

    result = asyncio.run(run_user_turn(
        agent, plugin, ScheduleDeps("s1"), "Call the office at 9 tomorrow",
        history=InMemoryHistory(), client_time_zone=client_zone,
        time_context=time_context_reading(0, client_zone)))

    [[outcome, content]] = json.loads(result.output)
    if client_zone == ZONE:
        assert (outcome, json.loads(content)["kind"]) == ("success", "at")
    else:
        assert outcome == "failed"
        assert json.loads(content)["code"] == "timezone_confirmation_required"
        assert json.loads(content)["clientTimeZones"] == ["Europe/Lisbon"]
    kinds = [e.type for e in plugin.store.read("s1").events]
    assert kinds[:4] == ["turn/start", "user/message", "user/message", "step/start"]
    assert kinds[-2:] == ["step/end", "turn/end"]


def test_the_history_is_carried_from_run_to_run(plugin: AsyncSchedulePlugin) -> None:
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    agent = Agent(calls_then_reports(("schedule_list", {})), deps_type=ScheduleDeps,
                  tools=schedule_tools(plugin))
    history = InMemoryHistory()

    async def two_turns() -> str:
        await run_user_turn(agent, plugin, ScheduleDeps("s1"), "list", history=history)
        second = await run_user_turn(agent, plugin, ScheduleDeps("s1"), "again",
                                     history=history)
        return str(second.output)

    assert asyncio.run(two_turns()) == "seen 5 messages"
    assert len(asyncio.run(history.load("s1"))) == 6


def test_arguments_nested_too_deep_answer_the_tools_error_and_keep_the_log_readable(
        plugin: AsyncSchedulePlugin) -> None:
    # given a model whose arguments nest deeper than a session log line may (and not so
    # deep that the framework's own serializer refuses them)
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    model = calls_then_reports(("schedule_create", {"prompt": deep, "after_seconds": 60}),
                               ("schedule_list", {}))
    agent = Agent(model, deps_type=ScheduleDeps, tools=schedule_tools(plugin))

    # when a turn runs it
    result = asyncio.run(run_user_turn(agent, plugin, ScheduleDeps("s1"), "remind me",
                                       history=InMemoryHistory()))

    # then the tool answered its own error, and the turn was recorded with the arguments
    # clipped at the bound in both the model's message and the call
    (refused, refused_content), (listed, listed_content) = json.loads(result.output)
    assert (refused, json.loads(refused_content)["code"]) == ("failed", "invalid_prompt")
    assert (listed, json.loads(listed_content)) == ("success", [])
    events = JsonlStore(plugin.store.root).read("s1").events
    calls = [e.data for e in events if e.type == "tool/call"]
    [asked] = [e.data for e in events if e.type == "assistant/message" and "toolCalls" in e.data]
    for args in (calls[0]["args"], asked["toolCalls"][0]["args"]):
        assert args["after_seconds"] == 60
        assert NESTING_OMITTED in json.dumps(args["prompt"])
    assert [e.type for e in events][-2:] == ["step/end", "turn/end"]


def test_with_test_model_an_error_value_reaches_the_model_as_a_failed_tool_return(
        plugin: AsyncSchedulePlugin) -> None:
    # given Pydantic AI's TestModel, which calls schedule_create with only a prompt
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    agent = Agent(TestModel(call_tools=["schedule_create"]), deps_type=ScheduleDeps,
                  tools=schedule_tools(plugin))

    # when the run is over
    result = asyncio.run(run_user_turn(agent, plugin, ScheduleDeps("s1"), "remind me",
                                       history=InMemoryHistory()))

    # then the tool's ToolFailed reached the model as a ToolReturnPart marked failed,
    # whose content is the error's JSON, as docs/integrations/README.md says
    (returned,) = [p for m in result.all_messages() for p in m.parts
                   if isinstance(p, ToolReturnPart | RetryPromptPart)]
    assert isinstance(returned, ToolReturnPart)
    assert returned.outcome == "failed"
    assert json.loads(str(returned.content))["code"] == "invalid_selector"


def test_the_history_is_a_required_keyword_of_a_user_turn() -> None:
    history = inspect.signature(run_user_turn).parameters["history"]
    assert history.kind is inspect.Parameter.KEYWORD_ONLY
    assert history.default is inspect.Parameter.empty


def test_with_the_lifecycle_on_the_fourth_tool_runs_through_an_agent(
        lifecycle_plugin: AsyncSchedulePlugin, plugin_off: AsyncSchedulePlugin) -> None:
    # given the tools of a plugin with the lifecycle on (and of one without)
    plugin_on = lifecycle_plugin
    tools = schedule_tools(plugin_on)
    definitions = tool_definitions(lifecycle=True)
    assert [t.name for t in tools] == [d.name for d in definitions] == [
        "schedule_create", "schedule_list", "schedule_delete", "schedule_update"]
    assert [t.name for t in schedule_tools(plugin_off)] == [
        "schedule_create", "schedule_list", "schedule_delete"]
    assert tools[3].function_schema.json_schema == definitions[3].input_schema
    assert tools[3].sequential is True

    # when a model pauses a reminder and then names an unknown id
    plugin_on.store.create(SessionHeader(id="s1", createdAt=0))
    asyncio.run(plugin_on.tools.call("s1", "schedule_create",
                                     {"prompt": "water", "every_seconds": 600}))
    model = calls_then_reports(("schedule_update", {"id": "schedule-1", "paused": True}),
                               ("schedule_update", {"id": "schedule-9", "paused": True}))
    agent = Agent(model, deps_type=ScheduleDeps, tools=tools)
    result = asyncio.run(agent.run("pause it", deps=ScheduleDeps("s1")))

    # then both answers are the tool's own, and only the known id was updated
    [[ok, paused], [outcome, unknown]] = json.loads(result.output)
    assert ok == "success" and json.loads(paused)["state"] == "paused"
    assert outcome == "success"
    assert json.loads(unknown) == {"id": "schedule-9", "updated": False,
                                   "code": "schedule_not_found"}
    operations = [e.data["operation"] for e in plugin_on.store.read("s1").events]
    assert operations == ["create", "update"]
