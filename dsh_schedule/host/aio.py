"""The asyncio host API, beside the synchronous one (docs/host-integration.md).

``AsyncSchedulePlugin`` wraps a ``SchedulePlugin`` and keeps every guarantee of the sync
API by running the very same transactions: a tool call, a lease grant, the turn phase, the
delivery gate and every session file read or write run in a worker thread
(``asyncio.to_thread``), never on the event loop. What it adds is the asyncio shape:

- async tool handlers (``AsyncToolHandler``) registered on the agents an
  ``AsyncAgentEvents`` source creates after ``load``;
- ``bridge.turn(agent)``, an async context manager holding the agent's turn phase;
- ``await bridge.ready(timeout_s)``, which waits for announcements on the queue's ready
  stream with a non-blocking ``redis.asyncio`` read (a worker thread when the client is
  the embedded Redis), and ``bridge.deliveries(agent)``, an async iterator of the
  reminders delivered into the session;
- ``plugin.serve(on_delivery, stop)``, the whole followup loop of a host: leases, pushed
  delivery, each reminder in a turn of its own, many agents served at once, Redis outages
  and a full or read-only disk ridden out.

The bridge and the tools live in ``aiobridge.py``, re-exported here.

Cancellation never leaves half a step behind: a step already handed to its thread runs to
its end (a thread cannot be stopped), and only then is the cancellation passed on; a turn
whose entry was cancelled is left again, agents ``ready`` had taken are handed back, and
an async turn always releases the phase it claimed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, Protocol

import redis
import redis.asyncio

from dsh_schedule import status

# Re-exported: every name of the asyncio API is importable from here.
from dsh_schedule.host.aiobridge import AsyncHostBridge as AsyncHostBridge
from dsh_schedule.host.aiobridge import AsyncScheduleTools as AsyncScheduleTools
from dsh_schedule.host.aiobridge import settle
from dsh_schedule.host.bridge import TurnBusy
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.ondemand import DueLoads
from dsh_schedule.host.plugin import (
    AgentHandle,
    AgentWithTools,
    CompositionError,
    SchedulePlugin,
    ToolHandler,
)
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect_async, is_embedded
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.coordination.outage import DiskOutage, Outage, is_outage
from dsh_schedule.shared.core.catalog import ToolDefinition
from dsh_schedule.shared.core.errors import PersistenceError, disk_outage_errno
from dsh_schedule.shared.core.views import ToolResult
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)


AsyncToolHandler = Callable[[Any], Awaitable[ToolResult]]
DeliveryHandler = Callable[[str, Delivery], Awaitable[None]]

BLOCK_S: Final = 1.0  # the longest one wait of ``serve`` for the ready stream
TURN_WAIT_S: Final = 0.1  # how long ``serve`` waits for an agent's turn before moving on
BUSY_RETRY_S: Final = 1.0  # when an agent whose turn or lock was busy is looked at again
MAX_TURNS: Final = 64  # how many agents ``serve`` serves at once, by default


class AsyncAgentHandle(Protocol):
    """A live agent as an asyncio host shows it to plugins."""

    @property
    def agent_id(self) -> str:
        """The agent's id, which is its root session id."""
        ...

    @property
    def is_root(self) -> bool: ...

    def register_tool(self, definition: ToolDefinition, handler: AsyncToolHandler) -> None:
        """Add a tool to this agent's own tool set; the handler is awaited per call."""
        ...


class AsyncAgentEvents(Protocol):
    def on_agent_created(
        self, listener: Callable[[AsyncAgentHandle], Awaitable[None]]
    ) -> Callable[[], None]:
        """Await ``listener`` for every agent created from now on; returns an unsubscribe."""
        ...


class AsyncAgent(AgentWithTools[AsyncToolHandler]):
    """An agent of an asyncio host with its own tool set (``AsyncAgentHandle``)."""


class AsyncAgentRegistry:
    """An ``AsyncAgentEvents`` source: ``await create(agent_id)`` makes an agent and
    awaits every listener on it (so a loaded plugin has installed on a root agent, and
    holds its lease, once ``create`` returns)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[AsyncAgentHandle], Awaitable[None]]] = []

    def on_agent_created(
        self, listener: Callable[[AsyncAgentHandle], Awaitable[None]]
    ) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def create(self, agent_id: str, *, is_root: bool = True) -> AsyncAgent:
        agent = AsyncAgent(agent_id, is_root=is_root)
        for listener in list(self._listeners):
            await listener(agent)
        return agent


class _Relay:
    """The agent-created events the wrapped sync plugin listens to."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[AgentHandle], None]] = []

    def on_agent_created(self, listener: Callable[[AgentHandle], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def publish(self, agent: AgentHandle) -> None:
        for listener in list(self._listeners):
            listener(agent)


def _async_handler(handler: ToolHandler) -> AsyncToolHandler:
    async def call(args: Any) -> ToolResult:
        return await settle(handler, args)

    return call


class AsyncSchedulePlugin:
    """``SchedulePlugin`` for an asyncio host: the same services, the same guarantees.

    ``async_client`` is the ``redis.asyncio`` client ``bridge.ready`` waits with; by
    default one is made from ``settings.redis_url`` (and closed by ``dispose``), except on
    the embedded Redis, where the wait runs in a worker thread. ``calendar`` and
    ``lifecycle`` are the sync plugin's: they offer calendar rules and the lifecycle, None
    takes ``settings.calendar`` and ``settings.lifecycle``.
    """

    def __init__(
        self,
        *,
        store: SessionStore | None,
        coordination: Coordination | None,
        settings: Settings | None,
        clock: Clock | None = None,
        consumer: str | None = None,
        async_client: redis.asyncio.Redis | None = None,
        calendar: bool | None = None,
        lifecycle: bool | None = None,
        on_due_unloaded: Callable[[str], Coroutine[Any, Any, object]] | None = None,
    ) -> None:
        self.sync = SchedulePlugin(
            store=store, coordination=coordination, settings=settings, clock=clock,
            consumer=consumer, calendar=calendar, lifecycle=lifecycle,
        )
        if store is None or coordination is None or settings is None:  # raised above
            raise CompositionError("the Schedule plugin needs its services")
        if on_due_unloaded is not None and not settings.wake_unloaded:
            raise CompositionError("on_due_unloaded needs wake_unloaded on "
                                   "(DSH_SCHEDULE_WAKE_UNLOADED=on)")
        # The load requests, answered by awaiting ``on_due_unloaded`` on the loop that
        # called ``load`` (docs/architecture.md#unloaded-sessions).
        self._on_due_unloaded = on_due_unloaded
        self._loop: asyncio.AbstractEventLoop | None = None
        self.loads = None if on_due_unloaded is None else DueLoads(
            store, coordination, settings, host=self.sync.bridge.host,
            clock=coordination.clock if clock is None else clock,
            serves=self.sync.bridge.serves, installing=self.sync.bridge.installing,
            on_due_unloaded=self._load_on_loop)
        self.settings = settings
        self.coordination = coordination
        self.store = store
        self.clock = coordination.clock if clock is None else clock
        self._own_client = False
        if async_client is None and settings.redis_url and not is_embedded(coordination.client):
            async_client = connect_async(settings.redis_url)
            self._own_client = True
        self._client = async_client
        self.tools = AsyncScheduleTools(self.sync.tools)
        self.bridge = AsyncHostBridge(
            self.sync.bridge, coordination, client=async_client, clock=self.clock
        )
        self._relay = _Relay()
        self.sync.load(self._relay)
        self._unsubscribe: Callable[[], None] | None = None
        self._disk = DiskOutage(log, "async host")

    @property
    def installed(self) -> list[str]:
        return self.sync.installed

    def load(self, events: AsyncAgentEvents) -> None:
        """Start listening for agents created from now on (earlier ones, and children,
        never receive Schedule). With ``on_due_unloaded``, call it on the event loop
        that is to run the callback."""
        self._unsubscribe = events.on_agent_created(self._on_agent_created)
        if self.loads is not None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise CompositionError("with on_due_unloaded, load the plugin from within "
                                       "its event loop") from None
            self.loads.start()

    def _load_on_loop(self, session_id: str) -> object:
        """``on_due_unloaded`` awaited on the plugin's loop, from a load thread."""
        assert self._loop is not None and self._on_due_unloaded is not None
        return asyncio.run_coroutine_threadsafe(
            self._on_due_unloaded(session_id), self._loop).result()

    async def _on_agent_created(self, agent: AsyncAgentHandle) -> None:
        if not agent.is_root:
            return
        # The sync plugin registers its tools on this stand-in, and they are registered
        # on the async agent as async handlers.
        captured: AgentWithTools[ToolHandler] = AgentWithTools(agent.agent_id,
                                                               is_root=agent.is_root)
        try:
            await settle(self._relay.publish, captured)  # registers, then grants the lease
        finally:
            for definition, handler in captured.tools.values():
                agent.register_tool(definition, _async_handler(handler))
            self.bridge.poke()

    async def renew_leases(self) -> list[str]:
        """``SchedulePlugin.renew_leases`` in a thread."""
        try:
            return await settle(self.sync.renew_leases)
        finally:
            self.bridge.poke()

    async def check_redis(self) -> list[str]:
        """``SchedulePlugin.check_redis`` in a thread."""
        try:
            return await settle(self.sync.check_redis)
        finally:
            self.bridge.poke()

    async def unload(self, agents: Sequence[str]) -> list[str]:
        """``SchedulePlugin.unload`` in a thread: a closed thread's agent let go (with
        ``wake_unloaded`` its reminders keep their timers)."""
        return await settle(self.sync.unload, list(agents))

    async def health(self) -> status.Health:
        return await settle(self.sync.health)

    async def dispose(self) -> None:
        """Stop listening, forget every installed agent in Redis (logs untouched), and
        close the async client this plugin made."""
        if self.loads is not None:
            await settle(self.loads.stop)
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        try:
            await settle(self.sync.dispose)
        finally:
            if self._own_client and self._client is not None:
                await self._client.aclose()

    # -- the followup loop ------------------------------------------------------------

    async def serve(
        self, on_delivery: DeliveryHandler, stop: asyncio.Event, *, poll_s: float = BLOCK_S,
        max_turns: int = MAX_TURNS,
    ) -> None:
        """Deliver every installed agent's reminders until ``stop`` is set.

        Renews the host's lease every ``lease_renew_s`` and checks the generation marker
        (and the owed re-arms) every ``generation_check_s``; waits on ``bridge.ready`` (at most
        ``poll_s`` at a time, so ``stop`` is noticed within it); for each agent it names
        that has an entry this host can take, holds its turn and awaits
        ``on_delivery(agent, delivery)`` for each reminder delivered into the session —
        the handler runs the model on ``delivery.text`` and appends the rest of that turn
        (``step/start`` … ``turn/end``, each with ``"turn": delivery.turn``). Agents are
        served concurrently, each in a task of its own, at most ``max_turns`` at a time:
        one agent's slow model turn holds up no other agent, and one agent is never in
        two of them. An agent whose turn or lock is busy is looked at again a second
        later. Once ``stop`` is set, the turns in progress end before ``serve`` returns
        (cancelling ``serve`` cancels them, and each releases its turn). Through a Redis
        outage (``is_outage``: a lost connection, or an error reply such as OOM,
        READONLY or NOREPLICAS) it keeps running, says once that Redis went away and once
        that it is back, then renews every lease first and looks at every agent once more
        (docs/architecture.md#outages); any other Redis error is raised.

        A full or read-only disk (``disk_outage_errno``) is an outage too, said once when
        it starts and once when a write succeeds again. A reminder the gate could not
        append is delivered once the disk takes it. When ``on_delivery`` raises such a
        ``PersistenceError``, the turn stays held and ``on_delivery(agent, delivery)`` is
        awaited again, with backoff, until it returns (so the handler appends from where
        its log stopped) or ``stop`` is set: no delivered turn is left open while
        ``serve`` runs.
        """
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        outage = Outage(log, "async host")
        next_renew = next_check = 0.0
        recheck = False
        serving: dict[str, asyncio.Task[None]] = {}
        named_again: set[str] = set()

        def finished(agent: str, _task: asyncio.Task[None]) -> None:
            serving.pop(agent, None)
            if agent in named_again:  # named while it was being served: look once more
                named_again.discard(agent)
                self.bridge.later([agent], 0.0)

        try:
            while not stop.is_set():
                try:
                    if time.monotonic() >= next_check:
                        await self.check_redis()
                        next_check = time.monotonic() + self.settings.generation_check_s
                    if time.monotonic() >= next_renew:
                        await self.renew_leases()
                        next_renew = time.monotonic() + self.settings.lease_renew_s
                    if recheck:
                        await self.bridge.recheck_all()
                        recheck = False
                    wait_s = min(poll_s,
                                 max(min(next_renew, next_check) - time.monotonic(), 0.0))
                    agents = await self.bridge.ready(wait_s)
                    for index, agent in enumerate(agents):
                        while len(serving) >= max_turns and not stop.is_set():
                            await asyncio.wait(list(serving.values()),
                                               return_when=asyncio.FIRST_COMPLETED)
                        if stop.is_set():
                            self.bridge.later(agents[index:], 0.0)
                            break
                        if agent in serving:
                            named_again.add(agent)
                            continue
                        task = asyncio.create_task(
                            self._serve_task(agent, on_delivery, stop))
                        serving[agent] = task
                        task.add_done_callback(functools.partial(finished, agent))
                except redis.RedisError as exc:
                    if not is_outage(exc):
                        raise
                    next_renew = next_check = 0.0  # both first thing once Redis is back
                    recheck = True
                    try:
                        await asyncio.wait_for(stop.wait(), outage.failed(exc))
                    except TimeoutError:
                        pass
                    continue
                outage.succeeded()
        finally:
            tasks = list(serving.values())
            if not stop.is_set():  # cancelled or failed: end the turns in progress now
                for task in tasks:
                    task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve_task(self, agent: str, on_delivery: DeliveryHandler,
                          stop: asyncio.Event) -> None:
        """One agent's delivery in a task of its own; a Redis outage hands the agent
        back (the loop meets the outage itself)."""
        try:
            with log_context(agent=agent):
                await self._serve_one(agent, on_delivery, stop)
        except redis.RedisError as exc:
            if is_outage(exc):
                log.debug("delivery for %s stopped: Redis unavailable (%s)", agent,
                          type(exc).__name__)
                self.bridge.later([agent], 0.0)
                return
            log.exception("delivering followups for %s failed", agent)
            self.bridge.later([agent], self.settings.followup_stale_s)

    async def _serve_one(self, agent: str, on_delivery: DeliveryHandler,
                         stop: asyncio.Event) -> None:
        bridge = self.bridge
        stale_s = self.settings.followup_stale_s
        if agent not in self.installed or await bridge.waiting(agent) == 0:
            return
        try:
            if not await bridge.has_followup(agent):
                bridge.later([agent], stale_s)  # another consumer holds it, until stale
                return
            async with bridge.turn(agent, wait_s=TURN_WAIT_S):
                async for delivery in bridge.deliveries(agent):
                    if not await self._run_turn(agent, delivery, on_delivery, stop):
                        return
        except (TurnBusy, LockUnavailable):
            bridge.later([agent], BUSY_RETRY_S)
            return
        except Exception as exc:
            if is_outage(exc):
                raise
            if isinstance(exc, PersistenceError) and disk_outage_errno(exc):
                # Nothing of this delivery was appended: it is delivered once the disk
                # takes it.
                bridge.later([agent], self._disk.failed(exc))
                return
            log.exception("delivering followups for %s failed", agent)
            bridge.later([agent], stale_s)
            return
        if await bridge.waiting(agent):
            bridge.later([agent], stale_s)

    async def _run_turn(self, agent: str, delivery: Delivery, on_delivery: DeliveryHandler,
                        stop: asyncio.Event) -> bool:
        """Await ``on_delivery`` for a delivered reminder, again after each disk failure it
        raises (the turn stays held), until it returns: True; False when ``stop`` came
        first (the turn is left open, and said so)."""
        while True:
            try:
                await on_delivery(agent, delivery)
            except PersistenceError as exc:
                if not disk_outage_errno(exc):
                    raise
                delay = self._disk.failed(exc)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    continue
                log.warning("turn %d of %s left open: the disk took no write before the "
                            "host stopped", delivery.turn, agent)
                return False
            self._disk.succeeded()
            return True
