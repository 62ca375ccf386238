"""The reference host: a minimal agent runtime that shows how a host wires Schedule in.

It creates root agents (one per session), lets the plugin install on them, marks turns in
the agent phase, runs tool calls inside turns, and consumes reminder followups with a
scripted model that acknowledges each reminder. Its ``run`` loop is pushed to: it blocks on
the bridge's ``ready`` and delivers only for the agents it names, so idle agents cost
nothing between lease renewals (docs/architecture.md#hosts-followups-and-rebuild).

A full or read-only disk is an outage like Redis's (docs/architecture.md#outages): a turn
whose end cannot be appended is kept, and appended before anything else this host does in
that session once the disk takes writes again; until then that agent gets no new turn.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec
import redis

from dsh_schedule.host.bridge import TurnBusy
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.ondemand import IdleSessions
from dsh_schedule.host.plugin import AgentHandle, AgentWithTools, SchedulePlugin, ToolHandler
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.coordination.outage import DiskOutage, Outage, is_outage
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.errors import (
    FenceConflict,
    PersistenceError,
    ScheduleLogError,
    disk_outage_errno,
    outage_said,
)
from dsh_schedule.shared.core.events import (
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
    NewEvent,
)
from dsh_schedule.shared.core.views import ToolResult
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store import many
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import retry_fenced

log = logging.getLogger(__name__)

ASSISTANT_MESSAGE = "assistant/message"
TOOL_CALL = "tool/call"
TOOL_RESULT = "tool/result"

BLOCK_S: Final = 1.0  # the longest one blocking read of the ready stream waits in ``run``
TURN_WAIT_S: Final = 0.1  # how long serving waits for an agent's turn before moving on
TURN_POLL_S: Final = 0.02  # how often it tries a busy turn again meanwhile
# When an agent whose turn or lock was busy is looked at again (the end of a turn of this
# host names it at once anyway).
BUSY_RETRY_S: Final = 1.0


class Agent(AgentWithTools[ToolHandler]):
    """A root (or child) agent of the reference host, with its own tool set."""


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
        clock: Clock | None = None,
        on_delivery: Callable[[str, Delivery], None] | None = None,
        consumer: str | None = None,
        all_sessions: bool = False,
    ) -> None:
        """``consumer`` names this host in the followup streams' consumer group (default:
        a fresh random name); a host restarted under its old name takes back, at once,
        the entries it had read and not acknowledged. ``all_sessions`` (with
        ``settings.wake_unloaded``) serves every session of the store on demand: one is
        loaded when its timer falls due or a prompt comes, and let go after
        ``settings.unload_after_s`` idle."""
        self.store = store
        self.coordination = coordination
        self.settings = settings
        # Redis's clock, which every process shares, unless a clock is injected.
        self.clock = clock = coordination.clock if clock is None else clock
        self.registry = AgentRegistry()
        self.all_sessions = all_sessions
        self._idle = IdleSessions(int(settings.unload_after_s * 1000))
        self.plugin = SchedulePlugin(
            store=store, coordination=coordination, settings=settings, clock=clock,
            consumer=consumer, on_due_unloaded=self._load_due if all_sessions else None,
        )
        self.plugin.load(self.registry)
        self.agents: dict[str, Agent] = {}
        self._on_delivery = on_delivery
        self._disk = DiskOutage(log, "host")
        # Open turns whose end the store has not taken yet: agent -> (turn, answer).
        self._unfinished: dict[str, tuple[int, str]] = {}

    def open_root(self, session_id: str) -> Agent:
        """Create the root agent of an existing session; the plugin installs on it."""
        agent = Agent(session_id)
        self.agents[session_id] = agent
        if self.all_sessions:
            self._idle.used(session_id, self.clock())
        self.registry.publish(agent)
        return agent

    def _load_due(self, session_id: str) -> bool:
        """``on_due_unloaded``: load a session whose timer fell due (a load request)."""
        if session_id not in self.agents:
            self.open_root(session_id)
        return True

    def _due_now(self, session_id: str, now_ms: int) -> bool:
        """Whether something of the session is due and not yet dispatched (its wake is
        on its way): let go now, it would only be asked for again at once."""
        try:
            _session, state = self.store.load(session_id)
        except (PersistenceError, ScheduleLogError):
            return False
        due = next_wake_ms(state, now_ms)
        return due is not None and due <= now_ms

    def unload_idle(self) -> list[str]:
        """Let go of the sessions loaded on demand that were idle ``unload_after_s``; one
        with followups still to deliver, or a turn's end still to append, is kept a while
        longer. Each keeps the timer of an unloaded session. Returns those let go."""
        now = self.clock()
        idle = [s for s in self._idle.idle(now) if s in self.agents]
        if not idle:
            return []
        waiting = self.coordination.followups.waiting_many(idle)
        kept = [s for s, n in zip(idle, waiting, strict=True)
                if n or s in self._unfinished or self._due_now(s, now)]
        for session_id in kept:
            self._idle.used(session_id, now)
        going = [s for s in idle if s not in set(kept)]
        left = set(self.plugin.unload(going))
        for session_id in going:
            self.agents.pop(session_id, None)
            if session_id in left:
                log.warning("could not let %s go cleanly: its lock stayed busy", session_id)
        if going:
            log.info("let %d idle session(s) go", len(going))
        return going

    def open_roots(self, session_ids: Sequence[str]) -> list[Agent]:
        """``open_root`` for many sessions; the wakes their new leases need are enqueued
        together at the end (``HostBridge.installing``)."""
        with self.plugin.bridge.installing():
            return [self.open_root(session_id) for session_id in session_ids]

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
        """One user turn whose scripted model makes ``tool_calls`` and then answers. A
        store failure once the turn is open raises, and its end is appended before
        anything else this host does in the session. Serving every session, a session
        not loaded is loaded first."""
        if self.all_sessions:
            if session_id not in self.agents:
                self.open_root(session_id)
            self._idle.used(session_id, self.clock())
        agent = self.agents[session_id]
        source: dict[str, Any] = {"kind": "user", "rpcId": f"rpc-{self.clock()}"}
        if client_time_zone is not None:
            source["clientTimeZone"] = client_time_zone
        results: list[ToolResult] = []
        with self.plugin.bridge.turn(session_id):
            if (failure := self._finish_unfinished(session_id)) is not None:
                raise failure
            turn = self._append(session_id, [])
            opening = [NewEvent(type=TURN_START, time=self.clock(), data={"turn": turn}),
                       _user_message(self.clock(), text, source)]
            if time_context:
                opening.append(_time_context_reading(self.clock(), client_time_zone))
            opening.append(NewEvent(type=STEP_START, time=self.clock(),
                                    data={"turn": turn, "step": 0}))
            self._append(session_id, opening)
            # From here on the turn is open: whatever fails, its end is owed.
            self._unfinished[session_id] = (turn, "Done.")
            for name, args in tool_calls:
                _definition, handler = agent.tools[name]
                result = handler(args)
                results.append(result)
                self._append(session_id, [
                    NewEvent(type=TOOL_CALL, time=self.clock(), data={"name": name, "args": args}),
                    NewEvent(type=TOOL_RESULT, time=self.clock(),
                             data={"content": result.content, "isError": result.is_error}),
                ])
            if (failure := self._finish_unfinished(session_id)) is not None:
                raise failure
        return results

    # -- followups ------------------------------------------------------------------

    def pump(self, session_id: str, *, wait_s: float = 60.0) -> list[Delivery]:
        """Deliver every pending reminder followup, each in its own acknowledged turn
        (waiting up to ``wait_s`` for the agent's turn: ``TurnBusy`` after that)."""
        if self.coordination.followups.waiting(session_id) == 0:
            return []
        return self._deliver_all(session_id, wait_s)

    def _deliver_all(self, session_id: str, wait_s: float) -> list[Delivery]:
        bridge = self.plugin.bridge
        delivered: list[Delivery] = []
        with bridge.turn(session_id, wait_s=wait_s):
            wrote = session_id in self._unfinished
            failure = self._finish_unfinished(session_id)
            while failure is None and (delivery := bridge.deliver_next(session_id)):
                self._used(session_id)
                delivered.append(delivery)
                if self._on_delivery is not None:
                    self._on_delivery(session_id, delivery)
                failure = self._finish({session_id: delivery}).get(session_id)
        self._wrote({session_id: failure} if failure else {}, wrote=wrote or bool(delivered))
        return delivered

    def _used(self, session_id: str) -> None:
        if self.all_sessions:
            self._idle.used(session_id, self.clock())

    def serve(self, timeout_s: float = 0.0) -> list[tuple[str, Delivery]]:
        """One round of pushed delivery: wait up to ``timeout_s`` for the agents the bridge
        names (``HostBridge.ready``), then deliver their followups, all of them together
        (``HostBridge.turns`` and ``deliver_many``: the round trips to Redis are shared,
        each agent's delivery is its own). An agent whose turn or lock is busy, or whose
        stream keeps entries another consumer holds, is handed back to the bridge to be
        named ``later``."""
        bridge = self.plugin.bridge
        agents = bridge.ready(timeout_s)
        try:
            return self._serve([agent for agent in agents if agent in self.agents])
        except redis.RedisError:
            bridge.later(agents, 0.0)
            raise

    def _serve(self, agents: list[str]) -> list[tuple[str, Delivery]]:
        """Deliver for ``agents`` in their turns, claimed together; a turn that is busy
        (a dispatch still holds the agent for a moment) is tried again every
        ``TURN_POLL_S`` for up to ``TURN_WAIT_S``, then handed back ``later``."""
        bridge = self.plugin.bridge
        delivered: list[tuple[str, Delivery]] = []
        alone: list[str] = []
        deadline = time.monotonic() + TURN_WAIT_S
        # Only agents whose stream holds an entry need a turn (one round trip to know), and
        # those whose last turn's end is still to be appended.
        held_entries = self.coordination.followups.waiting_many(agents) if agents else []
        waiting = [agent for agent, n in zip(agents, held_entries, strict=True)
                   if n or agent in self._unfinished]
        if len(waiting) < len(agents):
            # Named with nothing to deliver (another process's tool call, a stale
            # announcement): the watchdog looks at them once ``repair_after_s`` has passed.
            named = set(waiting)
            bridge.watchdog.watch([agent for agent in agents if agent not in named],
                                  self.clock())
        while waiting:
            with bridge.turns(waiting) as held:
                claimed = set(held)
                busy = [agent for agent in waiting if agent not in claimed]
                alone.extend(self._deliver_in_turns(held, delivered))
            if not busy or time.monotonic() + TURN_POLL_S > deadline:
                bridge.later(busy, BUSY_RETRY_S)
                break
            time.sleep(TURN_POLL_S)
            waiting = busy
        for index, session_id in enumerate(alone):
            try:
                with log_context(agent=session_id):
                    delivered.extend((session_id, d) for d in self._serve_alone(session_id))
            except redis.RedisError:
                bridge.later(alone[index:], 0.0)
                raise
        return delivered

    def _deliver_in_turns(
        self, held: Sequence[str], delivered: list[tuple[str, Delivery]]
    ) -> tuple[str, ...]:
        """Deliver every followup of these agents, whose turns are held, one round of
        ``deliver_many`` at a time, appending to ``delivered``; returns the agents it
        found nothing for (another consumer may hold their entries: looked at alone)."""
        bridge = self.plugin.bridge
        alone: tuple[str, ...] = ()
        closing = [agent for agent in held if agent in self._unfinished]
        unfinished = {agent: failure for agent in closing
                      if (failure := self._finish_unfinished(agent)) is not None}
        self._wrote(unfinished, wrote=len(unfinished) < len(closing))
        pending: Sequence[str] = [agent for agent in held if agent not in unfinished]
        first = True
        while pending:
            found = bridge.deliver_many(pending)
            if first:
                alone = found.empty
                first = False
            bridge.later(found.busy, BUSY_RETRY_S)
            bridge.later(found.failed, self.settings.followup_stale_s)
            failures: dict[str, PersistenceError] = dict(found.unwritable)
            for session_id, delivery in found.delivered.items():
                self._used(session_id)
                delivered.append((session_id, delivery))
                if self._on_delivery is not None:
                    self._on_delivery(session_id, delivery)
            failures.update(self._finish(found.delivered))
            self._wrote(failures, wrote=bool(found.delivered))
            pending = [agent for agent in found.again if agent not in failures]
        return alone

    def _serve_alone(self, session_id: str) -> list[Delivery]:
        bridge = self.plugin.bridge
        followups = self.coordination.followups
        if session_id not in self.agents or followups.waiting(session_id) == 0:
            return []
        try:
            if not bridge.has_followup(session_id):
                # Entries another consumer read and has not acknowledged: this host may
                # take them over once they are stale.
                bridge.later([session_id], self.settings.followup_stale_s)
                return []
            delivered = self._deliver_all(session_id, TURN_WAIT_S)
        except (TurnBusy, LockUnavailable):
            bridge.later([session_id], BUSY_RETRY_S)
            return []
        except Exception as exc:
            if is_outage(exc):
                raise
            if isinstance(exc, PersistenceError) and disk_outage_errno(exc):
                self._wrote({session_id: exc}, wrote=False)
                return []
            log.exception("delivering followups for %s failed", session_id)
            bridge.later([session_id], self.settings.followup_stale_s)
            return []
        if session_id in self._unfinished:
            return delivered  # looked at again once the disk takes its turn's end
        if followups.waiting(session_id):
            bridge.later([session_id], self.settings.followup_stale_s)  # as above
        return delivered

    def run(self, stop: threading.Event, *, poll_s: float = BLOCK_S) -> None:
        """Serve every opened agent until ``stop``: renew leases, deliver followups.

        Between lease renewals the loop sends Redis one blocking read of the ready stream
        at a time (each waits at most ``poll_s``, so ``stop`` is noticed within it) and
        works only on the agents it names; an idle agent costs nothing.

        Through a Redis outage — a lost connection, or an error reply that means "not
        now" (``is_outage``: out of memory, a read-only replica, too few replicas, ...) —
        it keeps running: it says once that Redis went away and once that it is back, and
        checks the generation marker and renews its lease at once when it is back, so
        agents Redis lost are installed again and woken (docs/architecture.md#outages);
        every agent is looked at once more, for announcements made while it could not
        read. About once a second (``generation_check_s``) it checks the marker and wakes
        the agents whose re-arm failed (``SchedulePlugin.check_redis``). Any other Redis error is a
        bug and ends the loop. Through a disk outage it keeps running too (the module's
        docstring).
        """
        outage = Outage(log, "host")
        bridge = self.plugin.bridge
        next_renew_ms = next_check_ms = 0
        recheck = False
        while not stop.is_set():
            try:
                if self.clock() >= next_check_ms:
                    self.plugin.check_redis()
                    if self.all_sessions:
                        self.unload_idle()
                    next_check_ms = self.clock() + int(
                        self.settings.generation_check_s * 1000)
                if self.clock() >= next_renew_ms:
                    self.plugin.renew_leases()
                    next_renew_ms = self.clock() + int(self.settings.lease_renew_s * 1000)
                if recheck:
                    bridge.recheck_all()
                    recheck = False
                until_ms = min(next_renew_ms, next_check_ms) - self.clock()
                self.serve(min(poll_s, max(until_ms, 0) / 1000))
            except redis.RedisError as exc:
                if not is_outage(exc):
                    raise
                next_renew_ms = next_check_ms = 0  # both first thing once Redis is back
                recheck = True
                stop.wait(outage.failed(exc))
                continue
            outage.succeeded()

    def close(self) -> None:
        self.plugin.dispose()

    # -- finishing turns through a disk outage ---------------------------------------

    def _finish(self, deliveries: Mapping[str, Delivery]) -> dict[str, PersistenceError]:
        """Append the ends of delivered turns, together (one round trip where the store
        can: ``many.append``), and flush those appended; the failures, by
        session. An end the store cannot take is kept, to append later
        (``_finish_unfinished``); one whose log moved meanwhile is appended at its end."""
        now = self.clock()
        items = []
        for session_id, delivery in deliveries.items():
            kept = (delivery.turn, _acknowledge(delivery))
            self._unfinished[session_id] = kept
            items.append((session_id, turn_end(*kept, now), delivery.turn + len(delivery.events)))
        written = many.append(self.store, items)
        failures: dict[str, PersistenceError] = {}
        unexpected: list[Exception] = []  # raised once every other end is accounted for
        for session_id in deliveries:
            try:
                failure = self._end_written(session_id, written[session_id])
            except Exception as exc:  # its end stays in ``_unfinished``
                unexpected.append(exc)
                continue
            if failure is not None:
                failures[session_id] = failure
        # Those appended: a failed end stays in ``_unfinished``.
        self._flush([session_id for session_id in deliveries
                     if session_id not in self._unfinished])
        if unexpected:
            raise unexpected[0]
        return failures

    def _end_written(self, session_id: str, result: tuple[Event, ...] | Exception
                     ) -> PersistenceError | None:
        """What became of a turn end ``many.append`` answered for: None once it is
        appended (at the log's end when the log moved); the store's failure, the end kept
        to append first next time; any other error raised, the end kept too."""
        if isinstance(result, FenceConflict):
            return self._finish_unfinished(session_id, flush=False)
        if isinstance(result, PersistenceError):
            return result
        if isinstance(result, Exception):
            raise result
        del self._unfinished[session_id]
        return None

    def _finish_unfinished(self, session_id: str, *,
                           flush: bool = True) -> PersistenceError | None:
        """Append the kept end of the agent's open turn, if any (its turn phase
        held); None once nothing is left open, else the store's failure."""
        kept = self._unfinished.get(session_id)
        if kept is None:
            return None
        try:
            self._append(session_id, turn_end(*kept, self.clock()))
        except PersistenceError as exc:
            return exc  # nothing of it was appended (the store rolls a failed write back)
        del self._unfinished[session_id]
        if flush:
            self._flush([session_id])
        return None

    def _flush(self, session_ids: Sequence[str]) -> None:
        """Flush sessions whose turn ends are appended; a failure is only logged (the
        next flush of the session confirms its turn)."""
        for session_id, exc in many.flush(self.store, session_ids).items():
            log.log(logging.DEBUG if outage_said(exc) else logging.WARNING,
                    "flush after the turn of %s failed: %s", session_id, exc.reason)

    def _wrote(self, failures: dict[str, PersistenceError], *, wrote: bool) -> None:
        """Account for one round of writes: a disk that cannot take them is one line when
        it starts (``DiskOutage``) and one when a round writes again; the agents it failed
        for are looked at again after its backoff (another store failure: after
        ``followup_stale_s``, logged for each)."""
        disk = {agent: exc for agent, exc in failures.items() if disk_outage_errno(exc)}
        for agent, exc in failures.items():
            if agent not in disk:
                log.warning("the turn of %s could not be written: %s", agent, exc.reason)
                self.plugin.bridge.later([agent], self.settings.followup_stale_s)
        if disk:
            self.plugin.bridge.later(disk, self._disk.failed(next(iter(disk.values()))))
        elif wrote and not failures:
            self._disk.succeeded()

    # -- log helpers ----------------------------------------------------------------

    def _append(self, session_id: str, events: list[NewEvent]) -> int:
        """Append at the current end (retrying fence conflicts); returns the old length."""

        def attempt(_n: int) -> int:
            length = len(self.store.read(session_id).events)
            if events:
                self.store.append(session_id, events, expected_seq=length)
            return length

        return retry_fenced(f"host append to {session_id}", attempt, attempts=8)


def turn_end(turn: int, answer: str, now: int) -> list[NewEvent]:
    """The answer and end of a turn (this host's, the console's)."""
    return [
        NewEvent(type=STEP_START, time=now, data={"turn": turn, "step": 1}),
        NewEvent(type=ASSISTANT_MESSAGE, time=now,
                 data={"content": [{"type": "text", "text": answer}]}),
        NewEvent(type=STEP_END, time=now, data={"turn": turn, "step": 1}),
        NewEvent(type=TURN_END, time=now, data={"turn": turn}),
    ]


def _user_message(now: int, text: str, source: dict[str, Any]) -> NewEvent:
    return NewEvent(type=USER_MESSAGE, time=now,
                    data={"content": [{"type": "text", "text": text}], "source": source})


def _time_context_reading(now: int, zone: str | None) -> NewEvent:
    reading = {"kind": "plugin", "plugin": "time-context", "form": "reading"}
    return _user_message(now, f"Current time reading (zone {zone or 'unknown'}).", reading)


def _acknowledge(delivery: Delivery) -> str:
    pairs = [msgspec.to_builtins(p) for p in delivery.pairs]
    return "Acknowledged reminder(s): " + json.dumps(pairs, separators=(",", ":"))
