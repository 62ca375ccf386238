"""Schedule in a Pydantic AI agent, end to end (docs/integrations/README.md).

A person asks a Pydantic AI agent to remind them in 2 seconds; its model calls
``schedule_create``. When the reminder is due it is delivered into the session and answered
by the model in a new run that carries the thread's message history. By default a worker
and a scheduler run in this process (the embedded runtime); with ``--redis URL`` the host
runs on that Redis and starts ``dsh-schedule worker`` and ``scheduler`` beside itself, as a
deployment does. The model is Pydantic AI's own ``FunctionModel`` with a scripted function,
so this runs offline: ``pip install '.[pydantic-ai]'`` (README.md#install), then

    python docs/integrations/pydantic_ai_example.py [--redis redis://127.0.0.1:6379/0] [--verbose]

``DSH_SCHEDULE_SESSIONS`` names the session directory (default: a temporary one);
``DSH_SCHEDULE_LIFECYCLE=on`` offers the fourth tool, ``schedule_update``;
``DSH_SCHEDULE_WAKE_UNLOADED=on`` closes the thread after the person's turn, and the
plugin's ``on_due_unloaded`` opens it again when the reminder falls due.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

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
from dsh_schedule.integrations.pydantic_ai import (
    InMemoryHistory,
    ScheduleDeps,
    run_user_turn,
    schedule_tools,
    serve_followups,
)
from dsh_schedule.integrations.session import time_context_reading

SESSION = "chat-42"  # the agent id, i.e. the root session id, in the run's dependencies
ZONE = "Europe/Berlin"


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Stands in for a real model: asks for a reminder, then answers it."""
    parts = messages[-1].parts if isinstance(messages[-1], ModelRequest) else []
    for part in parts:
        if isinstance(part, ToolReturnPart):
            answer = f"Done: {json.loads(part.content)['id']} is set."
            return ModelResponse(parts=[TextPart(answer)])
        if isinstance(part, UserPromptPart) and str(part.content).startswith("[SCHEDULE"):
            prompt = next(json.loads(line.split(": ", 1)[1])
                          for line in str(part.content).splitlines()
                          if line.startswith("reminder_prompt_json: "))
            return ModelResponse(parts=[TextPart(f"Reminder: time to {prompt}!")])
    return ModelResponse(parts=[ToolCallPart("schedule_create",
                                             {"prompt": "stretch", "after_seconds": 2})])


def reopening(agents: AsyncAgentRegistry) -> Callable[[str], Awaitable[None]]:
    """``on_due_unloaded``: a closed thread's root agent created again when a reminder
    falls due in it (Schedule installs on it; the reminder is then delivered as usual)."""
    async def reopen(thread: str) -> None:
        print("reopened", thread, "for its reminder")
        await agents.create(thread)

    return reopen


async def converse(plugin: AsyncSchedulePlugin, agents: AsyncAgentRegistry) -> int:
    """The person's turn, then the reminder's: the part a host writes."""
    plugin.load(agents)
    plugin.store.create(SessionHeader(id=SESSION, createdAt=wall_clock_ms(), timeZone=ZONE))
    await agents.create(SESSION)  # Schedule installs on the root agent: it holds a lease

    tools = schedule_tools(plugin)  # sequential, agent id from the run's dependencies
    agent = Agent(FunctionModel(scripted_model), deps_type=ScheduleDeps, tools=tools)
    history = InMemoryHistory()  # each thread's messages, carried from run to run
    print("tools:", [tool.name for tool in tools])

    try:
        result = await run_user_turn(
            agent, plugin, ScheduleDeps(SESSION), "Remind me in 2 seconds to stretch.",
            history=history, rpc_id="rpc-1", client_time_zone=ZONE,
            time_context=time_context_reading(wall_clock_ms(), ZONE),
        )
        print("answer:", result.output)
        if plugin.loads is not None:  # DSH_SCHEDULE_WAKE_UNLOADED=on
            await plugin.unload([SESSION])  # the thread is closed: no agent, no lease
            print("closed", SESSION)

        stop = asyncio.Event()

        async def answered(agent_id: str, delivery: Any, reminder: Any) -> None:
            print("delivered:")
            print(delivery.text)
            print("model answered:", reminder.output)
            print("messages in the thread's history:", len(reminder.all_messages()))
            stop.set()

        try:
            await asyncio.wait_for(serve_followups(
                agent, plugin, stop, deps_for=ScheduleDeps, history=history,
                on_answer=answered,
            ), 60)
        except TimeoutError:
            print("no reminder arrived within 60 s", file=sys.stderr)
            return 1
        return 0
    finally:
        await plugin.dispose()


# -- where it runs: the embedded runtime, or a Redis with a worker and a scheduler ---------


async def main(args: argparse.Namespace) -> int:
    sessions = Path(os.environ.get("DSH_SCHEDULE_SESSIONS") or tempfile.mkdtemp())
    agents = AsyncAgentRegistry()  # the host's agents, created by the person and by a reminder
    if args.redis is None:
        rq_level = "INFO" if args.verbose else "WARNING"  # rq's line per job, when asked
        chosen = Settings.from_env()
        reopen = reopening(agents) if chosen.wake_unloaded else None
        with embedded_runtime(sessions, settings=Settings(wake_unloaded=chosen.wake_unloaded),
                              rq_log_level=rq_level) as runtime:
            return await converse(runtime.async_plugin(lifecycle=chosen.lifecycle,
                                                       on_due_unloaded=reopen), agents)
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(redis_url=args.redis, sessions=sessions,
                                 prefix=f"pai-{tag}:", queue=f"pai-{tag}")
    plugin = AsyncSchedulePlugin(store=JsonlStore(settings.sessions), settings=settings,
                                 coordination=Coordination(connect(settings.redis_url), settings),
                                 on_due_unloaded=reopening(agents) if settings.wake_unloaded
                                 else None)
    processes = start_beside(settings, verbose=args.verbose)
    try:
        return await converse(plugin, agents)
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
