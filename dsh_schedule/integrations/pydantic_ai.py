"""Schedule for Pydantic AI (extra ``[pydantic-ai]``, on ``pydantic-ai-slim``;
docs/integrations/README.md).

- ``schedule_tools(plugin)``: the three tools (and ``schedule_update`` when the plugin's
  lifecycle is on) built with ``Tool.from_schema`` from the
  catalog's JSON schemas. They take the run context and read the agent id (the root
  session id) from the run's dependencies (``ctx.deps.agent_id``, e.g. ``ScheduleDeps``),
  and are ``sequential``: a Schedule call never overlaps another tool call of the step.
  The model's arguments reach the tool as it sent them (a schema tool is not validated by
  Pydantic AI); an error value is a failed tool result: the tool raises ``ToolFailed``,
  and the model receives a ``ToolReturnPart`` whose ``outcome`` is ``"failed"`` and whose
  content is the error's JSON (no retry prompt).
- ``run_user_turn(agent, plugin, deps, text, *, history, …)``: one person's turn, recorded in the
  session log as the host contract asks (docs/architecture.md#host-event-vocabulary):
  ``turn/start``, the ``user/message`` with ``source = {"kind": "user", "rpcId",
  "clientTimeZone"}`` (and a time-context reading when given), ``step/start`` — before the
  agent runs — then a step per model request, the model's messages and each tool call with
  its result, and ``step/end`` and ``turn/end``; the turn phase is held meanwhile.
  ``history`` is required: the thread's messages are loaded from it and saved to it, so
  that the reminder's run sees the conversation (``InMemoryHistory`` in one process).
- ``answer_reminder`` and ``serve_followups(agent, plugin, stop)``: the followup loop; each
  reminder delivered into the session is a new run with the reminder text as the user
  prompt and the thread's message history, recorded the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.agent import AgentRunResult
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ERROR_OUTCOMES,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)

from dsh_schedule.host.aio import MAX_TURNS, AsyncSchedulePlugin, AsyncScheduleTools
from dsh_schedule.host.gate import Delivery
from dsh_schedule.integrations.session import SessionRecorder, TurnLog
from dsh_schedule.shared.core.catalog import ToolDefinition, tool_definitions

__all__ = [
    "HasAgentId",
    "InMemoryHistory",
    "MessageHistory",
    "ScheduleDeps",
    "answer_reminder",
    "run_user_turn",
    "schedule_tools",
    "serve_followups",
]


class HasAgentId(Protocol):
    """Run dependencies that name the agent (its root session id)."""

    @property
    def agent_id(self) -> str: ...


DepsT = TypeVar("DepsT", bound=HasAgentId)
OutputT = TypeVar("OutputT")


@dataclass(frozen=True)
class ScheduleDeps:
    """The least run dependencies the tools need."""

    agent_id: str


class MessageHistory(Protocol):
    """Where a thread's messages are kept between runs."""

    async def load(self, agent_id: str) -> list[ModelMessage]: ...

    async def save(self, agent_id: str, messages: Sequence[ModelMessage]) -> None: ...


class InMemoryHistory:
    """Each thread's messages, in this process's memory."""

    def __init__(self) -> None:
        self.threads: dict[str, list[ModelMessage]] = {}

    async def load(self, agent_id: str) -> list[ModelMessage]:
        return list(self.threads.get(agent_id, []))

    async def save(self, agent_id: str, messages: Sequence[ModelMessage]) -> None:
        self.threads[agent_id] = list(messages)


def _tools_of(plugin: AsyncSchedulePlugin | AsyncScheduleTools) -> AsyncScheduleTools:
    return plugin.tools if isinstance(plugin, AsyncSchedulePlugin) else plugin


def _schedule_tool(tools: AsyncScheduleTools, definition: ToolDefinition) -> Tool[HasAgentId]:
    name = definition.name

    async def call(ctx: RunContext[HasAgentId], **arguments: Any) -> str:
        result = await tools.call(ctx.deps.agent_id, name, arguments)
        if result.is_error:
            raise ToolFailed(result.content)
        return result.content

    return Tool[HasAgentId].from_schema(
        call,
        name=name,
        description=definition.description,
        json_schema=definition.input_schema,
        takes_ctx=True,
        sequential=True,
    )


def schedule_tools(plugin: AsyncSchedulePlugin | AsyncScheduleTools) -> list[Tool[HasAgentId]]:
    """``schedule_create``, ``schedule_list`` and ``schedule_delete`` (and
    ``schedule_update`` with the lifecycle on) as Pydantic AI tools for an agent whose
    dependencies have ``agent_id``."""
    tools = _tools_of(plugin)
    definitions = tool_definitions(tools.calendar, lifecycle=tools.lifecycle)
    return [_schedule_tool(tools, d) for d in definitions]


class _RunLog:
    """Records an agent run's steps into an open turn, node by node."""

    def __init__(self, turn: TurnLog) -> None:
        self.turn = turn
        self._requests = 0
        self._calls: dict[str, ToolCallPart] = {}

    async def model_request(self, request: ModelRequest) -> None:
        """The run is about to ask the model: the tool results it carries are recorded,
        then a step starts (the user turn's step 0 is already open for the first)."""
        await self.tool_results(request)
        if self._requests > 0 or self.turn.step is None:
            await self.turn.start_step()
        self._requests += 1

    async def model_response(self, response: ModelResponse) -> None:
        text = "".join(part.content for part in response.parts if isinstance(part, TextPart))
        calls = [part for part in response.parts if isinstance(part, ToolCallPart)]
        for call in calls:
            self._calls[call.tool_call_id] = call
        if text or calls:
            await self.turn.assistant(text, tool_calls=[
                {"id": call.tool_call_id, "name": call.tool_name, "args": call.args_as_dict()}
                for call in calls
            ])

    async def tool_results(self, message: ModelMessage) -> None:
        if not isinstance(message, ModelRequest):
            return
        for part in message.parts:
            if isinstance(part, ToolReturnPart) and part.tool_call_id in self._calls:
                call = self._calls.pop(part.tool_call_id)
                await self.turn.tool(
                    call.tool_name, call.args_as_dict(),
                    part.model_response_str(wrap_if_error=False),
                    is_error=part.outcome in ERROR_OUTCOMES, call_id=part.tool_call_id,
                )


async def _run(
    agent: Agent[DepsT, OutputT],
    turn: TurnLog,
    text: str,
    deps: DepsT,
    history: MessageHistory,
) -> AgentRunResult[OutputT]:
    log = _RunLog(turn)
    try:
        async with agent.iter(
            text, deps=deps, message_history=await history.load(deps.agent_id)
        ) as run:
            async for node in run:
                if Agent.is_model_request_node(node):
                    await log.model_request(node.request)
                elif Agent.is_call_tools_node(node):
                    await log.model_response(node.model_response)
            result = run.result
            if result is None:
                raise RuntimeError("the agent run ended without a result")
            for message in result.new_messages():  # results of a step the run ended on
                await log.tool_results(message)
        await history.save(deps.agent_id, result.all_messages())
        return result
    finally:
        await turn.end()


def _recorder(plugin: AsyncSchedulePlugin, recorder: SessionRecorder | None) -> SessionRecorder:
    return recorder if recorder is not None else SessionRecorder(plugin.store,
                                                                 clock=plugin.clock)


async def run_user_turn(
    agent: Agent[DepsT, OutputT],
    plugin: AsyncSchedulePlugin,
    deps: DepsT,
    text: str,
    *,
    history: MessageHistory,
    rpc_id: str | None = None,
    client_time_zone: str | None = None,
    time_context: str | None = None,
    recorder: SessionRecorder | None = None,
) -> AgentRunResult[OutputT]:
    """Run one person's turn for ``deps.agent_id`` and record it (see the module's
    docstring). ``client_time_zone`` is the zone of the person's client;
    ``time_context`` the text of a time-context reading, when the host has one (both
    are what lets a local time without a zone through,
    docs/architecture.md#local-times-without-a-zone)."""
    async with plugin.bridge.turn(deps.agent_id):
        turn = await _recorder(plugin, recorder).user_turn(
            deps.agent_id, text, rpc_id=rpc_id, client_time_zone=client_time_zone,
            time_context=time_context,
        )
        return await _run(agent, turn, text, deps, history)


async def answer_reminder(
    agent: Agent[DepsT, OutputT],
    plugin: AsyncSchedulePlugin,
    deps: DepsT,
    delivery: Delivery,
    *,
    history: MessageHistory,
    recorder: SessionRecorder | None = None,
) -> AgentRunResult[OutputT]:
    """Run the turn of a reminder the bridge delivered (inside its turn): the reminder
    text as the user prompt, after the thread's message history."""
    turn = _recorder(plugin, recorder).reminder_turn(deps.agent_id, delivery)
    return await _run(agent, turn, delivery.text, deps, history)


async def serve_followups(
    agent: Agent[DepsT, OutputT],
    plugin: AsyncSchedulePlugin,
    stop: asyncio.Event,
    *,
    deps_for: Callable[[str], DepsT],
    history: MessageHistory,
    on_answer: Callable[[str, Delivery, AgentRunResult[OutputT]], Awaitable[None]] | None = None,
    poll_s: float = 1.0,
    max_turns: int = MAX_TURNS,
) -> None:
    """The followup loop until ``stop``: ``plugin.serve`` (at most ``max_turns`` agents
    answered at once) with a handler that answers each
    delivered reminder with ``answer_reminder`` (``deps_for(agent_id)`` gives the run's
    dependencies), then awaits ``on_answer(agent_id, delivery, result)`` when given."""
    recorder = SessionRecorder(plugin.store, clock=plugin.clock)

    async def deliver(agent_id: str, delivery: Delivery) -> None:
        result = await answer_reminder(agent, plugin, deps_for(agent_id), delivery,
                                       history=history, recorder=recorder)
        if on_answer is not None:
            await on_answer(agent_id, delivery, result)

    await plugin.serve(deliver, stop, poll_s=poll_s, max_turns=max_turns)
