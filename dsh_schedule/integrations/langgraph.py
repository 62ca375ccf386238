"""Schedule for LangGraph (extra ``[langgraph]``; docs/integrations/README.md).

- ``schedule_tools(plugin, thread_id)``: the tools as LangChain ``StructuredTool``s (the
  three, and ``schedule_update`` when the plugin's lifecycle is on) whose argument
  schemas are the catalog's JSON schemas, bound to the thread id (the
  thread id is the agent id, i.e. the root session id). Without a thread id each call
  takes the ``thread_id`` of the run's ``configurable``. The model's arguments reach the
  tool exactly as it sent them (a JSON-schema tool is not validated by LangChain); an
  error value comes back as the tool message's content with ``status="error"``.
- ``run_user_turn(graph, plugin, thread_id, text, …)``: one person's turn, recorded in
  the session log as the host contract asks (docs/architecture.md#host-event-vocabulary):
  ``turn/start``, the ``user/message`` with ``source = {"kind": "user", "rpcId",
  "clientTimeZone"}`` (and a time-context reading when given), ``step/start`` — all before
  the graph runs — then a step per model call, each tool call with its result, and
  ``step/end`` and ``turn/end`` once the run is over, while the turn phase is held.
- ``answer_reminder`` and ``serve_followups(graph, plugin, stop)``: the followup loop;
  each reminder delivered into the session starts a new run on its thread with the
  reminder text as the user message, recorded the same way.

The graph takes ``{"messages": [HumanMessage(text)]}`` (a ``MessagesState`` graph, such as
one with a ``ToolNode`` over these tools) unless ``make_input`` says otherwise; give it a
checkpointer so that a thread keeps its history between runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, merge_configs
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from dsh_schedule.host.aio import MAX_TURNS, AsyncSchedulePlugin, AsyncScheduleTools
from dsh_schedule.host.gate import Delivery
from dsh_schedule.integrations.session import SessionRecorder, TurnLog
from dsh_schedule.shared.core.catalog import ToolDefinition, tool_definitions

__all__ = [
    "ScheduleRunRecorder",
    "answer_reminder",
    "run_user_turn",
    "schedule_tools",
    "serve_followups",
]

InputFactory = Callable[[str], Any]
AnswerHandler = Callable[[str, Delivery, Any], Awaitable[None]]


class Graph(Protocol):
    """What this module needs of a compiled graph (any LangChain runnable will do)."""

    def ainvoke(self, input: Any, config: RunnableConfig | None = None) -> Awaitable[Any]: ...


def _tools_of(plugin: AsyncSchedulePlugin | AsyncScheduleTools) -> AsyncScheduleTools:
    return plugin.tools if isinstance(plugin, AsyncSchedulePlugin) else plugin


def _thread_of(config: RunnableConfig) -> str:
    thread = (config.get("configurable") or {}).get("thread_id")
    if not isinstance(thread, str) or not thread:
        raise ToolException(
            "this Schedule tool is bound to no thread, and the run names no thread_id"
        )
    return thread


def _schedule_tool(
    tools: AsyncScheduleTools, definition: ToolDefinition, thread_id: str | None
) -> StructuredTool:
    name = definition.name

    async def call(**arguments: Any) -> str:
        agent = thread_id if thread_id is not None else _thread_of(ensure_config())
        result = await tools.call(agent, name, arguments)
        if result.is_error:
            raise ToolException(result.content)  # content as is, status "error"
        return result.content

    return StructuredTool.from_function(
        coroutine=call,
        name=name,
        description=definition.description,
        args_schema=definition.input_schema,
        handle_tool_error=True,
    )


def schedule_tools(
    plugin: AsyncSchedulePlugin | AsyncScheduleTools, thread_id: str | None = None
) -> list[BaseTool]:
    """``schedule_create``, ``schedule_list`` and ``schedule_delete`` (and
    ``schedule_update`` with the lifecycle on) as LangChain tools (async only), bound to
    ``thread_id`` — or, when None, to the ``thread_id`` of each run's ``configurable``."""
    tools = _tools_of(plugin)
    definitions = tool_definitions(tools.calendar, lifecycle=tools.lifecycle)
    return [_schedule_tool(tools, definition, thread_id) for definition in definitions]


class ScheduleRunRecorder(AsyncCallbackHandler):
    """Records a run's model steps, messages and tool calls into an open turn.

    A model call starts a step (the user turn's step 0 is already open when the first
    one starts); the model's answer is an ``assistant/message`` with the tool calls it
    asked for; each finished tool call is a ``tool/call`` and ``tool/result`` pair. Runs
    inline, so each event is in the log before the run goes on, and a failed write fails
    the run.
    """

    raise_error = True
    run_inline = True

    def __init__(self, turn: TurnLog) -> None:
        super().__init__()
        self.turn = turn
        self._models = 0
        self._calls: dict[UUID, tuple[str, Any, str | None]] = {}

    async def _model_starts(self) -> None:
        if self._models > 0 or self.turn.step is None:
            await self.turn.start_step()
        self._models += 1

    async def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        await self._model_starts()

    async def on_llm_start(
        self, serialized: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> None:
        await self._model_starts()

    async def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        for generations in response.generations:
            for generation in generations:
                if isinstance(generation, ChatGeneration):
                    message = generation.message
                    calls = [
                        {"id": call.get("id"), "name": call["name"], "args": call["args"]}
                        for call in getattr(message, "tool_calls", None) or []
                    ]
                    text = str(message.text)
                else:
                    calls, text = [], generation.text
                if text or calls:
                    await self.turn.assistant(text, tool_calls=calls)

    async def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = str(serialized.get("name") or kwargs.get("name") or "tool")
        call_id = kwargs.get("tool_call_id")
        self._calls[run_id] = (name, inputs if inputs is not None else input_str,
                               call_id if isinstance(call_id, str) else None)

    async def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        name, args, call_id = self._calls.pop(run_id, ("tool", None, None))
        if isinstance(output, ToolMessage):
            content = str(output.text)
            is_error = output.status == "error"
            call_id = call_id or output.tool_call_id
        else:
            content, is_error = str(output), False
        await self.turn.tool(name, args, content, is_error=is_error, call_id=call_id)

    async def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        name, args, call_id = self._calls.pop(run_id, ("tool", None, None))
        await self.turn.tool(name, args, f"{type(error).__name__}: {error}", is_error=True,
                             call_id=call_id)


def _messages_input(text: str) -> dict[str, list[BaseMessage]]:
    return {"messages": [HumanMessage(content=text)]}


def _run_config(config: RunnableConfig | None, thread_id: str,
                recorder: ScheduleRunRecorder) -> RunnableConfig:
    own: RunnableConfig = {"callbacks": [recorder], "configurable": {"thread_id": thread_id}}
    return merge_configs(config, own) if config is not None else own


def _recorder(plugin: AsyncSchedulePlugin, recorder: SessionRecorder | None) -> SessionRecorder:
    return recorder if recorder is not None else SessionRecorder(plugin.store,
                                                                 clock=plugin.clock)


async def _run(graph: Graph, turn: TurnLog, text: str, thread_id: str,
               config: RunnableConfig | None, make_input: InputFactory) -> Any:
    try:
        return await graph.ainvoke(
            make_input(text), _run_config(config, thread_id, ScheduleRunRecorder(turn))
        )
    finally:
        await turn.end()  # the turn ends in the log, however the run ended


async def run_user_turn(
    graph: Graph,
    plugin: AsyncSchedulePlugin,
    thread_id: str,
    text: str,
    *,
    rpc_id: str | None = None,
    client_time_zone: str | None = None,
    time_context: str | None = None,
    config: RunnableConfig | None = None,
    make_input: InputFactory = _messages_input,
    recorder: SessionRecorder | None = None,
) -> Any:
    """Run one person's turn on the thread and record it (see the module's docstring);
    returns the graph's output. ``client_time_zone`` is the zone of the person's client;
    ``time_context`` the text of a time-context reading, when the host has one (both
    are what lets a local time without a zone through,
    docs/architecture.md#local-times-without-a-zone)."""
    async with plugin.bridge.turn(thread_id):
        turn = await _recorder(plugin, recorder).user_turn(
            thread_id, text, rpc_id=rpc_id, client_time_zone=client_time_zone,
            time_context=time_context,
        )
        return await _run(graph, turn, text, thread_id, config, make_input)


async def answer_reminder(
    graph: Graph,
    plugin: AsyncSchedulePlugin,
    thread_id: str,
    delivery: Delivery,
    *,
    config: RunnableConfig | None = None,
    make_input: InputFactory = _messages_input,
    recorder: SessionRecorder | None = None,
) -> Any:
    """Run the turn of a reminder the bridge delivered (inside its turn): a new run on
    the thread with the reminder text as the user message; returns the graph's output."""
    turn = _recorder(plugin, recorder).reminder_turn(thread_id, delivery)
    return await _run(graph, turn, delivery.text, thread_id, config, make_input)


async def serve_followups(
    graph: Graph,
    plugin: AsyncSchedulePlugin,
    stop: asyncio.Event,
    *,
    config: RunnableConfig | None = None,
    make_input: InputFactory = _messages_input,
    on_answer: AnswerHandler | None = None,
    poll_s: float = 1.0,
    max_turns: int = MAX_TURNS,
) -> None:
    """The followup loop until ``stop``: ``plugin.serve`` (at most ``max_turns`` agents
    answered at once) with a handler that answers each
    delivered reminder with ``answer_reminder`` (then awaits ``on_answer(thread_id,
    delivery, output)`` when given)."""
    recorder = SessionRecorder(plugin.store, clock=plugin.clock)

    async def deliver(thread_id: str, delivery: Delivery) -> None:
        output = await answer_reminder(graph, plugin, thread_id, delivery, config=config,
                                       make_input=make_input, recorder=recorder)
        if on_answer is not None:
            await on_answer(thread_id, delivery, output)

    await plugin.serve(deliver, stop, poll_s=poll_s, max_turns=max_turns)

