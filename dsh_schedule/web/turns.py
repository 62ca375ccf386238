"""One user turn of the web console on a session's log (docs/host-integration.md).

A prompt is ``turn/start``, the person's ``user/message`` with the browser's zone as
``clientTimeZone``, a time-context reading, ``step/start``; then the scripted model's tool
calls, and its answer. A form's turn is the same with the person's one tool call in
place of the model's (docs/web.md#acting-from-the-page).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from dsh_schedule.host.reference import TOOL_CALL, TOOL_RESULT, Agent, turn_end
from dsh_schedule.shared.core.events import (
    STEP_START,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
)
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.timesel import is_valid_zone
from dsh_schedule.shared.transaction import retry_fenced
from dsh_schedule.web import model
from dsh_schedule.web.forms import ConsoleError

if TYPE_CHECKING:
    from dsh_schedule.web.console import Console

MAX_PROMPT: Final = 4000  # characters of one prompt
FORM_TOOLS: Final = ("schedule_create", "schedule_delete")  # what the page's forms call
LIFECYCLE_FORM_TOOLS: Final = (*FORM_TOOLS, "schedule_update")  # and with the lifecycle on


def prompt(console: Console, session_id: str, text: str, client_time_zone: str | None
           ) -> str:
    """One user turn: the person's prompt (carrying the browser's zone, when it is one
    Schedule accepts), a time-context reading, the model's tool calls and its answer,
    which is returned."""
    text = text.strip()
    if not text:
        raise ConsoleError("the prompt is empty")
    if len(text) > MAX_PROMPT:
        raise ConsoleError(f"a prompt is at most {MAX_PROMPT} characters")
    return _turn(console, session_id, text, client_time_zone, None)

def act(console: Console, session_id: str, call: model.ToolCall, client_time_zone: str | None
        ) -> str:
    """One user turn in which the person's form, not the model, calls a tool: the
    same handler the model's calls reach, so its answer or error is the tool's own
    (docs/web.md#acting-from-the-page). Returns the readable acknowledgement."""
    offered = LIFECYCLE_FORM_TOOLS if console.settings.lifecycle else FORM_TOOLS
    if call.name not in offered:
        raise ConsoleError(f"the console's forms call {', '.join(offered)}")
    return _turn(console, session_id, f"(console form) {call.name} {_compact(call.args)}",
                 client_time_zone, call)

def _turn(console: Console, session_id: str, text: str, client_time_zone: str | None,
          form_call: model.ToolCall | None) -> str:
    if not console.exists(session_id):
        raise ConsoleError(f"session {session_id!r} does not exist")
    agent = console.open(session_id)
    header = console.store.read(session_id).header
    client_zone = client_time_zone if is_valid_zone(client_time_zone) else None
    reading_zone = header.timeZone or client_zone
    source: dict[str, Any] = {"kind": "user", "rpcId": f"web-{secrets.token_hex(6)}"}
    if client_zone is not None:
        source["clientTimeZone"] = client_zone
    with console.host.plugin.bridge.turn(session_id):
        now = console.clock()

        def opening(turn: int) -> list[NewEvent]:
            return [
                NewEvent(type=TURN_START, time=now, data={"turn": turn}),
                _message(now, text, source),
                _message(now, _reading_text(now, reading_zone), {
                    "kind": "plugin", "plugin": "time-context", "form": "reading",
                    "timeZone": reading_zone, "at": format_instant(now),
                }),
                NewEvent(type=STEP_START, time=now, data={"turn": turn, "step": 0}),
            ]

        turn = _append(console, session_id, opening)
        plan = (model.Plan(calls=(form_call,)) if form_call is not None
                else model.plan(text, now_ms=now, zone=reading_zone,
                                calendar=console.settings.calendar,
                                lifecycle=console.settings.lifecycle))
        answered = [_call(console, session_id, agent, call) for call in plan.calls]
        reply = plan.reply or model.answer(answered, zone=reading_zone)

        def closing(_length: int) -> list[NewEvent]:
            return turn_end(turn, reply, console.clock())

        _append(console, session_id, closing)
        console.store.flush(session_id)
    return reply

def _call(console: Console, session_id: str, agent: Agent, call: model.ToolCall
          ) -> model.Answered:
    """Run one tool call of the model and log it with its answer."""
    _definition, handler = agent.tools[call.name]
    result = handler(call.args)

    def logged(_length: int) -> list[NewEvent]:
        at = console.clock()
        return [
            NewEvent(type=TOOL_CALL, time=at, data={"name": call.name, "args": call.args}),
            NewEvent(type=TOOL_RESULT, time=at,
                     data={"content": result.content, "isError": result.is_error}),
        ]

    _append(console, session_id, logged)
    return model.Answered(call=call, is_error=result.is_error, value=result.value)

def _append(console: Console, session_id: str, build: Callable[[int], list[NewEvent]]) -> int:
    """Append ``build(length)`` at the log's end (the turn is numbered by the seq of
    its ``turn/start``, as the reference host numbers it); returns that length."""

    def attempt(_n: int) -> int:
        length = len(console.store.read(session_id).events)
        console.store.append(session_id, build(length), expected_seq=length)
        return length

    return retry_fenced(f"web append to {session_id}", attempt, attempts=8)



def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _message(now: int, text: str, source: dict[str, Any]) -> NewEvent:
    return NewEvent(type=USER_MESSAGE, time=now,
                    data={"content": [{"type": "text", "text": text}], "source": source})



def _reading_text(now: int, zone: str | None) -> str:
    return f"Current time reading: {model.local_text(now, zone)} ({format_instant(now)})."
