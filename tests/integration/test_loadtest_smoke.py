"""``dsh-schedule loadtest --smoke`` runs end to end and reports every figure (issue 6):
the in-process phases on the embedded Redis, and the process phases (idle, burst, memory:
real worker, scheduler and host processes) on the suite's real Redis; and ``--peers``
fills the columns of arq and of rq's own scheduler (both worker classes) beside them.

Figures are timings: they are checked for presence and shape only, never against targets.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import conftest

pytestmark = pytest.mark.slow

LATENCY = {"count", "p50_ms", "p99_ms", "max_ms", "mean_ms"}

# figure -> (keys it must carry, keys whose value must be a measured number)
FIGURES: dict[str, tuple[set[str], set[str]]] = {
    "create": (
        {"hosts", "agents", "threads", "count", "errors", "seconds", "per_s", "latency",
         "bare_per_s", "bare_latency", "ratio_per_s", "ratio_p50", "ratio_p99",
         "every_per_s", "every_latency", "cron_per_s", "cron_latency", "cron_vs_every",
         "lifecycle_off_per_s", "lifecycle_create_per_s", "lifecycle_update_per_s",
         "lifecycle_create_vs_off", "lifecycle_update_vs_off"},
        {"per_s", "bare_per_s", "ratio_per_s", "every_per_s", "cron_per_s", "cron_vs_every",
         "lifecycle_off_per_s", "lifecycle_create_per_s", "lifecycle_update_per_s",
         "lifecycle_create_vs_off", "lifecycle_update_vs_off"},
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
PROCESS_FIGURES: dict[str, tuple[set[str], set[str]]] = {
    "idle": (
        {"agents", "host_processes", "workers", "ready_seconds", "warmup_s", "ours", "bare",
         "ratio", "ratio_commands", "bytes_per_agent", "bytes_by_key", "host_rss_mib",
         "worker_rss_mib", "flush_recovery_seconds", "arming", "flush_arming"},
        {"agents", "ready_seconds", "warmup_s", "bytes_per_agent", "host_rss_mib",
         "worker_rss_mib", "flush_recovery_seconds"},
    ),
    "burst": (
        {"agents", "created", "errors", "due_at", "slack_s", "dispatched", "delivered",
         "missing", "followup", "session", "bare_jobs", "bare", "bare_slack_s", "ratio_p99",
         "cpu_s"},
        {"agents", "created", "dispatched", "delivered", "bare_jobs", "slack_s",
         "bare_slack_s"},
    ),
    "process_memory": (
        {"sessions", "events_per_session", "session_bytes", "served", "seconds",
         "worker_rss_bytes", "worker_hwm_bytes", "worker_start_rss_bytes", "host_rss_bytes",
         "host_hwm_bytes", "scheduler_rss_bytes", "bare_worker_rss_bytes", "note"},
        {"session_bytes", "served", "seconds", "worker_rss_bytes", "worker_hwm_bytes",
         "worker_start_rss_bytes", "host_rss_bytes", "host_hwm_bytes", "scheduler_rss_bytes",
         "bare_worker_rss_bytes"},
    ),
}
CPU_WINDOW = {"seconds", "processes", "total_cores", "cores_per_1000_agents", "commands_per_s",
              "commands_by_type", "redis_cpu_from"}
TARGETS = 16


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loadtest")


def _smoke(workdir: Path, *extra: str, timeout: float) -> dict[str, Any]:
    out = workdir / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "loadtest", "--smoke", "--quiet",
         "--json", str(out), *extra],
        cwd=workdir, capture_output=True, text=True, timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "figure" in run.stdout and str(out) in run.stdout
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


@pytest.fixture(scope="module")
def result(workdir: Path) -> dict[str, Any]:
    """One embedded smoke run for the tests of the in-process phases."""
    return _smoke(workdir, timeout=100)


@pytest.fixture(scope="module")
def process_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loadtest-processes")


@pytest.fixture(scope="module")
def process_result(process_workdir: Path) -> dict[str, Any]:
    """One smoke run of the process phases on the suite's real Redis."""
    conftest.real_redis_client().close()  # fails the test (never skips) with no Redis
    url = conftest.REAL_REDIS_URL
    return _smoke(process_workdir, "--redis", url, "--phases", "idle,burst,memory",
                  timeout=240)


def test_the_result_says_what_ran_where(result: dict[str, Any]) -> None:
    assert result["version"] == 1
    assert result["mode"] == "embedded"
    assert {"cpus", "memory_total_bytes", "python", "platform", "redis_version",
            "load_average"} <= set(result["machine"])
    assert result["plan"]["rebuild_db"] == 15


@pytest.mark.parametrize("figure", sorted(FIGURES))
def test_every_figure_carries_every_key(result: dict[str, Any], figure: str) -> None:
    keys, measured = FIGURES[figure]
    value = result["figures"][figure]
    assert set(value) == keys
    for key in measured:
        assert isinstance(value[key], int | float), key
    if figure == "idle":  # the arming curves: a rate a tiny run resolves may be missing
        for curve in (value["arming"], value["flush_arming"]):
            assert set(curve) == {"first_tenth_per_s", "last_tenth_per_s"}


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
    assert len(names) == TARGETS
    for target in result["targets"]:
        assert set(target) == {"name", "target", "measured", "met"}


def test_the_process_phases_are_left_to_a_real_redis(result: dict[str, Any]) -> None:
    for figure in PROCESS_FIGURES:
        assert result["figures"][figure] is None
    assert any("need --redis" in note for note in result["notes"])


def test_nothing_is_left_in_the_working_directory(result: dict[str, Any], workdir: Path) -> None:
    assert sorted(p.name for p in workdir.iterdir()) == ["result.json"]


# -- the process phases, on the suite's real Redis ---------------------------------------


@pytest.mark.parametrize("figure", sorted(PROCESS_FIGURES))
def test_every_process_figure_carries_every_key(process_result: dict[str, Any],
                                                figure: str) -> None:
    keys, measured = PROCESS_FIGURES[figure]
    value = process_result["figures"][figure]
    assert set(value) == keys
    for key in measured:
        assert isinstance(value[key], int | float), key
    if figure == "idle":  # the arming curves: a rate a tiny run resolves may be missing
        for curve in (value["arming"], value["flush_arming"]):
            assert set(curve) == {"first_tenth_per_s", "last_tenth_per_s"}


def test_the_burst_reads_the_cpu_of_every_process_and_the_server(
    process_result: dict[str, Any],
) -> None:
    spent = process_result["figures"]["burst"]["cpu_s"]
    assert {"host", "scheduler", "redis-server", "worker-1"} <= set(spent)
    for role, seconds in spent.items():
        assert isinstance(seconds, int | float) and seconds >= 0, role


@pytest.mark.parametrize("side", ["ours", "bare"])
def test_idle_cost_is_read_for_every_process_and_the_server(process_result: dict[str, Any],
                                                            side: str) -> None:
    idle = process_result["figures"]["idle"]
    window = idle[side]
    assert set(window) == CPU_WINDOW
    roles = set(window["processes"])
    assert {"scheduler", "redis-server", "worker-1"} <= roles
    assert ("host" in roles) == (side == "ours")
    for role, cores in window["processes"].items():
        assert isinstance(cores, int | float), role
    for key in ("total_cores", "cores_per_1000_agents", "commands_per_s"):
        assert isinstance(window[key], int | float), key
    assert window["redis_cpu_from"] in ("proc", "info")


def test_every_burst_reminder_is_dispatched_and_delivered(process_result: dict[str, Any]) -> None:
    burst = process_result["figures"]["burst"]
    assert burst["errors"] == 0 and burst["missing"] == 0
    assert burst["dispatched"] == burst["delivered"] == burst["agents"]
    assert burst["bare_jobs"] == burst["agents"]
    for key in ("followup", "session", "bare"):
        assert set(burst[key]) == LATENCY
        assert burst[key]["count"] == burst["agents"]


def test_every_long_session_is_served(process_result: dict[str, Any]) -> None:
    memory = process_result["figures"]["process_memory"]
    assert memory["served"] == memory["sessions"]
    assert memory["note"] is None


def test_the_process_run_reports_every_target(process_result: dict[str, Any]) -> None:
    assert process_result["mode"] == "redis"
    assert len(process_result["targets"]) == TARGETS
    measured = {t["name"] for t in process_result["targets"] if t["measured"] is not None}
    assert len(measured) == 5  # the idle, burst and memory targets
    assert all(t["met"] is None for t in process_result["targets"])  # far below scale


def test_the_process_run_leaves_nothing_behind(process_result: dict[str, Any],
                                               process_workdir: Path) -> None:
    assert sorted(p.name for p in process_workdir.iterdir()) == ["result.json"]
    client = conftest.real_redis_client()
    try:
        tag = process_result["plan"]["tag"]
        assert list(client.scan_iter(match=f"*{tag}*")) == []
        assert list(client.scan_iter(match=f"*{tag.encode().hex()}*")) == []
        # Nor a job of its queues whose id rq chose (a wake a host triggered at the end).
        origins = [client.hget(key, "origin") or b"" for key in client.scan_iter(match="rq:job:*")]
        assert [o for o in origins if tag.encode() in o] == []
    finally:
        client.close()


# -- the peers (--peers), on the suite's real Redis ---------------------------------------

PEERS = ["arq", "rq Worker", "rq SimpleWorker"]
PEER_RATIOS = {"ratio_idle_cores", "ratio_idle_commands", "ratio_idle_bytes", "ratio_burst_p50",
               "ratio_burst_p99"}


@pytest.fixture(scope="module")
def arq_path(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``--arq-path`` when arq is not in this environment: arq pins redis<6, so the test
    installs it beside the project (as docs/benchmarks.md does) rather than in it."""
    if importlib.util.find_spec("arq") is not None:
        return []
    target = tmp_path_factory.mktemp("arq")
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
                    "-q", "--target", str(target), "arq>=0.26,<0.29"], check=True, timeout=300)
    return ["--arq-path", str(target)]


@pytest.fixture(scope="module")
def peers_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("loadtest-peers")


@pytest.fixture(scope="module")
def peers_run(peers_workdir: Path, arq_path: list[str]) -> tuple[dict[str, Any], str]:
    """One smoke run of idle and burst with --peers: (result, the printed table)."""
    conftest.real_redis_client().close()  # fails the test (never skips) with no Redis
    out = peers_workdir / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "loadtest", "--smoke", "--quiet", "--json",
         str(out), "--redis", conftest.REAL_REDIS_URL, "--phases", "idle,burst", "--peers",
         *arq_path],
        cwd=peers_workdir, capture_output=True, text=True, timeout=280,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded, run.stdout


@pytest.mark.timeout(600)
def test_every_peer_column_is_filled(peers_run: tuple[dict[str, Any], str]) -> None:
    result, table = peers_run
    figures = result["figures"]
    peers = figures["peers"]
    assert set(peers) == {"idle", "burst", *PEER_RATIOS}
    best = {  # the best peer's figure of each ratio: a ratio over 0 is "-", not a number
        "ratio_idle_cores": min(p["ours"]["total_cores"] for p in peers["idle"]),
        "ratio_idle_commands": min(p["ours"]["commands_per_s"] for p in peers["idle"]),
        "ratio_idle_bytes": min(p["bytes_per_job"] for p in peers["idle"]),
        "ratio_burst_p50": min(p["latency"]["p50_ms"] for p in peers["burst"]),
        "ratio_burst_p99": min(p["latency"]["p99_ms"] for p in peers["burst"]),
    }
    assert set(best) == PEER_RATIOS
    for key in PEER_RATIOS:
        # A smoke window is short: the best peer may have used no CPU tick at all in it.
        assert isinstance(peers[key], int | float) or best[key] <= 0, key
    assert [p["peer"] for p in peers["idle"]] == PEERS
    assert [p["peer"] for p in peers["burst"]] == PEERS
    workers = figures["idle"]["workers"]
    for idle in peers["idle"]:
        assert idle["workers"] == workers and idle["jobs"] == figures["idle"]["agents"]
        assert isinstance(idle["bytes_per_job"], int | float)
        window = idle["ours"]
        assert set(window) == CPU_WINDOW
        assert {"worker-1", "redis-server"} <= set(window["processes"])
        for key in ("total_cores", "cores_per_1000_agents", "commands_per_s"):
            assert isinstance(window[key], int | float), key
    for burst in peers["burst"]:
        assert burst["workers"] == workers
        assert burst["ran"] == burst["jobs"] == figures["burst"]["agents"]
        assert set(burst["latency"]) == LATENCY
        assert burst["latency"]["count"] == burst["jobs"]
    header = table.splitlines()[0]
    for name in PEERS:
        assert f"peer {name} ({workers} workers)" in header
    assert "ours vs best peer" in header
    rows = {line.split("  ")[0]: line for line in table.splitlines()}
    for row in ("idle Redis commands/s", "idle Redis bytes per agent / job"):
        assert rows[row].rstrip().endswith("x"), row


@pytest.mark.timeout(600)
def test_the_peers_leave_nothing_behind(peers_run: tuple[dict[str, Any], str],
                                        peers_workdir: Path) -> None:
    result, _table = peers_run
    assert sorted(p.name for p in peers_workdir.iterdir()) == ["result.json"]
    client = conftest.real_redis_client()
    try:
        tag = result["plan"]["tag"]
        assert list(client.scan_iter(match=f"*{tag}*")) == []
    finally:
        client.close()


# -- the unloaded sessions' phase (issue 37), on the suite's real Redis -------------------


@pytest.fixture(scope="module")
def unloaded_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    conftest.real_redis_client().close()  # fails the test (never skips) with no Redis
    return _smoke(tmp_path_factory.mktemp("loadtest-unloaded"), "--redis",
                  conftest.REAL_REDIS_URL, "--phases", "unloaded", timeout=240)


def test_the_unloaded_phase_arms_every_timer_and_delivers_every_burst_reminder(
        unloaded_result: dict[str, Any]) -> None:
    unloaded = unloaded_result["figures"]["unloaded"]
    assert unloaded["armed"] == unloaded["sessions"] == 20
    assert isinstance(unloaded["arm_s"], float)
    # Redis's memory over 20 sessions is within what the server's own buffers move by (a
    # negative difference was seen): the figure means something at the phase's real size.
    assert isinstance(unloaded["redis_bytes_per_session"], float)
    assert unloaded["burst_created"] == unloaded["burst_delivered"] == unloaded["burst"] == 10
    assert unloaded["burst_session"]["count"] == 10
    assert unloaded["host_peak_rss_bytes"] > 0
    assert 0 < unloaded["host_idle_rss_bytes"] <= unloaded["host_peak_rss_bytes"]
    assert 0 <= unloaded["idle_cores"] <= unloaded["idle_cores_with_redis"]
