"""Schedule in a LangGraph agent, end to end (docs/integrations/README.md).

A person asks a LangGraph agent (``langchain.agents.create_agent``) to remind them in 2
seconds; its model calls ``schedule_create``. When the reminder is due it is delivered into
the session and answered by the model in a new run on the same thread. By default a worker
and a scheduler run in this process (the embedded runtime); with ``--redis URL`` the host
runs on that Redis and starts ``dsh-schedule worker`` and ``scheduler`` beside itself, as a
deployment does. The model is scripted (a LangChain chat model that reads the
conversation), so this runs offline: ``pip install '.[langgraph]'``, then

    python docs/integrations/langgraph_example.py [--redis redis://127.0.0.1:6379/0] [--verbose]

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

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver

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
from dsh_schedule.integrations.langgraph import run_user_turn, schedule_tools, serve_followups
from dsh_schedule.integrations.session import time_context_reading

THREAD = "chat-42"  # the LangGraph thread id is the agent id, i.e. the session id
ZONE = "Europe/Berlin"


class ScriptedChatModel(BaseChatModel):
    """Stands in for a real chat model: asks for a reminder, then answers it."""

    bound: list[dict[str, Any]] = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        # What a real model receives: the catalog's schemas, in the OpenAI format.
        self.bound = [convert_to_openai_tool(tool) for tool in tools]
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Done: {json.loads(last.content)['id']} is set.")
        elif isinstance(last, HumanMessage) and last.text.startswith("[SCHEDULE REMINDER]"):
            prompt = next(json.loads(line.split(": ", 1)[1]) for line in last.text.splitlines()
                          if line.startswith("reminder_prompt_json: "))
            reply = AIMessage(content=f"Reminder: time to {prompt}!")
        else:
            reply = AIMessage(content="", tool_calls=[{
                "id": "call-1", "name": "schedule_create",
                "args": {"prompt": "stretch", "after_seconds": 2},
            }])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def reopening(agents: AsyncAgentRegistry) -> Callable[[str], Awaitable[None]]:
    """``on_due_unloaded``: a closed thread's root agent created again when a reminder
    falls due in it (Schedule installs on it; the reminder is then delivered as usual)."""
    async def reopen(thread: str) -> None:
        print("reopened", thread, "for its reminder")
        await agents.create(thread)

    return reopen


async def converse(plugin: AsyncSchedulePlugin, agents: AsyncAgentRegistry) -> int:
    """The person's turn, then the reminder's: the part a LangGraph host writes."""
    plugin.load(agents)
    plugin.store.create(SessionHeader(id=THREAD, createdAt=wall_clock_ms(), timeZone=ZONE))
    await agents.create(THREAD)  # Schedule installs on the root agent: it holds a lease
    model = ScriptedChatModel()
    graph = create_agent(model, schedule_tools(plugin, THREAD), checkpointer=InMemorySaver())
    try:
        output = await run_user_turn(
            graph, plugin, THREAD, "Remind me in 2 seconds to stretch.",
            rpc_id="rpc-1", client_time_zone=ZONE,
            time_context=time_context_reading(wall_clock_ms(), ZONE),
        )
        print("tools the model was given:", [tool["function"]["name"] for tool in model.bound])
        print("tool result:", next(m.content for m in output["messages"]
                                   if isinstance(m, ToolMessage)))
        print("answer:", output["messages"][-1].content)
        if plugin.loads is not None:  # DSH_SCHEDULE_WAKE_UNLOADED=on
            await plugin.unload([THREAD])  # the thread is closed: no agent, no lease
            print("closed", THREAD)

        stop = asyncio.Event()

        async def answered(thread: str, delivery: Any, result: Any) -> None:
            print("delivered:")
            print(delivery.text)
            print("model answered:", result["messages"][-1].content)
            stop.set()

        try:
            await asyncio.wait_for(serve_followups(graph, plugin, stop, on_answer=answered), 60)
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
                                 prefix=f"lg-{tag}:", queue=f"lg-{tag}")
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
