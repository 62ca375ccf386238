"""The Schedule plugin: installs the tools (three; four with the lifecycle) on root agents
created after it loads.

It listens only to later agent-created events, so agents that already existed when it
loaded, and runtime children, never receive Schedule (the load-order boundary).
Its services are injected when it is built: a missing session store or Redis connection
is a composition error, not a tool error later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, Generic, Protocol, TypeVar

import redis

from dsh_schedule import status
from dsh_schedule.host.bridge import HostBridge
from dsh_schedule.host.ondemand import DueLoads, DueUnloaded
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.catalog import ToolDefinition, tool_definitions
from dsh_schedule.shared.core.errors import ScheduleError
from dsh_schedule.shared.core.views import ToolResult
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.transaction import OwedRearms

# Agents disposed of together: a few round trips each, whatever the number of agents.
DISPOSE_BATCH: Final = 1000

log = logging.getLogger(__name__)

ToolHandler = Callable[[Any], ToolResult]


class AgentHandle(Protocol):
    """A live agent as the host shows it to plugins."""

    @property
    def agent_id(self) -> str:
        """The agent's id, which is its root session id."""
        ...

    @property
    def is_root(self) -> bool: ...

    def register_tool(self, definition: ToolDefinition, handler: ToolHandler) -> None:
        """Add a tool to this agent's own tool set (its exact context)."""
        ...


_Handler = TypeVar("_Handler")


class AgentWithTools(Generic[_Handler]):
    """An agent of the bundled hosts, with its own tool set: ``AgentHandle`` with sync
    handlers (``host.reference.Agent``), ``AsyncAgentHandle`` with awaited ones
    (``host.aio.AsyncAgent``)."""

    def __init__(self, agent_id: str, *, is_root: bool = True) -> None:
        self._agent_id = agent_id
        self._is_root = is_root
        self.tools: dict[str, tuple[ToolDefinition, _Handler]] = {}

    @property
    def agent_id(self) -> str:
        return self._agent_id

    @property
    def is_root(self) -> bool:
        return self._is_root

    def register_tool(self, definition: ToolDefinition, handler: _Handler) -> None:
        self.tools[definition.name] = (definition, handler)


class AgentEvents(Protocol):
    def on_agent_created(self, listener: Callable[[AgentHandle], None]) -> Callable[[], None]:
        """Call ``listener`` for every agent created from now on; returns an unsubscribe."""
        ...


class CompositionError(ScheduleError, TypeError):
    """The plugin was built without a service it needs."""


class SchedulePlugin:
    """Installs the tools on later root agents and keeps their leases and followups.

    A host renews the leases with ``renew_leases`` and learns which agents have followups
    from ``bridge.ready`` (pushed; docs/architecture.md#hosts-followups-and-rebuild).
    ``on_due_unloaded(session_id)`` (with ``Settings.wake_unloaded``) loads a session of
    this host group that no host serves when its timer falls due: it creates the session's
    root agent (which installs Schedule); returning ``False`` or raising declines, and
    the host group is asked again after a backoff.
    ``calendar`` offers calendar rules (``schedule_create`` with ``cron``,
    docs/decisions.md#calendar-rules); None takes ``settings.calendar`` (off by default).
    ``lifecycle`` offers ``schedule_update``, the end conditions and the cap per session
    (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders); None takes
    ``settings.lifecycle`` (off by default).
    Every agent is registered the same ``ToolDefinition`` objects (a host copies one before
    changing it).
    """

    def __init__(
        self,
        *,
        store: SessionStore | None,
        coordination: Coordination | None,
        settings: Settings | None,
        clock: Clock | None = None,
        consumer: str | None = None,
        calendar: bool | None = None,
        lifecycle: bool | None = None,
        on_due_unloaded: DueUnloaded | None = None,
    ) -> None:
        if store is None:
            raise CompositionError("the Schedule plugin needs a session store")
        if coordination is None:
            raise CompositionError("the Schedule plugin needs a Redis connection")
        if settings is None:
            raise CompositionError("the Schedule plugin needs its settings")
        if on_due_unloaded is not None and not settings.wake_unloaded:
            raise CompositionError("on_due_unloaded needs wake_unloaded on "
                                   "(DSH_SCHEDULE_WAKE_UNLOADED=on)")
        self.settings = settings
        self._coord = coordination
        # Redis's clock, which every process shares, unless a clock is injected.
        clock = coordination.clock if clock is None else clock
        self._clock = clock
        owed = OwedRearms()  # the re-arms and wakes Redis failed, retried by check_redis
        self.bridge = HostBridge(
            store, coordination, settings, clock=clock, consumer=consumer, owed=owed
        )
        self.tools = ScheduleTools(store, coordination, settings, clock, calendar=calendar,
                                   owed=owed, watch=self.bridge.watchdog.note,
                                   lifecycle=lifecycle)
        self._unsubscribe: Callable[[], None] | None = None
        # One set of definitions for every agent: a fresh copy each cost a host 55 KB per
        # agent (5 GB at 100,000 agents). A host must copy one before changing it.
        self._definitions = tool_definitions(self.tools.calendar, self.tools.lifecycle)
        # With ``on_due_unloaded``: the load requests for this host group's unloaded
        # sessions, answered from ``load`` on (docs/architecture.md#unloaded-sessions).
        self.loads = None if on_due_unloaded is None else DueLoads(
            store, coordination, settings, host=self.bridge.host, clock=clock,
            serves=self.bridge.serves, installing=self.bridge.installing,
            on_due_unloaded=on_due_unloaded)

    def load(self, events: AgentEvents) -> None:
        """Start listening for agents created from now on."""
        self._unsubscribe = events.on_agent_created(self._on_agent_created)
        if self.loads is not None:
            self.loads.start()

    def _on_agent_created(self, agent: AgentHandle) -> None:
        if not agent.is_root:
            return
        for definition in self._definitions:
            handler = partial(self.tools.call, agent.agent_id, definition.name)
            agent.register_tool(definition, handler)
        with log_context(agent=agent.agent_id):
            self.bridge.install(agent.agent_id)
            log.info("installed Schedule on %s", agent.agent_id)

    @property
    def installed(self) -> list[str]:
        """The agents Schedule is installed on and this host serves, in install order."""
        return self.bridge.served

    def renew_leases(self) -> list[str]:
        """Renew this host's lease: one command however many agents it serves
        (``HostBridge.renew``); returns the agents whose lease was new (Redis lost them,
        or the lease had expired), which are woken together and looked at again by
        ``bridge.ready``."""
        renewed = self.bridge.renew()
        metrics.get().pass_done("lease_renewal", time.time())
        return renewed

    def check_redis(self) -> list[str]:
        """What a host's loop runs about once a second (``generation_check_s``): the
        generation marker (``HostBridge.check_generation``: every agent woken at once
        when Redis lost its data), then the re-arms owed since Redis last failed
        (``ScheduleTools.repay_owed``). One command when nothing was lost or owed.
        Returns the agents woken."""
        woken = self.bridge.check_generation()
        return [*woken, *self.tools.repay_owed(), *self.bridge.watchdog.check()]

    def health(self) -> status.Health:
        """Whether reminders can fire for this host's agents now: ``ok`` when the scheduler
        heartbeat is fresh and an rq worker serves this host's queue, with one ``reason``
        line either way, to tell users when reminders cannot fire
        (docs/architecture.md#operations). A few Redis reads; never raises for Redis."""
        try:
            return status.check_health(
                self._coord, self.settings, now_ms=self._clock(), queues=[self.settings.queue]
            )
        except redis.RedisError as exc:
            metrics.get().redis_error()
            return status.Health(ok=False, reason=f"Redis unavailable ({type(exc).__name__})")

    def unload(self, agents: Sequence[str]) -> list[str]:
        """Stop serving these agents and forget them in Redis (logs untouched); with
        ``wake_unloaded`` each keeps the timer of an unloaded session. Returns the agents
        whose lock stayed busy (their lease is left to expire)."""
        left: list[str] = []
        for start in range(0, len(agents), DISPOSE_BATCH):
            left.extend(self.bridge.dispose(agents[start:start + DISPOSE_BATCH]))
        return left

    def dispose(self) -> None:
        """Stop listening and forget every installed agent in Redis; logs are untouched."""
        if self.loads is not None:
            self.loads.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.tools.close()
        # For the agents not disposed of cleanly, this host's lease runs out, and the
        # reconcile pass removes the rest.
        installed = self.installed
        for start in range(0, len(installed), DISPOSE_BATCH):
            batch = installed[start:start + DISPOSE_BATCH]
            try:
                # Waits for each agent's transaction in flight.
                left = self.bridge.dispose(batch)
            except Exception:
                log.warning("could not dispose of %d agent(s) cleanly", len(batch),
                            exc_info=True)
                continue
            for agent in left:
                log.warning("could not dispose of %s cleanly: its lock stayed busy", agent)
