"""The host contract's events, appended to the session log by an asyncio host
(docs/architecture.md#host-event-vocabulary, docs/architecture.md#local-times-without-a-zone).

Before a tool call runs, the log must hold the turn's ``turn/start``, its
``user/message``s (the person's prompt with ``source = {"kind": "user", "rpcId": …,
"clientTimeZone": …}``, and a time-context reading when the host has one) and the current
``step/start``; a turn ends with ``step/end`` and ``turn/end``. ``SessionRecorder`` opens
such turns and ``TurnLog`` writes the rest of one: steps, the assistant's messages and the
tool calls with their results (``assistant/message``, ``tool/call`` and ``tool/result``
are the host's own events, which Schedule ignores). A reminder's turn was opened by the
delivery gate (``turn/start`` and the reminder ``user/message``); ``reminder_turn``
continues it.

Every append runs in a worker thread, at the end of the log, and is retried when another
writer got there first (a fenced append, docs/architecture.md#session-logs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final
from zoneinfo import ZoneInfo

from dsh_schedule.host.aiobridge import settle
from dsh_schedule.host.gate import Delivery
from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.core.events import (
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
)
from dsh_schedule.shared.store.codec import clip_nesting
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import retry_fenced

ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_CALL: Final = "tool/call"
TOOL_RESULT: Final = "tool/result"
APPEND_ATTEMPTS: Final = 8

Events = list[tuple[str, Any]]


def text_content(text: str) -> list[dict[str, str]]:
    """A message's ``content``: one text block."""
    return [{"type": "text", "text": text}]


def user_source(rpc_id: str, client_time_zone: str | None) -> dict[str, str]:
    """The ``source`` of a person's prompt; ``clientTimeZone`` is the zone of the client
    that sent it (left out when the client did not say)."""
    source = {"kind": "user", "rpcId": rpc_id}
    if client_time_zone is not None:
        source["clientTimeZone"] = client_time_zone
    return source


def time_context_reading(now_ms: int, zone: str) -> str:
    """The text of a time-context reading: the local time in ``zone`` (an IANA name)."""
    local = datetime.fromtimestamp(now_ms / 1000, UTC).astimezone(ZoneInfo(zone))
    return f"Local time: {local:%Y-%m-%d %H:%M} ({zone})."


TIME_CONTEXT_SOURCE: Final = {"kind": "plugin", "plugin": "time-context", "form": "reading"}


class SessionRecorder:
    """Appends host-contract events to the session logs of one store."""

    def __init__(self, store: SessionStore, *, clock: Clock = wall_clock_ms) -> None:
        self.store = store
        self.clock = clock

    async def append(self, session: str, build: Callable[[int], Events]) -> int:
        """Append ``build(length)`` at the end of the log (``length`` = its event count
        then), retrying when another writer got there first; returns that length."""
        return await settle(self._append, session, build)

    def _append(self, session: str, build: Callable[[int], Events]) -> int:
        def attempt(_n: int) -> int:
            length = len(self.store.read(session).events)
            now = self.clock()
            events = [NewEvent(type=kind, time=now, data=data) for kind, data in build(length)]
            if events:
                self.store.append(session, events, expected_seq=length)
            return length

        return retry_fenced(f"recording in {session}", attempt, attempts=APPEND_ATTEMPTS)

    async def flush(self, session: str) -> None:
        await settle(self.store.flush, session)

    async def user_turn(
        self,
        session: str,
        text: str,
        *,
        rpc_id: str | None = None,
        client_time_zone: str | None = None,
        time_context: str | None = None,
    ) -> TurnLog:
        """Open a person's turn: ``turn/start``, their ``user/message``, the time-context
        reading when ``time_context`` is given (its text), and ``step/start`` of step 0.
        The turn is numbered by the ``seq`` of its ``turn/start``, as the reference host
        numbers its turns."""
        rpc = rpc_id if rpc_id is not None else f"rpc-{self.clock()}"
        source = user_source(rpc, client_time_zone)

        def opening(turn: int) -> Events:
            events: Events = [
                (TURN_START, {"turn": turn}),
                (USER_MESSAGE, {"content": text_content(text), "source": source}),
            ]
            if time_context is not None:
                events.append((USER_MESSAGE, {"content": text_content(time_context),
                                              "source": dict(TIME_CONTEXT_SOURCE)}))
            events.append((STEP_START, {"turn": turn, "step": 0}))
            return events

        turn = await self.append(session, opening)
        return TurnLog(self, session, turn, step=0)

    def reminder_turn(self, session: str, delivery: Delivery) -> TurnLog:
        """The turn the delivery gate opened for a reminder (``turn/start`` and the
        reminder ``user/message`` are in the log); call ``start_step`` before the model
        runs."""
        return TurnLog(self, session, delivery.turn, step=None)


class TurnLog:
    """The rest of one open turn, appended in order (one append at a time)."""

    def __init__(
        self, recorder: SessionRecorder, session: str, turn: int, *, step: int | None
    ) -> None:
        self.recorder = recorder
        self.session = session
        self.turn = turn
        self.step = step  # the open step, None between steps
        self._last_step = -1 if step is None else step
        self._order = asyncio.Lock()
        self.ended = False

    async def _write(self, events: Events) -> None:
        async with self._order:
            await self.recorder.append(self.session, lambda _length: events)

    async def start_step(self) -> int:
        """End the open step, if any, and start the next one; returns its number."""
        events: Events = []
        if self.step is not None:
            events.append((STEP_END, {"turn": self.turn, "step": self.step}))
        self._last_step += 1
        self.step = self._last_step
        events.append((STEP_START, {"turn": self.turn, "step": self.step}))
        await self._write(events)
        return self.step

    async def assistant(self, text: str, *, tool_calls: Sequence[dict[str, Any]] = ()) -> None:
        """The model's message of the open step (its text, and the tool calls it asked
        for as ``{"id", "name", "args"}``; arguments nested deeper than a log line holds
        are clipped, as in ``tool``)."""
        data: dict[str, Any] = {"content": text_content(text)}
        if tool_calls:
            data["toolCalls"] = list(tool_calls)
        await self._write([(ASSISTANT_MESSAGE, clip_nesting(data))])

    async def tool(
        self, name: str, args: Any, content: str, *, is_error: bool, call_id: str | None = None
    ) -> None:
        """A tool call the open step ran, and its result. The arguments are recorded as
        the model gave them, except that what nests deeper than a log line holds is
        replaced by ``NESTING_OMITTED`` (``codec.clip_nesting``): the call has answered
        already, and its record must not be refused (docs/decisions.md#session-store)."""
        call: dict[str, Any] = {"name": name, "args": args}
        if call_id is not None:
            call["id"] = call_id
        result: dict[str, Any] = {"content": content, "isError": is_error}
        if call_id is not None:
            result["id"] = call_id
        await self._write([(TOOL_CALL, clip_nesting(call)), (TOOL_RESULT, result)])

    async def end(self) -> None:
        """End the open step and the turn, and flush the log."""
        if self.ended:
            return
        events: Events = []
        if self.step is not None:
            events.append((STEP_END, {"turn": self.turn, "step": self.step}))
            self.step = None
        events.append((TURN_END, {"turn": self.turn}))
        await self._write(events)
        self.ended = True
        await self.recorder.flush(self.session)
