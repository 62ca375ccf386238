"""Durable, session-scoped reminder tools for LLM agents (docs/host-integration.md).

The public host API, importable from here::

    from dsh_schedule import JsonlStore, SchedulePlugin, Settings, connect, openai_tools

Each name is loaded on first use, so ``import dsh_schedule`` alone loads neither Redis
nor rq.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from dsh_schedule.host.aio import (
        AsyncAgent,
        AsyncAgentEvents,
        AsyncAgentHandle,
        AsyncAgentRegistry,
        AsyncSchedulePlugin,
        AsyncToolHandler,
    )
    from dsh_schedule.host.aiobridge import AsyncHostBridge, AsyncScheduleTools
    from dsh_schedule.host.bridge import HostBridge
    from dsh_schedule.host.gate import Delivery
    from dsh_schedule.host.plugin import (
        AgentEvents,
        AgentHandle,
        CompositionError,
        SchedulePlugin,
        ToolHandler,
    )
    from dsh_schedule.host.reference import ReferenceHost
    from dsh_schedule.host.tools import ScheduleTools
    from dsh_schedule.shared.clock import wall_clock_ms
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.coordination.connection import (
        RedisUrlMissing,
        connect,
        connect_embedded,
    )
    from dsh_schedule.shared.core.catalog import (
        ToolDefinition,
        anthropic_tools,
        catalog_json,
        openai_tools,
        tool_definitions,
    )
    from dsh_schedule.shared.core.events import NewEvent, SessionHeader
    from dsh_schedule.shared.core.views import ToolResult
    from dsh_schedule.shared.settings import Settings
    from dsh_schedule.shared.store.jsonl import JsonlStore
    from dsh_schedule.shared.store.memory import MemoryStore
    from dsh_schedule.shared.store.port import SessionStore

    __version__: str

DISTRIBUTION: Final = "dsh-tool-schedule"

# Where each public name lives; the imports above say the same for type checkers.
_HOMES: Final[dict[str, str]] = {
    "SchedulePlugin": "dsh_schedule.host.plugin",
    "CompositionError": "dsh_schedule.host.plugin",
    "AgentHandle": "dsh_schedule.host.plugin",
    "AgentEvents": "dsh_schedule.host.plugin",
    "ToolHandler": "dsh_schedule.host.plugin",
    "ScheduleTools": "dsh_schedule.host.tools",
    "HostBridge": "dsh_schedule.host.bridge",
    "Delivery": "dsh_schedule.host.gate",
    "ReferenceHost": "dsh_schedule.host.reference",
    "JsonlStore": "dsh_schedule.shared.store.jsonl",
    "MemoryStore": "dsh_schedule.shared.store.memory",
    "SessionStore": "dsh_schedule.shared.store.port",
    "SessionHeader": "dsh_schedule.shared.core.events",
    "NewEvent": "dsh_schedule.shared.core.events",
    "Coordination": "dsh_schedule.shared.coordination.agents",
    "connect": "dsh_schedule.shared.coordination.connection",
    "connect_embedded": "dsh_schedule.shared.coordination.connection",
    "RedisUrlMissing": "dsh_schedule.shared.coordination.connection",
    "Settings": "dsh_schedule.shared.settings",
    "ToolDefinition": "dsh_schedule.shared.core.catalog",
    "tool_definitions": "dsh_schedule.shared.core.catalog",
    "catalog_json": "dsh_schedule.shared.core.catalog",
    "openai_tools": "dsh_schedule.shared.core.catalog",
    "anthropic_tools": "dsh_schedule.shared.core.catalog",
    "ToolResult": "dsh_schedule.shared.core.views",
    "wall_clock_ms": "dsh_schedule.shared.clock",
    # The asyncio host API (docs/integrations/README.md), importable from here as well.
    "AsyncSchedulePlugin": "dsh_schedule.host.aio",
    "AsyncScheduleTools": "dsh_schedule.host.aiobridge",
    "AsyncHostBridge": "dsh_schedule.host.aiobridge",
    "AsyncAgent": "dsh_schedule.host.aio",
    "AsyncAgentRegistry": "dsh_schedule.host.aio",
    "AsyncAgentHandle": "dsh_schedule.host.aio",
    "AsyncAgentEvents": "dsh_schedule.host.aio",
    "AsyncToolHandler": "dsh_schedule.host.aio",
}

__all__ = [
    "AgentEvents",
    "AgentHandle",
    "AsyncAgent",
    "AsyncAgentEvents",
    "AsyncAgentHandle",
    "AsyncAgentRegistry",
    "AsyncHostBridge",
    "AsyncSchedulePlugin",
    "AsyncScheduleTools",
    "AsyncToolHandler",
    "CompositionError",
    "Coordination",
    "Delivery",
    "HostBridge",
    "JsonlStore",
    "MemoryStore",
    "NewEvent",
    "RedisUrlMissing",
    "ReferenceHost",
    "SchedulePlugin",
    "ScheduleTools",
    "SessionHeader",
    "SessionStore",
    "Settings",
    "ToolDefinition",
    "ToolHandler",
    "ToolResult",
    "__version__",
    "anthropic_tools",
    "catalog_json",
    "connect",
    "connect_embedded",
    "openai_tools",
    "tool_definitions",
    "wall_clock_ms",
]


def __getattr__(name: str) -> object:
    """Load a public name from its home module on first use (PEP 562)."""
    if name == "__version__":
        value: object = _version()
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
