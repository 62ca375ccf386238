"""Recipe: Schedule in the OpenAI Agents SDK, end to end (docs/integrations/README.md).

The three tools are ``FunctionTool``s with the catalog's JSON schemas and **strict mode
off**: the SDK's strict mode would mark every property required, and ``schedule_create``
takes exactly one of ``after_seconds``, ``at`` and ``every_seconds``. The agent id comes
from the run context; run hooks record the steps, the model's messages and the tool
calls in the session log. A person asks for a reminder in 2 seconds; the reminder, once
delivered into the session, is a new run whose input is the conversation so far plus the
reminder as a user message. By default a worker and a scheduler run in this process (the
embedded runtime); with ``--redis URL`` the host runs on that Redis and starts
``dsh-schedule worker`` and ``scheduler`` beside itself, as a deployment does.

The model is scripted through the SDK's own ``Model`` interface, and tracing is off, so
this runs offline: ``pip install '.[recipes]'`` (README.md#install), then

    python docs/integrations/openai_agents_recipe.py [--redis redis://127.0.0.1:6379/0] [--verbose]

``DSH_SCHEDULE_SESSIONS`` names the session directory (default: a temporary one);
``DSH_SCHEDULE_LIFECYCLE=on`` offers the fourth tool, ``schedule_update``.
"""

# ruff: noqa: T201 - an example that prints what happens

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    RunContextWrapper,
    RunHooks,
    Runner,
    Tool,
    Usage,
    set_tracing_disabled,
)
from agents.models.interface import Model
from agents.tool_context import ToolContext
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from dsh_schedule import (
    AsyncAgentRegistry,
    AsyncSchedulePlugin,
    Coordination,
    JsonlStore,
    SessionHeader,
    Settings,
    connect,
    embedded_runtime,
    wall_clock_ms,
)
from dsh_schedule.integrations.session import SessionRecorder, TurnLog, time_context_reading
from dsh_schedule.shared.core.catalog import tool_definitions

SESSION = "chat-42"
ZONE = "Europe/Berlin"
set_tracing_disabled(True)  # offline: no trace export


@dataclass
class HostContext:
    """The run context: which agent (root session) runs, and its open turn."""

    agent_id: str
    turn: TurnLog
    errors: set[str] = field(default_factory=set)  # tool call ids answered with an error


def schedule_function_tools(plugin: AsyncSchedulePlugin) -> list[FunctionTool]:
    def tool(name: str, description: str, schema: dict[str, Any]) -> FunctionTool:
        async def invoke(ctx: ToolContext[HostContext], arguments: str) -> str:
            try:
                args = json.loads(arguments) if arguments else {}
            except json.JSONDecodeError:
                args = arguments  # not an object: the tool answers invalid_selector
            result = await plugin.tools.call(ctx.context.agent_id, name, args)
            if result.is_error:
                ctx.context.errors.add(ctx.tool_call_id)
            return result.content

        return FunctionTool(name=name, description=description, params_json_schema=schema,
                            on_invoke_tool=invoke, strict_json_schema=False)

    offered = tool_definitions(plugin.tools.calendar, lifecycle=plugin.tools.lifecycle)
    return [tool(d.name, d.description, d.input_schema) for d in offered]


class RecordingHooks(RunHooks[HostContext]):
    """Steps, the model's messages and the tool calls of a run, into its open turn."""

    def __init__(self) -> None:
        self.model_calls = 0

    async def on_llm_start(self, context: RunContextWrapper[HostContext], agent: Any,
                           system_prompt: Any, input_items: Any) -> None:
        turn = context.context.turn
        if self.model_calls > 0 or turn.step is None:
            await turn.start_step()
        self.model_calls += 1

    async def on_llm_end(self, context: RunContextWrapper[HostContext], agent: Any,
                         response: ModelResponse) -> None:
        text, calls = "", []
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                text += "".join(c.text for c in item.content if isinstance(c, ResponseOutputText))
            elif isinstance(item, ResponseFunctionToolCall):
                calls.append({"id": item.call_id, "name": item.name,
                              "args": json.loads(item.arguments or "{}")})
        await context.context.turn.assistant(text, tool_calls=calls)

    async def on_tool_end(self, context: RunContextWrapper[HostContext], agent: Any,
                          tool: Tool, result: object) -> None:
        if isinstance(context, ToolContext):
            call_id = context.tool_call_id
            await context.context.turn.tool(
                tool.name, json.loads(context.tool_arguments or "{}"), str(result),
                is_error=call_id in context.context.errors, call_id=call_id)


class ScriptedModel(Model):
    """Stands in for a real model: asks for a reminder, then answers it."""

    def __init__(self) -> None:
        self.tools_seen: list[FunctionTool] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: list[Tool], output_schema: Any, handoffs: Any,
                           tracing: Any, **kwargs: Any) -> ModelResponse:
        self.tools_seen = [t for t in tools if isinstance(t, FunctionTool)]
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        last = items[-1]
        if last.get("type") == "function_call_output":
            return reply(f"Done: {json.loads(last['output'])['id']} is set.")
        content = str(last.get("content", ""))
        if content.startswith("[SCHEDULE REMINDER]"):
            prompt = next(json.loads(line.split(": ", 1)[1]) for line in content.splitlines()
                          if line.startswith("reminder_prompt_json: "))
            return reply(f"Reminder: time to {prompt}!")
        call = ResponseFunctionToolCall(
            type="function_call", call_id="call-1", name="schedule_create",
            arguments=json.dumps({"prompt": "stretch", "after_seconds": 2}))
        return ModelResponse(output=[call], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("this recipe does not stream")


def reply(text: str) -> ModelResponse:
    message = ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])])
    return ModelResponse(output=[message], usage=Usage(), response_id=None)


async def converse(plugin: AsyncSchedulePlugin) -> int:
    """The person's turn, then the reminder's: the part a host writes."""
    agents = AsyncAgentRegistry()
    plugin.load(agents)
    plugin.store.create(SessionHeader(id=SESSION, createdAt=wall_clock_ms(), timeZone=ZONE))
    await agents.create(SESSION)  # Schedule installs on the root agent: it holds a lease
    recorder = SessionRecorder(plugin.store)

    model = ScriptedModel()
    agent = Agent[HostContext](name="assistant", instructions="You keep reminders.",
                               tools=list(schedule_function_tools(plugin)), model=model)
    conversation: list[Any] = []  # the thread's items, carried from run to run

    async def run(turn: TurnLog, text: str) -> str:
        result = await Runner.run(agent, [*conversation, {"role": "user", "content": text}],
                                  context=HostContext(SESSION, turn), hooks=RecordingHooks())
        conversation[:] = result.to_input_list()
        return str(result.final_output)

    try:
        async with plugin.bridge.turn(SESSION):
            text = "Remind me in 2 seconds to stretch."
            turn = await recorder.user_turn(
                SESSION, text, rpc_id="rpc-1", client_time_zone=ZONE,
                time_context=time_context_reading(wall_clock_ms(), ZONE))
            try:
                print("answer:", await run(turn, text))
            finally:
                await turn.end()
        print("tools:", [(t.name, t.strict_json_schema) for t in model.tools_seen])

        stop = asyncio.Event()

        async def deliver(agent_id: str, delivery: Any) -> None:
            turn = recorder.reminder_turn(agent_id, delivery)
            try:
                answer = await run(turn, delivery.text)
            finally:
                await turn.end()
            print("delivered:")
            print(delivery.text)
            print("model answered:", answer)
            stop.set()

        try:
            await asyncio.wait_for(plugin.serve(deliver, stop), 60)
        except TimeoutError:
            print("no reminder arrived within 60 s", file=sys.stderr)
            return 1
        return 0
    finally:
        await plugin.dispose()


# -- where it runs: the embedded runtime, or a Redis with a worker and a scheduler ---------


async def main(args: argparse.Namespace) -> int:
    sessions = Path(os.environ.get("DSH_SCHEDULE_SESSIONS") or tempfile.mkdtemp())
    if args.redis is None:
        rq_level = "INFO" if args.verbose else "WARNING"  # rq's line per job, when asked
        with embedded_runtime(sessions, rq_log_level=rq_level) as runtime:
            return await converse(runtime.async_plugin(lifecycle=Settings.from_env().lifecycle))
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(redis_url=args.redis, sessions=sessions,
                                 prefix=f"oa-{tag}:", queue=f"oa-{tag}")
    plugin = AsyncSchedulePlugin(store=JsonlStore(settings.sessions), settings=settings,
                                 coordination=Coordination(connect(settings.redis_url), settings))
    processes = start_beside(settings, verbose=args.verbose)
    try:
        return await converse(plugin)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


def start_beside(settings: Settings, *, verbose: bool) -> list[subprocess.Popen[bytes]]:
    """A worker and a scheduler on this host's Redis, sessions and queue."""
    env = dict(os.environ, DSH_SCHEDULE_REDIS_URL=str(settings.redis_url),
               DSH_SCHEDULE_SESSIONS=str(settings.sessions), DSH_SCHEDULE_PREFIX=settings.prefix,
               DSH_SCHEDULE_QUEUE=settings.queue,
               DSH_SCHEDULE_LOG_LEVEL="INFO" if verbose else "WARNING")
    return [subprocess.Popen([sys.executable, "-m", "dsh_schedule", command], env=env)
            for command in ("worker", "scheduler")]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--redis", metavar="URL",
                        help="run on this Redis, with a worker and a scheduler started beside "
                             "this host (default: the embedded runtime, in this process)")
    parser.add_argument("--verbose", action="store_true",
                        help="show rq's line per job and the processes' INFO lines")
    return parser.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
