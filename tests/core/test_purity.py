"""The pure core loads no Redis or queue code (docs/architecture.md#layout)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("redis", "rq", "rq_scheduler", "fakeredis")
CORE = (
    "dsh_schedule.shared.core.records",
    "dsh_schedule.shared.core.fold",
    "dsh_schedule.shared.core.due",
    "dsh_schedule.shared.core.presentation",
    "dsh_schedule.shared.core.instant",
    "dsh_schedule.shared.core.errors",
    "dsh_schedule.shared.core.events",
    "dsh_schedule.shared.core.ledger",
    "dsh_schedule.shared.core.timesel",
    "dsh_schedule.shared.core.timecontext",
    "dsh_schedule.shared.core.requests",
    "dsh_schedule.shared.core.views",
    "dsh_schedule.shared.core.framing",
    "dsh_schedule.shared.core.catalog",
)
PROBE = """
import importlib, json, sys
required, forbidden = json.loads(sys.argv[1])
for name in required:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps({"imported": required, "forbidden": loaded}))
"""


def probe(required: tuple[str, ...]) -> dict[str, list[str]]:
    """Import the modules in a fresh interpreter; what it imported and what it loaded."""
    argument = json.dumps([list(required), list(FORBIDDEN)])
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, argument],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, list[str]] = json.loads(completed.stdout)
    return result


def test_importing_the_pure_core_loads_no_redis_or_queue_module() -> None:
    # given a fresh interpreter, when it imports every pure core module there is
    result = probe(CORE)

    # then all of them were imported and none of them loaded Redis or rq
    assert set(CORE) <= set(result["imported"])
    assert result["forbidden"] == []


@pytest.mark.parametrize("module", ["redis", "fakeredis"])
def test_the_probe_sees_a_forbidden_module(module: str) -> None:
    """The check above can fail: importing a Redis client is noticed."""
    assert module in probe((module,))["forbidden"]
