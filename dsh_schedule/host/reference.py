"""The reference host: a minimal agent runtime that shows how a host wires Schedule in.

It creates root agents (one per session), lets the plugin install on them, marks turns in
the agent phase, runs tool calls inside turns, and consumes reminder followups with a
scripted model that acknowledges each reminder.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis

from dsh_schedule.host.bridge import Delivery
from dsh_schedule.host.plugin import AgentHandle, SchedulePlugin, ToolHandler
from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.outage import Outage
from dsh_schedule.shared.core.catalog import ToolDefinition
from dsh_schedule.shared.core.events import (
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
)
from dsh_schedule.shared.core.views import ToolResult
from dsh_schedule.shared.fencing import retry_fenced
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)

ASSISTANT_MESSAGE = "assistant/message"
TOOL_CALL = "tool/call"
TOOL_RESULT = "tool/result"


class Agent:
    """A root (or child) agent of the reference host, with its own tool set."""

    def __init__(self, agent_id: str, *, is_root: bool = True) -> None:
        self._agent_id = agent_id
        self._is_root = is_root
        self.tools: dict[str, tuple[ToolDefinition, ToolHandler]] = {}

    @property
    def agent_id(self) -> str:
        return self._agent_id

    @property
    def is_root(self) -> bool:
        return self._is_root

    def register_tool(self, definition: ToolDefinition, handler: ToolHandler) -> None:
        self.tools[definition.name] = (definition, handler)


class AgentRegistry:
    """The host's agent-created event source."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[AgentHandle], None]] = []

    def on_agent_created(self, listener: Callable[[AgentHandle], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def publish(self, agent: Agent) -> None:
        for listener in list(self._listeners):
            listener(agent)


class ReferenceHost:
    def __init__(
        self,
        store: SessionStore,
        coordination: Coordination,
        settings: Settings,
        *,
        clock: Clock = wall_clock_ms,
        on_delivery: Callable[[str, Delivery], None] | None = None,
    ) -> None:
        self.store = store
        self.coordination = coordination
        self.settings = settings
        self.clock = clock
        self.registry = AgentRegistry()
        self.plugin = SchedulePlugin(
            store=store, coordination=coordination, settings=settings, clock=clock
        )
        self.plugin.load(self.registry)
        self.agents: dict[str, Agent] = {}
        self._on_delivery = on_delivery

    def open_root(self, session_id: str) -> Agent:
        """Create the root agent of an existing session; the plugin installs on it."""
        agent = Agent(session_id)
        self.agents[session_id] = agent
        self.registry.publish(agent)
        return agent

    # -- user turns -----------------------------------------------------------------

    def prompt(
        self,
        session_id: str,
        text: str,
        *,
        client_time_zone: str | None = None,
        tool_calls: Sequence[tuple[str, dict[str, Any]]] = (),
        time_context: bool = False,
    ) -> list[ToolResult]:
        """One user turn whose scripted model makes ``tool_calls`` and then answers."""
        agent = self.agents[session_id]
        source: dict[str, Any] = {"kind": "user", "rpcId": f"rpc-{self.clock()}"}
        if client_time_zone is not None:
            source["clientTimeZone"] = client_time_zone
        results: list[ToolResult] = []
        with self.plugin.bridge.turn(session_id):
            turn = self._append(session_id, [])
            opening = [NewEvent(type=TURN_START, time=self.clock(), data={"turn": turn}),
                       _user_message(self.clock(), text, source)]
            if time_context:
                opening.append(_time_context_reading(self.clock(), client_time_zone))
            opening.append(NewEvent(type=STEP_START, time=self.clock(),
                                    data={"turn": turn, "step": 0}))
            self._append(session_id, opening)
            for name, args in tool_calls:
                _definition, handler = agent.tools[name]
                result = handler(args)
                results.append(result)
                self._append(session_id, [
                    NewEvent(type=TOOL_CALL, time=self.clock(), data={"name": name, "args": args}),
                    NewEvent(type=TOOL_RESULT, time=self.clock(),
                             data={"content": result.content, "isError": result.is_error}),
                ])
            self._finish_turn(session_id, turn, "Done.")
        return results

    # -- followups ------------------------------------------------------------------

    def pump(self, session_id: str) -> list[Delivery]:
        """Deliver every pending reminder followup, each in its own acknowledged turn."""
        bridge = self.plugin.bridge
        if self.coordination.followups.waiting(session_id) == 0:
            return []
        delivered: list[Delivery] = []
        with bridge.turn(session_id):
            while (delivery := bridge.deliver_next(session_id)) is not None:
                delivered.append(delivery)
                self._finish_turn(session_id, delivery.turn, _acknowledge(delivery))
                if self._on_delivery is not None:
                    self._on_delivery(session_id, delivery)
        return delivered

    def run(self, stop: threading.Event, *, poll_s: float = 0.05) -> None:
        """Serve every opened agent until ``stop``: renew leases, deliver followups.

        Through a Redis outage it keeps running: it says once that Redis went away and
        once that it is back, and renews every lease at once when it is back, so a lease
        Redis lost is granted again and wakes its agent (docs/architecture.md#outages).
        """
        outage = Outage(log, "host")
        next_renew_ms = 0
        while not stop.is_set():
            try:
                if self.clock() >= next_renew_ms:
                    self.plugin.renew_leases()
                    next_renew_ms = self.clock() + int(self.settings.lease_renew_s * 1000)
                self._pump_all()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                next_renew_ms = 0  # renew first thing once Redis is back
                stop.wait(outage.failed(exc))
                continue
            outage.succeeded()
            stop.wait(poll_s)

    def _pump_all(self) -> None:
        for session_id in list(self.agents):
            try:
                self.pump(session_id)
            except (redis.ConnectionError, redis.TimeoutError):
                raise
            except Exception:
                log.exception("delivering followups for %s failed", session_id)

    def close(self) -> None:
        self.plugin.dispose()

    # -- log helpers ----------------------------------------------------------------

    def _finish_turn(self, session_id: str, turn: int, answer: str) -> None:
        now = self.clock()
        self._append(session_id, [
            NewEvent(type=STEP_START, time=now, data={"turn": turn, "step": 1}),
            NewEvent(type=ASSISTANT_MESSAGE, time=now,
                     data={"content": [{"type": "text", "text": answer}]}),
            NewEvent(type=STEP_END, time=now, data={"turn": turn, "step": 1}),
            NewEvent(type=TURN_END, time=now, data={"turn": turn}),
        ])
        self.store.flush(session_id)

    def _append(self, session_id: str, events: list[NewEvent]) -> int:
        """Append at the current end (retrying fence conflicts); returns the old length."""

        def attempt(_n: int) -> int:
            length = len(self.store.read(session_id).events)
            if events:
                self.store.append(session_id, events, expected_seq=length)
            return length

        return retry_fenced(f"host append to {session_id}", attempt, attempts=8)


def _user_message(now: int, text: str, source: dict[str, Any]) -> NewEvent:
    return NewEvent(type=USER_MESSAGE, time=now,
                    data={"content": [{"type": "text", "text": text}], "source": source})


def _time_context_reading(now: int, zone: str | None) -> NewEvent:
    reading = {"kind": "plugin", "plugin": "time-context", "form": "reading"}
    return _user_message(now, f"Current time reading (zone {zone or 'unknown'}).", reading)


def _acknowledge(delivery: Delivery) -> str:
    pairs = [msgspec.to_builtins(p) for p in delivery.pairs]
    return "Acknowledged reminder(s): " + json.dumps(pairs, separators=(",", ":"))
