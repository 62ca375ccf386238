"""What the CLI and ``import dsh_schedule`` load (docs/architecture.md#processes-and-cli).

Each probe runs in a fresh interpreter and reports which of Redis, rq, rq-scheduler and
fakeredis ended up in ``sys.modules``; a control probe shows the report would name them.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dsh_schedule

HEAVY = ("redis", "rq", "rq_scheduler", "fakeredis")

PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr)
"""

EXPECTED_API = {
    "SchedulePlugin", "CompositionError", "AgentHandle", "AgentEvents", "ToolHandler",
    "ScheduleTools", "HostBridge", "Delivery", "ReferenceHost", "JsonlStore", "MemoryStore",
    "SessionStore", "SessionHeader", "NewEvent", "Coordination", "connect", "connect_embedded",
    "RedisUrlMissing", "Settings",
    "ToolDefinition", "tool_definitions", "catalog_json", "openai_tools", "anthropic_tools",
    "ToolResult", "wall_clock_ms", "__version__",
    # the asyncio host API
    "AsyncSchedulePlugin", "AsyncScheduleTools", "AsyncHostBridge", "AsyncAgent",
    "AsyncAgentRegistry", "AsyncAgentHandle", "AsyncAgentEvents", "AsyncToolHandler",
    # the embedded runtime
    "EmbeddedRuntime", "ManualClock", "embedded_runtime",
}

SESSION = [
    {"type": "session", "version": 0, "id": "s", "createdAt": 0},
    {"type": "schedule/change", "seq": 0, "time": 0, "data": {
        "version": 1, "operation": "create", "schedule": {
            "id": "schedule-1", "kind": "after", "prompt": "stretch", "afterSeconds": 600,
            "scheduledAt": "2026-12-01T09:10:00.000Z"}}},
]


def loaded_heavy(body: str, cwd: Path) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``body``."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body, heavy=HEAVY)],
        capture_output=True, text=True, cwd=cwd, timeout=60,
        env={"PATH": "/usr/bin:/bin", "DSH_SCHEDULE_SESSIONS": str(cwd / "sessions")},
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stderr.splitlines()[-1])
    return loaded


def run_main(argv: list[str]) -> str:
    return (
        "from dsh_schedule.cli import main\n"
        "try:\n"
        f"    code = main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "assert code == 0, code\n"
    )


@pytest.fixture
def session_file(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in SESSION), encoding="utf-8")
    return path


@pytest.mark.parametrize("argv", [
    ["check", "{file}"],
    ["fold", "{file}", "--now", "2030-01-01T00:00:00Z"],
    ["present", "{file}", "0"],
    ["catalog", "--format", "openai"],
    ["reminders", "--sessions", "{dir}", "--json"],
    ["--version"],
    ["--help"],
    ["call", "--help"],
])
def test_read_only_commands_load_no_redis_or_rq(session_file: Path, argv: list[str]) -> None:
    argv = [arg.format(file=session_file, dir=session_file.parent) for arg in argv]
    assert loaded_heavy(run_main(argv), session_file.parent) == []


def test_the_probe_sees_redis_when_a_command_loads_it(tmp_path: Path) -> None:
    assert loaded_heavy(run_main(["session", "create", "a"]), tmp_path) == []
    call = run_main(["session", "create", "b"]) + run_main(["call", "b", "schedule_list"])
    assert {"redis", "fakeredis"} <= set(loaded_heavy(call, tmp_path))


def test_import_dsh_schedule_loads_no_redis_or_rq(tmp_path: Path) -> None:
    assert loaded_heavy("import dsh_schedule", tmp_path) == []
    light = "import dsh_schedule as d\nd.Settings, d.tool_definitions, d.JsonlStore, d.__version__"
    assert loaded_heavy(light, tmp_path) == []
    assert "redis" in loaded_heavy("from dsh_schedule import SchedulePlugin", tmp_path)


def test_the_public_api_is_every_name_host_authors_need() -> None:
    assert set(dsh_schedule.__all__) == EXPECTED_API
    assert len(dsh_schedule.__all__) == len(EXPECTED_API)
    assert EXPECTED_API <= set(dir(dsh_schedule))


@pytest.mark.parametrize("name", sorted(EXPECTED_API - {"__version__"}))
def test_every_public_name_resolves_to_its_home(name: str) -> None:
    value = getattr(dsh_schedule, name)
    home = sys.modules[dsh_schedule._homes()[name]]
    assert value is getattr(home, name)


def test_star_import_gives_every_public_name(tmp_path: Path) -> None:
    body = (
        "from dsh_schedule import *\n"
        f"missing = [n for n in {sorted(EXPECTED_API)!r} if n not in globals()]\n"
        "assert not missing, missing\n"
    )
    loaded_heavy(body, tmp_path)  # fails unless the probe ran clean


def test_version_is_the_installed_distribution_version() -> None:
    assert dsh_schedule.__version__ == importlib.metadata.version("dsh-tool-schedule")


def test_unknown_names_are_attribute_errors_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Scheduler'"):
        dsh_schedule.Scheduler  # noqa: B018
    from dsh_schedule import cli

    assert cli.main is dsh_schedule.cli.main


def test_the_type_checker_imports_are_the_one_list_of_public_names() -> None:
    """Each public name is imported once, for type checkers, as an explicit re-export;
    where it lives and ``__all__`` are read from those imports."""
    tree = ast.parse(Path(dsh_schedule.__file__).read_text(encoding="utf-8"))
    declared: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    for alias in statement.names:
                        assert alias.asname == alias.name, alias.name
                        declared[alias.name] = str(statement.module)
    assert declared == dsh_schedule._homes()
    assert sorted([*declared, "__version__"]) == dsh_schedule.__all__
