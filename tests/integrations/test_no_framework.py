"""The core package imports no agent framework: only ``dsh_schedule.integrations`` does
(also an import-linter contract in pyproject.toml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("langgraph", "langchain_core", "langchain", "pydantic_ai", "agents",
              "anthropic", "openai")
# Everything but the adapters (and the web console, a front end of its own).
CORE = sorted(
    "dsh_schedule." + ".".join(path.relative_to(ROOT / "dsh_schedule").with_suffix("").parts)
    for layer in ("host", "shared", "worker", "scheduler")
    for path in (ROOT / "dsh_schedule" / layer).rglob("*.py")
    if path.stem != "__init__"
) + ["dsh_schedule", "dsh_schedule.cli", "dsh_schedule.demo", "dsh_schedule.embedded",
     "dsh_schedule.status"]

PROBE = """
import importlib, json, sys
modules, frameworks = json.loads(sys.argv[1])
for name in modules:
    importlib.import_module(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(frameworks))))
"""


def loaded_frameworks(modules: list[str]) -> list[str]:
    """Import ``modules`` in a fresh interpreter; the frameworks that got loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([modules, list(FRAMEWORKS)])],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


def test_the_core_package_loads_no_agent_framework() -> None:
    assert "dsh_schedule.host.aio" in CORE and "dsh_schedule.shared.core.fold" in CORE
    assert loaded_frameworks(CORE) == []


@pytest.mark.parametrize(("adapter", "framework"), [
    ("dsh_schedule.integrations.langgraph", "langchain_core"),
    ("dsh_schedule.integrations.pydantic_ai", "pydantic_ai"),
])
def test_the_probe_sees_an_adapter_load_its_framework(adapter: str, framework: str) -> None:
    """The check above can fail: an adapter's framework is noticed."""
    assert framework in loaded_frameworks([adapter])


def test_the_shared_recorder_needs_no_framework() -> None:
    assert loaded_frameworks(["dsh_schedule.integrations.session"]) == []
