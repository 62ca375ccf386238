"""The pure core and the session store load no Redis or queue code, and guard with
explicit checks, never ``assert`` (which ``python -O`` strips)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("redis", "rq", "rq_scheduler", "fakeredis")


def modules(layer: str) -> tuple[str, ...]:
    """Every module of a layer folder (``shared/core``), as the package imports it."""
    folder = ROOT.joinpath(*layer.split("."))
    return tuple(
        f"dsh_schedule.{layer}.{path.stem}"
        for path in sorted(folder.glob("*.py"))
        if path.stem != "__init__"
    )


CORE = modules("shared.core")
STORE = modules("shared.store")

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


@pytest.mark.parametrize("layer", [CORE, STORE], ids=["pure core", "session store"])
def test_importing_a_lower_layer_loads_no_redis_or_queue_module(layer: tuple[str, ...]) -> None:
    # given a fresh interpreter, when it imports every module of the layer there is
    result = probe(layer)

    # then all of them were imported and none of them loaded Redis or rq
    assert layer, "the layer folder was found"
    assert set(layer) <= set(result["imported"])
    assert result["forbidden"] == []


@pytest.mark.parametrize("module", ["redis", "fakeredis"])
def test_the_probe_sees_a_forbidden_module(module: str) -> None:
    """The check above can fail: importing a Redis client is noticed."""
    assert module in probe((module,))["forbidden"]


@pytest.mark.parametrize("module", [*CORE, *STORE])
def test_a_lower_layer_never_guards_with_assert(module: str) -> None:
    path = ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert lines == [], f"{path.relative_to(ROOT)} asserts at lines {lines}"
