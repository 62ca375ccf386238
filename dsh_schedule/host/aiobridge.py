"""The asyncio host bridge and tools (docs/host-integration.md): ``HostBridge``'s and
``ScheduleTools``' very transactions, each run to its end in a worker thread
(``settle``), with an asyncio wait for the queue's ready stream (``AsyncHostBridge.ready``).
``aio.py`` builds them into ``AsyncSchedulePlugin``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final, TypeVar

import redis.asyncio

from dsh_schedule.host.bridge import HostBridge
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import READY_START
from dsh_schedule.shared.core.views import ToolResult

T = TypeVar("T")

# Without a socket timeout of its own, one blocking read of the ready stream waits at most
# this long before the bridge looks again (a connection that died silently is noticed).
LONGEST_BLOCK_S: Final = 30.0


async def settle(
    function: Callable[..., T], *args: Any, undo: Callable[[T], None] | None = None
) -> T:
    """``function(*args)`` in a worker thread, run to its end even when the caller is
    cancelled meanwhile; the cancellation is passed on afterwards (after ``undo`` of the
    result it would have returned, when given)."""
    task = asyncio.ensure_future(asyncio.to_thread(function, *args))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except BaseException:
            break  # the thread's own exception: task.result() raises it below
    result = task.result()
    if cancelled:
        if undo is not None:
            undo(result)
        raise asyncio.CancelledError
    return result


class AsyncScheduleTools:
    """The three tools with async handlers: each call is the sync transaction, in a thread."""

    def __init__(self, tools: ScheduleTools) -> None:
        self.sync = tools

    @property
    def calendar(self) -> bool:
        """Whether the tools offer calendar rules (the sync tools' switch; off for tools
        built without them, as the adapters' definitions are)."""
        return bool(getattr(self.sync, "calendar", False))

    @property
    def lifecycle(self) -> bool:
        """Whether the tools offer the lifecycle (``schedule_update``; the sync tools'
        switch, off for tools built without it)."""
        return bool(getattr(self.sync, "lifecycle", False))

    async def call(self, agent: str, tool: str, args: Any) -> ToolResult:
        """Run one tool call; every failure becomes a closed-code error value. A call
        cancelled while it runs finishes first: its answer is then lost, never half-done."""
        return await settle(self.sync.call, agent, tool, args)


class AsyncHostBridge:
    """The host bridge for an asyncio host (``HostBridge``'s guarantees, awaited)."""

    def __init__(
        self,
        bridge: HostBridge,
        coordination: Coordination,
        *,
        client: redis.asyncio.Redis | None,
        clock: Clock,
    ) -> None:
        self.sync = bridge
        self._coord = coordination
        self._client = client
        self._clock = clock
        self._poked = asyncio.Event()
        self._checks: list[int] = []  # clock ms of the own checks asked for with ``later``
        self._longest_block_s = LONGEST_BLOCK_S
        if client is not None:
            socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
            if isinstance(socket_timeout, int | float):
                self._longest_block_s = min(LONGEST_BLOCK_S, float(socket_timeout) / 2)

    @property
    def queue(self) -> str:
        return self.sync.queue

    # -- which agents to look at ------------------------------------------------------

    def later(self, agents: Sequence[str], delay_s: float) -> None:
        """Have ``ready`` name these served agents again ``delay_s`` from now."""
        self.sync.later(agents, delay_s)
        self._checks.append(self._clock() + int(delay_s * 1000))
        self.poke()

    async def recheck_all(self) -> None:
        """Have ``ready`` name every served agent once more (after a Redis outage)."""
        await settle(self.sync.recheck_all)
        self.poke()

    async def ready(self, timeout_s: float) -> list[str]:
        """The served agents that may have a followup to deliver, each once (what
        ``HostBridge.ready`` names), waiting up to ``timeout_s`` for the first.

        With a ``redis.asyncio`` client the wait is a blocking ``XREAD`` of the queue's
        ready stream on the event loop, woken early by the end of a turn, an install, a
        renewal or ``later``; the agents are then taken with one non-blocking read of the
        sync bridge in a thread. Agents taken by a call that is cancelled are handed back.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        if self._client is None:
            return await self._take(max(timeout_s, 0.0))
        while True:
            self._poked.clear()
            mark = await self._newest(self._client)
            found = await self._take(0.0)
            remaining = deadline - loop.time()
            if found or remaining <= 0:
                return found
            await self._wait(self._client, mark, min(remaining, self._until_check_s()))

    async def _take(self, block_s: float) -> list[str]:
        return await settle(self.sync.ready, block_s, undo=self._hand_back)

    def _hand_back(self, agents: list[str]) -> None:
        self.sync.later(agents, 0.0)

    async def _newest(self, client: redis.asyncio.Redis) -> str:
        """The id of the newest announcement on the ready stream (where to wait from)."""
        newest: Any = await client.xrevrange(
            self._coord.keys.ready(self.queue), count=1
        )
        if not newest:
            return READY_START
        entry_id = newest[0][0]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def _until_check_s(self) -> float:
        """Seconds until the earliest own check asked for with ``later`` (the others have
        been named by the read that just ran)."""
        now = self._clock()
        self._checks = [at for at in self._checks if at > now]
        if not self._checks:
            return self._longest_block_s
        return min(self._longest_block_s, (min(self._checks) - now) / 1000)

    async def _wait(self, client: redis.asyncio.Redis, mark: str, wait_s: float) -> None:
        """Until an announcement after ``mark``, a poke, or ``wait_s`` seconds."""
        if wait_s <= 0:
            return
        read = asyncio.ensure_future(client.xread(
            {self._coord.keys.ready(self.queue): mark}, count=1,
            block=max(int(wait_s * 1000), 1),
        ))
        poked = asyncio.ensure_future(self._poked.wait())
        try:
            done, _pending = await asyncio.wait(
                {read, poked}, timeout=wait_s + 1.0, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in (read, poked):
                if not waiter.done():
                    waiter.cancel()
            await asyncio.gather(read, poked, return_exceptions=True)
        if read in done and not read.cancelled():
            read.result()  # a Redis error is the caller's to handle

    def poke(self) -> None:
        """Wake a ``ready`` that is waiting: there is a reason to look again now."""
        self._poked.set()

    # -- turns ----------------------------------------------------------------------

    @asynccontextmanager
    async def turn(self, agent: str, *, wait_s: float = 60.0) -> AsyncIterator[str]:
        """Hold the agent's turn phase (``HostBridge.turn``): claimed in a thread, renewed
        in the background, released when the block ends, however it ends. ``TurnBusy``
        when it cannot be claimed within ``wait_s``."""
        held = self.sync.turn(agent, wait_s=wait_s)
        entered: list[str] = []

        def enter() -> str:
            token = held.__enter__()
            entered.append(token)
            return token

        def leave(_token: str) -> None:
            held.__exit__(None, None, None)

        token = await settle(enter, undo=leave)
        try:
            yield token
        finally:
            try:
                await settle(held.__exit__, None, None, None)
            finally:
                self.poke()

    # -- the delivery gate ----------------------------------------------------------

    async def waiting(self, agent: str) -> int:
        """How many followup entries the agent's stream holds."""
        return await settle(self._coord.followups.waiting, agent)

    async def has_followup(self, agent: str) -> bool:
        return await settle(self.sync.has_followup, agent)

    async def deliver_next(self, agent: str) -> Delivery | None:
        """``HostBridge.deliver_next`` in a thread: call it inside ``turn``."""
        return await settle(self.sync.deliver_next, agent)

    async def deliveries(self, agent: str) -> AsyncIterator[Delivery]:
        """Every reminder this host can deliver into the agent's session now, each
        delivered (``turn/start`` and its ``user/message`` appended) as it is asked for;
        iterate inside ``turn``, and finish each reminder's turn before asking for the
        next."""
        while (delivery := await self.deliver_next(agent)) is not None:
            yield delivery
