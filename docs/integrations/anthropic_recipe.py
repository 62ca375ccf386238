"""Recipe: Schedule with the Anthropic SDK's tool-use loop, end to end
(docs/integrations/README.md).

``anthropic_tools()`` gives the three tools in the Messages API format (and
``schedule_update`` as a fourth with ``lifecycle=True``). The loop sends the
conversation, runs each ``tool_use`` block through the tools, answers with
``tool_result`` blocks (``is_error`` for an error value) and goes on until the model stops
asking for tools; every step, message and tool call is recorded in the session log. A
delivered reminder is appended to the conversation as a user turn and answered the same
way. By default a worker and a scheduler run in this process (the embedded runtime); with
``--redis URL`` the host runs on that Redis and starts ``dsh-schedule worker`` and
``scheduler`` beside itself, as a deployment does.

The SDK's own ``AsyncAnthropic`` client is used, over a mock HTTP transport whose handler
scripts the model's replies, so this runs offline: ``pip install '.[recipes]'``
(README.md#install), then

    python docs/integrations/anthropic_recipe.py [--redis redis://127.0.0.1:6379/0] [--verbose]

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
from pathlib import Path
from typing import Any

import httpx2  # the HTTP library the Anthropic SDK is built on
from anthropic import AsyncAnthropic

from dsh_schedule import (
    AsyncAgentRegistry,
    AsyncSchedulePlugin,
    Coordination,
    JsonlStore,
    SessionHeader,
    Settings,
    anthropic_tools,
    connect,
    embedded_runtime,
    wall_clock_ms,
)
from dsh_schedule.integrations.session import SessionRecorder, TurnLog, time_context_reading

SESSION = "chat-42"
ZONE = "Europe/Berlin"
MODEL = "claude-scripted"


def scripted_model(request: httpx2.Request) -> httpx2.Response:
    """Stands in for the Messages API: asks for a reminder, then answers it."""
    body = json.loads(request.content)
    names = [tool["name"] for tool in body["tools"]]
    if names not in ([t["name"] for t in anthropic_tools(lifecycle=on)] for on in (False, True)):
        return httpx2.Response(400, json={"type": "error", "error": {
            "type": "invalid_request_error", "message": "unexpected tools"}})
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and last[0].get("type") == "tool_result":
        result = json.loads(last[0]["content"])
        content, stop = [{"type": "text", "text": f"Done: {result['id']} is set."}], "end_turn"
    elif isinstance(last, str) and last.startswith("[SCHEDULE REMINDER]"):
        prompt = next(json.loads(line.split(": ", 1)[1]) for line in last.splitlines()
                      if line.startswith("reminder_prompt_json: "))
        content, stop = [{"type": "text", "text": f"Reminder: time to {prompt}!"}], "end_turn"
    else:
        content = [{"type": "tool_use", "id": "toolu_1", "name": "schedule_create",
                    "input": {"prompt": "stretch", "after_seconds": 2}}]
        stop = "tool_use"
    return httpx2.Response(200, json={
        "id": f"msg_{uuid.uuid4().hex[:8]}", "type": "message", "role": "assistant",
        "model": body["model"], "content": content, "stop_reason": stop,
        "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
    })


class ToolUseLoop:
    """One thread's conversation with the model, run turn by turn."""

    def __init__(self, client: AsyncAnthropic, plugin: AsyncSchedulePlugin,
                 agent_id: str) -> None:
        self.client = client
        self.plugin = plugin
        self.agent_id = agent_id
        self.messages: list[dict[str, Any]] = []
        tools = plugin.tools
        self.tools = anthropic_tools(tools.calendar, lifecycle=tools.lifecycle)

    async def run(self, turn: TurnLog, user_text: str) -> str:
        """Append the user turn, then call the model until it stops asking for tools."""
        self.messages.append({"role": "user", "content": user_text})
        calls = 0
        while True:
            if calls > 0 or turn.step is None:  # a user turn's step 0 is open already
                await turn.start_step()
            calls += 1
            response = await self.client.messages.create(
                model=MODEL, max_tokens=1024, tools=self.tools, messages=self.messages)
            self.messages.append({"role": "assistant",
                                  "content": [block.model_dump() for block in response.content]})
            answer = "".join(block.text for block in response.content if block.type == "text")
            uses = [block for block in response.content if block.type == "tool_use"]
            await turn.assistant(answer, tool_calls=[
                {"id": use.id, "name": use.name, "args": use.input} for use in uses])
            if response.stop_reason != "tool_use":
                return answer
            results = []
            for use in uses:
                result = await self.plugin.tools.call(self.agent_id, use.name, use.input)
                await turn.tool(use.name, use.input, result.content, is_error=result.is_error,
                                call_id=use.id)
                results.append({"type": "tool_result", "tool_use_id": use.id,
                                "content": result.content, "is_error": result.is_error})
            self.messages.append({"role": "user", "content": results})


async def converse(plugin: AsyncSchedulePlugin) -> int:
    """The person's turn, then the reminder's: the part a host writes."""
    agents = AsyncAgentRegistry()
    plugin.load(agents)
    plugin.store.create(SessionHeader(id=SESSION, createdAt=wall_clock_ms(), timeZone=ZONE))
    await agents.create(SESSION)  # Schedule installs on the root agent: it holds a lease
    recorder = SessionRecorder(plugin.store)

    client = AsyncAnthropic(
        api_key="offline", base_url="http://model.invalid", max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(scripted_model)),
    )
    loop = ToolUseLoop(client, plugin, SESSION)
    print("tools:", [tool["name"] for tool in loop.tools])

    try:
        async with plugin.bridge.turn(SESSION):
            text = "Remind me in 2 seconds to stretch."
            turn = await recorder.user_turn(
                SESSION, text, rpc_id="rpc-1", client_time_zone=ZONE,
                time_context=time_context_reading(wall_clock_ms(), ZONE))
            try:
                print("answer:", await loop.run(turn, text))
            finally:
                await turn.end()

        stop = asyncio.Event()

        async def deliver(agent_id: str, delivery: Any) -> None:
            turn = recorder.reminder_turn(agent_id, delivery)
            try:  # the reminder is the next user turn of the conversation
                answer = await loop.run(turn, delivery.text)
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
        await client.close()
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
                                 prefix=f"an-{tag}:", queue=f"an-{tag}")
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
