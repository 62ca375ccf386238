"""The embedded runtime: a worker and a scheduler running in this process, as threads, on
an embedded Redis of its own (docs/integrations/README.md#the-embedded-runtime).

For notebooks, tests and single-process apps::

    with dsh_schedule.embedded_runtime() as runtime:
        plugin = runtime.async_plugin()   # or runtime.plugin(), runtime.reference_host()
        ...

The host side is the one of a deployment — the same ``SchedulePlugin`` (or its asyncio
twin), tools, adapters, delivery gate and session logs — and the wakes take the same path:
the scheduler's own pass moves a due wake onto the rq queue, an rq ``SimpleWorker``
(fakeredis state is private to a process, so nothing forks) runs it, and the host
delivers the followup its ready stream names. The parts are those ``EmbeddedSystem``
(``dsh_schedule.embedded``) assembles for every in-process use; this module runs their
passes in two threads. It is asked for by name only: nothing falls back to it
(docs/decisions.md#no-implicit-embedded-redis); a deployment runs Redis, ``dsh-schedule
worker`` and ``dsh-schedule scheduler`` instead, and no other process sees this Redis.

With a ``ManualClock`` the runtime's time moves only when ``advance`` moves it, so a test
creates a reminder, advances time and asserts the delivered message (the ``schedule_runtime``
fixture of ``dsh_schedule.testing`` gives one).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import msgspec

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.aio import AsyncAgent, AsyncAgentRegistry, AsyncSchedulePlugin
from dsh_schedule.host.ondemand import DueLoads
from dsh_schedule.host.plugin import SchedulePlugin
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.views import ToolResult
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.naming import store_from_settings
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)

PASS_S: Final = 0.05  # the pause between two passes of the scheduler and of the worker
SETTLE_S: Final = 10.0  # how long ``settle`` waits for the passes, by default


class ManualClock:
    """An injected clock that stands still until advanced: epoch milliseconds, starting at
    the wall clock's (or ``start_ms``)."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now_ms = wall_clock_ms() if start_ms is None else start_ms
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self._now_ms

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now_ms += round(seconds * 1000)


class EmbeddedRuntime:
    """The worker and the scheduler of one deployment, in this process.

    ``sessions`` is the session directory (default: a temporary one, removed by
    ``close``); ``settings`` the tunables (their ``sessions`` is used when ``sessions``
    is not given; a ``redis_url`` is refused: this runtime has a Redis of its own);
    ``store`` a session store instead of a ``JsonlStore`` on ``sessions``; ``clock`` the
    injected clock of the whole system (a ``ManualClock`` makes ``advance`` work);
    ``rq_log_level`` the level of rq's own loggers (``INFO`` shows its line per job).

    Start it with ``start`` (``embedded_runtime`` does) and end it with ``close``, or use
    it as a context manager; ``close`` disposes of the plugins and hosts it made, stops
    and joins its threads and closes its Redis.
    """

    def __init__(
        self,
        sessions: str | Path | None = None,
        *,
        settings: Settings | None = None,
        store: SessionStore | None = None,
        clock: Clock = wall_clock_ms,
        rq_log_level: str = "WARNING",
    ) -> None:
        if settings is not None and settings.redis_url:
            raise ValueError(
                "the embedded runtime runs on a Redis of its own; for the Redis at "
                "settings.redis_url, run `dsh-schedule worker` and `dsh-schedule scheduler` "
                "and build the plugin on connect(settings.redis_url) "
                "(docs/integrations/README.md#production)"
            )
        self._scratch: Path | None = None
        if sessions is None and settings is None and store is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="dsh-schedule-"))
            sessions = self._scratch / "sessions"
        base = settings if settings is not None else Settings()
        self.settings = base if sessions is None else msgspec.structs.replace(
            base, sessions=Path(sessions), store=None)
        self.store = store if store is not None else store_from_settings(self.settings)
        self.clock = clock
        self.system = EmbeddedSystem(self.store, self.settings, clock=clock, sleep=time.sleep,
                                     injected_clock=True, rq_log_level=rq_log_level)
        self.client = self.system.client
        self.coordination = self.system.coordination
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Held by each pass, and by ``advance`` while time jumps and the leases follow it.
        self._pass_lock = threading.Lock()
        self._passed = threading.Condition()
        self._passes = {"scheduler": 0, "worker": 0}
        self._plugins: list[SchedulePlugin] = []
        # The load requests of the plugins given ``on_due_unloaded`` (None: not given).
        self._loads: list[DueLoads | None] = []
        self._hosts: list[ReferenceHost] = []
        # open_agent's registries, by id() of the plugin they are loaded into (kept alive).
        self._registries: dict[int, tuple[AsyncSchedulePlugin, AsyncAgentRegistry]] = {}
        self._closed = False

    # -- the host side ----------------------------------------------------------------

    def plugin(self, **options: Any) -> SchedulePlugin:
        """A ``SchedulePlugin`` on this runtime (``options``: ``consumer``, ``calendar``)."""
        plugin = SchedulePlugin(store=self.store, coordination=self.coordination,
                                settings=self.settings, clock=self.clock, **options)
        self._plugins.append(plugin)
        self._loads.append(plugin.loads)
        return plugin

    def async_plugin(self, **options: Any) -> AsyncSchedulePlugin:
        """An ``AsyncSchedulePlugin`` on this runtime, for an asyncio host and the framework
        adapters (``options``: ``consumer``, ``calendar``)."""
        plugin = AsyncSchedulePlugin(store=self.store, coordination=self.coordination,
                                     settings=self.settings, clock=self.clock, **options)
        self._plugins.append(plugin.sync)
        self._loads.append(plugin.loads)
        return plugin

    def reference_host(self, **options: Any) -> ReferenceHost:
        """The reference host on this runtime: scripted tool calls (``prompt``) and
        delivery in acknowledged turns (``pump``, ``serve``); ``options``: ``on_delivery``,
        ``consumer``."""
        host = ReferenceHost(self.store, self.coordination, self.settings, clock=self.clock,
                             **options)
        self._hosts.append(host)
        self._plugins.append(host.plugin)
        self._loads.append(host.plugin.loads)
        return host

    def create_session(self, session_id: str, *, time_zone: str | None = None) -> None:
        """Create the session's log (its header) unless it exists."""
        if not self.store.exists(session_id):
            self.store.create(SessionHeader(id=session_id, createdAt=self.clock(),
                                            timeZone=time_zone))

    def call_tool(self, session_id: str, tool: str, arguments: Any) -> ToolResult:
        """Run one Schedule tool call in an existing session without loading it (no agent,
        no lease), as the web console does: a test's way to give a session that no host has
        loaded a reminder."""
        tools = ScheduleTools(self.store, self.coordination, self.settings, self.clock)
        return tools.call(session_id, tool, arguments)

    async def open_agent(self, plugin: AsyncSchedulePlugin, session_id: str, *,
                         time_zone: str | None = None) -> AsyncAgent:
        """The session (created unless it exists) and its root agent, on which ``plugin``
        installs Schedule (the agent holds a lease from then on). The agent comes from an
        ``AsyncAgentRegistry`` this loads into ``plugin`` on first use; a host with an agent
        source of its own loads that instead and creates its agents there."""
        found = self._registries.get(id(plugin))
        if found is None:
            found = self._registries[id(plugin)] = (plugin, AsyncAgentRegistry())
            plugin.load(found[1])
        registry = found[1]
        self.create_session(session_id, time_zone=time_zone)
        return await registry.create(session_id)

    # -- time -------------------------------------------------------------------------

    def advance(self, seconds: float, *, timeout_s: float = SETTLE_S) -> None:
        """Move the ``ManualClock`` on by ``seconds``, renew the leases as the hosts would
        have meanwhile, and ``settle``: every wake due by then has run when this returns,
        and its followup is announced to the host."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError("advance needs the runtime built with clock=ManualClock()")
        with self._pass_lock:
            self.clock.advance(seconds)
            for plugin in self._plugins:
                plugin.renew_leases()
        self.settle(timeout_s=timeout_s)

    def settle(self, *, timeout_s: float = SETTLE_S) -> None:
        """Wait until the scheduler, then the worker, has made a whole pass begun after
        this call: a wake due now has been moved and run. With ``on_due_unloaded`` given
        to a plugin, also until it has answered the load requests of the sessions whose
        reminders fell due, and the passes have run again: the reminders of the sessions it
        loaded are announced too. TimeoutError after ``timeout_s``."""
        for loop in ("scheduler", "worker"):
            self._wait_passes(loop, 2, timeout_s)
        loads = [found for found in self._loads if found is not None]
        if not loads:
            return
        deadline = time.monotonic() + timeout_s
        while not all(found.answered() for found in loads):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the load requests were not answered in {timeout_s:g} s"
                                   " (an asyncio host awaits advance in a thread: "
                                   "asyncio.to_thread(runtime.advance, seconds))")
            time.sleep(PASS_S)
        for loop in ("scheduler", "worker"):
            self._wait_passes(loop, 2, timeout_s)

    def _wait_passes(self, loop: str, passes: int, timeout_s: float) -> None:
        with self._passed:
            target = self._passes[loop] + passes
            if not self._passed.wait_for(lambda: self._passes[loop] >= target, timeout_s):
                raise TimeoutError(f"the embedded {loop} made no pass in {timeout_s:g} s")

    # -- running ----------------------------------------------------------------------

    def start(self) -> EmbeddedRuntime:
        """Start the scheduler and worker threads (once)."""
        if self._threads or self._closed:
            return self
        for name, one_pass in (("scheduler", self.system.scheduler_pass),
                               ("worker", self.system.worker_pass)):
            thread = threading.Thread(target=self._run, args=(name, one_pass),
                                      name=f"dsh-schedule-{name}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def _run(self, name: str, one_pass: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                with self._pass_lock:
                    one_pass()
            except Exception:
                # As the processes do: the loop keeps going, and the next pass tries again.
                log.exception("embedded %s pass failed", name)
            with self._passed:
                self._passes[name] += 1
                self._passed.notify_all()
            self._stop.wait(PASS_S)

    def close(self) -> None:
        """Dispose of the plugins and hosts made here, stop and join the threads, close the
        Redis and remove the temporary session directory (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            for plugin in self._plugins:
                plugin.dispose()
        finally:
            self._stop.set()
            for thread in self._threads:
                thread.join()
            self.client.close()
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> EmbeddedRuntime:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def embedded_runtime(
    sessions: str | Path | None = None,
    *,
    settings: Settings | None = None,
    store: SessionStore | None = None,
    clock: Clock = wall_clock_ms,
    rq_log_level: str = "WARNING",
) -> EmbeddedRuntime:
    """A started ``EmbeddedRuntime`` (its arguments are the runtime's); use it in a ``with``
    block, or ``close`` it."""
    return EmbeddedRuntime(sessions, settings=settings, store=store, clock=clock,
                           rq_log_level=rq_log_level).start()
