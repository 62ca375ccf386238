"""The LangGraph adapter in process: tools built from the catalog, the model's arguments
reaching the parser untouched, the thread binding, and a graph run recorded so that the
host contract holds at the tool call (docs/architecture.md#local-times-without-a-zone)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from dsh_schedule.host.aio import AsyncSchedulePlugin
from dsh_schedule.integrations.langgraph import run_user_turn, schedule_tools
from dsh_schedule.integrations.session import time_context_reading
from dsh_schedule.shared.core.catalog import tool_definitions
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.store.codec import NESTING_OMITTED
from dsh_schedule.shared.store.jsonl import JsonlStore

ZONE = "Europe/Berlin"


class CallsThenAnswers(BaseChatModel):
    """Makes the tool calls it is given once, then answers with the tool results."""

    calls: list[dict[str, Any]]
    fail: bool = False

    @property
    def _llm_type(self) -> str:
        return "calls-then-answers"

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        if self.fail:
            raise RuntimeError("the model is down")
        if isinstance(messages[-1], ToolMessage):
            results = [m for m in messages if isinstance(m, ToolMessage)]
            text = json.dumps([[m.status, json.loads(m.content)] for m in results])
            reply = AIMessage(content=text)
        else:
            reply = AIMessage(content="", tool_calls=[
                {"id": f"call-{i}", "name": c["name"], "args": c["args"]}
                for i, c in enumerate(self.calls)])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def graph_for(tools: list[Any], model: BaseChatModel) -> Any:
    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver())


def tomorrow() -> str:
    return (datetime.now(ZoneInfo(ZONE)) + timedelta(days=1)).date().isoformat()


def test_the_tools_carry_the_catalog_schemas(plugin: AsyncSchedulePlugin) -> None:
    tools = schedule_tools(plugin, "s1")
    exported = [convert_to_openai_tool(tool)["function"] for tool in tools]
    definitions = tool_definitions(lifecycle=plugin.tools.lifecycle)
    assert [f["name"] for f in exported] == [d.name for d in definitions]
    for function, definition in zip(exported, definitions, strict=True):
        parameters = dict(function["parameters"])
        parameters.pop("description", None)  # LangChain copies the description in
        assert parameters == definition.input_schema
        assert function["description"] == definition.description


def test_a_call_reaches_the_parser_as_the_model_sent_it(plugin: AsyncSchedulePlugin) -> None:
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    create, listing, _delete, *_update = schedule_tools(plugin, "s1")

    async def scenario() -> tuple[ToolMessage, ToolMessage, ToolMessage]:
        two_selectors = await create.ainvoke({
            "type": "tool_call", "id": "c1", "name": "schedule_create",
            "args": {"prompt": "x", "after_seconds": 60, "every_seconds": None}})
        made = await create.ainvoke({
            "type": "tool_call", "id": "c2", "name": "schedule_create",
            "args": {"prompt": "x", "after_seconds": 60}})
        listed = await listing.ainvoke({
            "type": "tool_call", "id": "c3", "name": "schedule_list", "args": {}})
        return two_selectors, made, listed

    refused, made, listed = asyncio.run(scenario())
    # a selector given as null still counts: LangChain did not drop or fill anything in
    assert refused.status == "error"
    assert json.loads(refused.content)["code"] == "invalid_selector"
    assert made.status == "success"
    assert json.loads(made.content)["id"] == "schedule-1"
    assert [v["id"] for v in json.loads(listed.content)] == ["schedule-1"]


def test_an_unbound_tool_takes_the_thread_of_the_run(plugin: AsyncSchedulePlugin) -> None:
    for session in ("t1", "t2"):
        plugin.store.create(SessionHeader(id=session, createdAt=0))
    create = schedule_tools(plugin)[0]
    call = {"type": "tool_call", "id": "c", "name": "schedule_create",
            "args": {"prompt": "x", "after_seconds": 60}}

    async def scenario() -> list[ToolMessage]:
        return [
            await create.ainvoke(call, {"configurable": {"thread_id": "t2"}}),
            await create.ainvoke(call),
        ]

    in_t2, nowhere = asyncio.run(scenario())
    assert in_t2.status == "success"
    assert [e.type for e in plugin.store.read("t2").events] == ["schedule/change"]
    assert list(plugin.store.read("t1").events) == []
    assert nowhere.status == "error"
    assert "no thread_id" in nowhere.content


@pytest.mark.parametrize("confirmed", [True, False])
def test_a_recorded_run_confirms_a_local_time_only_with_a_reading(
        plugin: AsyncSchedulePlugin, confirmed: bool) -> None:
    # given a session in Berlin and a model that asks for 9:00 tomorrow without a zone
    plugin.store.create(SessionHeader(id="s1", createdAt=0, timeZone=ZONE))
    model = CallsThenAnswers(calls=[{"name": "schedule_create", "args": {
        "prompt": "call the office", "at": {"date": tomorrow(), "time": "09:00:00"}}}])
    graph = graph_for(schedule_tools(plugin, "s1"), model)

    # when a person in Berlin asks, with or without a time-context reading in the turn
    reading = time_context_reading(0, ZONE) if confirmed else None
    output = asyncio.run(run_user_turn(graph, plugin, "s1", "Call the office at 9 tomorrow",
                                       client_time_zone=ZONE, time_context=reading))

    # then the call is accepted only when the recorded turn confirms the zone
    [[status, value]] = json.loads(output["messages"][-1].content)
    if confirmed:
        assert (status, value["kind"]) == ("success", "at")
    else:
        assert (status, value["code"]) == ("error", "timezone_confirmation_required")
        assert value["clientTimeZones"] == []
    kinds = [e.type for e in plugin.store.read("s1").events]
    assert kinds[-2:] == ["step/end", "turn/end"]
    assert kinds.count("tool/result") == 1


def test_a_failed_run_still_ends_its_turn_in_the_log(plugin: AsyncSchedulePlugin) -> None:
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    graph = graph_for(schedule_tools(plugin, "s1"), CallsThenAnswers(calls=[], fail=True))

    with pytest.raises(RuntimeError, match="the model is down"):
        asyncio.run(run_user_turn(graph, plugin, "s1", "hello"))

    kinds = [e.type for e in plugin.store.read("s1").events]
    assert kinds == ["turn/start", "user/message", "step/start", "step/end", "turn/end"]

    # and the turn phase was released: the next turn starts at once
    async def next_turn() -> None:
        async with plugin.bridge.turn("s1", wait_s=0.5):
            pass

    asyncio.run(next_turn())


def test_arguments_nested_too_deep_answer_the_tools_error_and_keep_the_log_readable(
        plugin: AsyncSchedulePlugin) -> None:
    # given a model whose arguments nest deeper than a session log line may (and not so
    # deep that the framework's own checkpoint refuses them)
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    model = CallsThenAnswers(calls=[{"name": "schedule_create",
                                     "args": {"prompt": deep, "after_seconds": 60}}])
    graph = graph_for(schedule_tools(plugin, "s1"), model)

    # when a turn runs it
    output = asyncio.run(run_user_turn(graph, plugin, "s1", "remind me"))

    # then the tool answered its own error, the turn was recorded with the arguments
    # clipped at the bound, and the session still serves every tool
    [[status, value]] = json.loads(output["messages"][-1].content)
    assert (status, value["code"]) == ("error", "invalid_prompt")
    events = JsonlStore(plugin.store.root).read("s1").events
    [call] = [e.data for e in events if e.type == "tool/call"]
    assert call["args"]["after_seconds"] == 60
    assert NESTING_OMITTED in json.dumps(call["args"]["prompt"])
    assert [e.type for e in events][-2:] == ["step/end", "turn/end"]
    listed = asyncio.run(schedule_tools(plugin, "s1")[1].ainvoke({
        "type": "tool_call", "id": "c", "name": "schedule_list", "args": {}}))
    assert (listed.status, json.loads(listed.content)) == ("success", [])


class BindsTools(CallsThenAnswers):
    """``CallsThenAnswers`` for an agent that binds its tools to the model."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> BindsTools:
        return self


def test_an_agent_from_create_agent_runs_the_tools_and_records_the_turn(
        plugin: AsyncSchedulePlugin) -> None:
    # given LangGraph's current agent (langchain.agents.create_agent, which replaces the
    # deprecated create_react_agent) over the Schedule tools; warnings are errors here
    plugin.store.create(SessionHeader(id="s1", createdAt=0))
    model = BindsTools(calls=[{"name": "schedule_create",
                               "args": {"prompt": "stretch", "after_seconds": 60}}])
    graph = create_agent(model, schedule_tools(plugin, "s1"), checkpointer=InMemorySaver())

    # when a person's turn runs it
    output = asyncio.run(run_user_turn(graph, plugin, "s1", "remind me in a minute"))

    # then the tool ran and the turn is recorded step by step
    [[status, value]] = json.loads(output["messages"][-1].content)
    assert (status, value["id"]) == ("success", "schedule-1")
    assert [e.type for e in plugin.store.read("s1").events] == [
        "turn/start", "user/message", "step/start", "assistant/message", "schedule/change",
        "tool/call", "tool/result", "step/end", "step/start", "assistant/message", "step/end",
        "turn/end",
    ]


def test_with_the_lifecycle_on_the_fourth_tool_edits_pauses_and_says_not_found(
        lifecycle_plugin: AsyncSchedulePlugin, plugin_off: AsyncSchedulePlugin) -> None:
    # given a plugin with the lifecycle on (and one without, for the names)
    plugin_on = lifecycle_plugin
    plugin_on.store.create(SessionHeader(id="s1", createdAt=0))
    tools = schedule_tools(plugin_on, "s1")
    definitions = tool_definitions(lifecycle=True)
    assert [t.name for t in tools] == [d.name for d in definitions] == [
        "schedule_create", "schedule_list", "schedule_delete", "schedule_update"]
    assert [t.name for t in schedule_tools(plugin_off, "s1")] == [
        "schedule_create", "schedule_list", "schedule_delete"]
    update = convert_to_openai_tool(tools[3])["function"]
    update["parameters"].pop("description", None)
    assert update["parameters"] == definitions[3].input_schema
    create, _listing, _delete, edit = tools

    # when the model creates a recurring reminder, pauses it, renames it and names an
    # unknown id
    async def scenario() -> list[ToolMessage]:
        answers = []
        for i, (tool, args) in enumerate([
            (create, {"prompt": "water", "every_seconds": 600, "count": 3}),
            (edit, {"id": "schedule-1", "paused": True}),
            (edit, {"id": "schedule-1", "prompt": "water the ferns"}),
            (edit, {"id": "schedule-9", "paused": True}),
        ]):
            answers.append(await tool.ainvoke({"type": "tool_call", "id": f"c{i}",
                                               "name": tool.name, "args": args}))
        return answers

    made, paused, renamed, unknown = asyncio.run(scenario())

    # then each answer is the tool's own, and the log holds one update per change
    assert json.loads(made.content)["count"] == 3
    assert (paused.status, json.loads(paused.content)["state"]) == ("success", "paused")
    renamed_view = json.loads(renamed.content)
    assert (renamed_view["prompt"], renamed_view["state"]) == ("water the ferns", "paused")
    assert json.loads(unknown.content) == {"id": "schedule-9", "updated": False,
                                           "code": "schedule_not_found"}
    operations = [e.data["operation"] for e in plugin_on.store.read("s1").events]
    assert operations == ["create", "update", "update"]
