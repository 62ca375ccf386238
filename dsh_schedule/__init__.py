"""Durable, session-scoped reminder tools for LLM agents (docs/host-integration.md).

The public host API, importable from here::

    from dsh_schedule import JsonlStore, SchedulePlugin, Settings, connect, openai_tools

Each name is loaded on first use, so ``import dsh_schedule`` alone loads neither Redis
nor rq. The type checkers' imports below are the one list of the public names: where each
lives and ``__all__`` are read from them.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    # Each name re-exported as itself, several to a statement (ruff's isort would split them).
    # isort: off
    from dsh_schedule.host.aio import (
        AsyncAgent as AsyncAgent,
        AsyncAgentEvents as AsyncAgentEvents,
        AsyncAgentHandle as AsyncAgentHandle,
        AsyncAgentRegistry as AsyncAgentRegistry,
        AsyncSchedulePlugin as AsyncSchedulePlugin,
        AsyncToolHandler as AsyncToolHandler,
    )
    from dsh_schedule.host.aiobridge import (
        AsyncHostBridge as AsyncHostBridge,
        AsyncScheduleTools as AsyncScheduleTools,
    )
    from dsh_schedule.host.bridge import HostBridge as HostBridge
    from dsh_schedule.host.gate import Delivery as Delivery
    from dsh_schedule.host.plugin import (
        AgentEvents as AgentEvents,
        AgentHandle as AgentHandle,
        CompositionError as CompositionError,
        SchedulePlugin as SchedulePlugin,
        ToolHandler as ToolHandler,
    )
    from dsh_schedule.host.reference import ReferenceHost as ReferenceHost
    from dsh_schedule.host.tools import ScheduleTools as ScheduleTools
    from dsh_schedule.runtime import (
        EmbeddedRuntime as EmbeddedRuntime,
        ManualClock as ManualClock,
        embedded_runtime as embedded_runtime,
    )
    from dsh_schedule.shared.clock import wall_clock_ms as wall_clock_ms
    from dsh_schedule.shared.coordination.agents import Coordination as Coordination
    from dsh_schedule.shared.coordination.connection import (
        RedisUrlMissing as RedisUrlMissing,
        connect as connect,
        connect_embedded as connect_embedded,
    )
    from dsh_schedule.shared.core.catalog import (
        ToolDefinition as ToolDefinition,
        anthropic_tools as anthropic_tools,
        catalog_json as catalog_json,
        openai_tools as openai_tools,
        tool_definitions as tool_definitions,
    )
    from dsh_schedule.shared.core.events import (
        NewEvent as NewEvent,
        SessionHeader as SessionHeader,
    )
    from dsh_schedule.shared.core.views import ToolResult as ToolResult
    from dsh_schedule.shared.settings import Settings as Settings
    from dsh_schedule.shared.store.jsonl import JsonlStore as JsonlStore
    from dsh_schedule.shared.store.memory import MemoryStore as MemoryStore
    from dsh_schedule.shared.store.port import SessionStore as SessionStore
    # isort: on

    __version__: str

DISTRIBUTION: Final = "dsh-tool-schedule"


@functools.cache
def _homes() -> dict[str, str]:
    """Each public name and the module it lives in, read from the ``TYPE_CHECKING``
    imports of this file."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    guard = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.name: str(node.module) for node in guard.body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def __getattr__(name: str) -> object:
    """Load a public name from its home module on first use (PEP 562); ``__all__`` is
    every public name."""
    if name == "__all__":
        value: object = sorted([*_homes(), "__version__"])
    elif name == "__version__":
        value = _version()
    elif name in _homes():
        value = getattr(importlib.import_module(_homes()[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_homes(), "__version__"})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"
