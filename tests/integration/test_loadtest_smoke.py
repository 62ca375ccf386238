"""``dsh-schedule loadtest --smoke`` runs end to end and reports every figure (issue 6).

Figures are timings: they are checked for presence and shape only, never against targets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

LATENCY = {"count", "p50_ms", "p99_ms", "max_ms", "mean_ms"}

# figure -> (keys it must carry, keys whose value must be a measured number)
FIGURES: dict[str, tuple[set[str], set[str]]] = {
    "create": (
        {"hosts", "agents", "threads", "count", "errors", "seconds", "per_s", "latency",
         "bare_per_s", "bare_latency", "ratio_per_s", "ratio_p50", "ratio_p99"},
        {"per_s", "bare_per_s", "ratio_per_s"},
    ),
    "long_session": (
        {"calls", "errors", "sizes", "ratio", "ratio_p50", "ratio_p99", "bare_ratio"},
        {"ratio", "bare_ratio"},
    ),
    "due": (
        {"workers", "count", "dispatched", "move_seconds", "seconds", "per_worker_per_s",
         "bare_per_worker_per_s", "ratio", "all_workers_per_s", "bare_all_workers_per_s"},
        {"per_worker_per_s", "bare_per_worker_per_s", "ratio"},
    ),
    "lateness": (
        {"hosts", "reminders", "delivered", "missing", "window_s", "mover_interval_s", "followup",
         "session", "bare", "ratio_p99"},
        {"reminders", "delivered"},
    ),
    "rebuild": (
        {"agents", "records_per_agent", "db", "lease_restore_seconds", "enqueue_seconds",
         "seconds", "armed", "cold_seconds", "bare_seconds", "ratio"},
        {"seconds", "bare_seconds", "ratio"},
    ),
    "memory": (
        {"agents", "bytes_per_agent", "by_key", "used_memory_delta_per_agent",
         "bare_bytes_per_job", "ratio", "note"},
        set(),
    ),
}
SESSION_SIZE = {"events", "file_bytes", "first_call_ms", "per_s", "latency", "bare_per_s",
                "bare_latency"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loadtest")


@pytest.fixture(scope="module")
def result(workdir: Path) -> dict[str, Any]:
    """One smoke run for every test of this module."""
    tmp = workdir
    out = tmp / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "loadtest", "--smoke", "--quiet",
         "--json", str(out)],
        cwd=tmp, capture_output=True, text=True, timeout=100,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "figure" in run.stdout and str(out) in run.stdout
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def test_the_result_says_what_ran_where(result: dict[str, Any]) -> None:
    assert result["version"] == 1
    assert result["mode"] == "embedded"
    assert {"cpus", "memory_total_bytes", "python", "platform", "redis_version"} <= set(
        result["machine"])
    assert result["plan"]["rebuild_db"] == 15


@pytest.mark.parametrize("figure", sorted(FIGURES))
def test_every_figure_carries_every_key(result: dict[str, Any], figure: str) -> None:
    keys, measured = FIGURES[figure]
    value = result["figures"][figure]
    assert set(value) == keys
    for key in measured:
        assert isinstance(value[key], int | float), key


@pytest.mark.parametrize(("figure", "key"), [
    ("create", "latency"), ("create", "bare_latency"), ("lateness", "followup"),
    ("lateness", "session"), ("lateness", "bare"),
])
def test_latencies_have_percentiles(result: dict[str, Any], figure: str, key: str) -> None:
    latency = result["figures"][figure][key]
    assert set(latency) == LATENCY
    assert latency["count"] > 0


def test_the_long_session_is_measured_fresh_and_pre_filled(result: dict[str, Any]) -> None:
    sizes = result["figures"]["long_session"]["sizes"]
    assert [s["events"] for s in sizes] == sorted(s["events"] for s in sizes)
    assert sizes[0]["events"] == 0 and sizes[-1]["events"] > 0
    for size in sizes:
        assert set(size) == SESSION_SIZE


def test_every_reminder_is_delivered_and_every_agent_rearmed(result: dict[str, Any]) -> None:
    figures = result["figures"]
    assert figures["lateness"]["missing"] == 0
    assert figures["due"]["dispatched"] == figures["due"]["count"]
    assert figures["rebuild"]["armed"] == figures["rebuild"]["agents"]


def test_memory_is_skipped_with_a_note_on_the_embedded_redis(result: dict[str, Any]) -> None:
    memory = result["figures"]["memory"]
    assert memory["bytes_per_agent"] is None
    assert "embedded" in memory["note"]


def test_every_target_is_reported(result: dict[str, Any]) -> None:
    names = [t["name"] for t in result["targets"]]
    assert len(names) == 7
    for target in result["targets"]:
        assert set(target) == {"name", "target", "measured", "met"}


def test_nothing_is_left_in_the_working_directory(result: dict[str, Any], workdir: Path) -> None:
    assert sorted(p.name for p in workdir.iterdir()) == ["result.json"]
