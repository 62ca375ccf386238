"""Schedule in a LangGraph agent, end to end (docs/integrations/README.md).

A person asks a LangGraph agent to remind them in 2 seconds; its model calls
``schedule_create``. A ``dsh-schedule worker`` and ``scheduler`` run beside this host, and
when the reminder is due it is delivered into the session and answered by the model in a
new run on the same thread. The model is scripted (a LangChain chat model that reads the
conversation), so this runs offline: ``pip install 'dsh-tool-schedule[langgraph]'``, then

    DSH_SCHEDULE_REDIS_URL=redis://127.0.0.1:6379/0 python docs/integrations/langgraph_example.py

``DSH_SCHEDULE_SESSIONS`` names the session directory (default: a temporary one).
"""

# ruff: noqa: T201 - an example that prints what happens

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from dsh_schedule import Coordination, JsonlStore, SessionHeader, Settings, connect, wall_clock_ms
from dsh_schedule.host.aio import AsyncAgentRegistry, AsyncSchedulePlugin
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


def build_graph(tools: list[Any], model: BaseChatModel) -> Any:
    bound = model.bind_tools(tools)

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=InMemorySaver())  # keeps each thread's history


def start_beside(settings: Settings) -> list[subprocess.Popen[bytes]]:
    """A worker and a scheduler on this host's Redis, sessions and queue."""
    env = dict(os.environ, DSH_SCHEDULE_SESSIONS=str(settings.sessions),
               DSH_SCHEDULE_PREFIX=settings.prefix, DSH_SCHEDULE_QUEUE=settings.queue)
    return [subprocess.Popen([sys.executable, "-m", "dsh_schedule", command], env=env)
            for command in ("worker", "scheduler")]


async def main() -> int:
    sessions = Path(os.environ.get("DSH_SCHEDULE_SESSIONS") or tempfile.mkdtemp())
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(sessions=sessions, prefix=f"lg-{tag}:", queue=f"lg-{tag}")
    if not settings.redis_url:
        sys.exit("set DSH_SCHEDULE_REDIS_URL")
    store = JsonlStore(settings.sessions)
    plugin = AsyncSchedulePlugin(store=store, settings=settings,
                                 coordination=Coordination(connect(settings.redis_url), settings))
    agents = AsyncAgentRegistry()
    plugin.load(agents)
    store.create(SessionHeader(id=THREAD, createdAt=wall_clock_ms(), timeZone=ZONE))
    await agents.create(THREAD)  # Schedule installs on the root agent: it holds a lease

    model = ScriptedChatModel()
    graph = build_graph(schedule_tools(plugin, THREAD), model)
    print("tools:", [tool["function"]["name"] for tool in model.bound])

    processes = start_beside(settings)
    try:
        output = await run_user_turn(
            graph, plugin, THREAD, "Remind me in 2 seconds to stretch.",
            rpc_id="rpc-1", client_time_zone=ZONE,
            time_context=time_context_reading(wall_clock_ms(), ZONE),
        )
        print("tool result:", next(m.content for m in output["messages"]
                                   if isinstance(m, ToolMessage)))
        print("answer:", output["messages"][-1].content)

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
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
