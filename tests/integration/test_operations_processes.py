"""Operations on real processes (docs/architecture.md#operations): Prometheus metrics
scraped from real ``worker`` and ``scheduler`` processes and an in-test host, JSON log
lines of a real worker, and ``status``/``health`` against a deployment a test builds up."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue, Worker

from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.status import Health
from tests.conftest import REAL_REDIS_URL
from tests.redis_server import free_port
from tests.support import Processes, process_env, reminder_messages, value, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of a ``/metrics`` endpoint, by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


class Deployment:
    """Real ``dsh-schedule`` processes on one prefix and queue, with a host in the test."""

    def __init__(self, root: Path, client: redis.Redis, tag: str) -> None:
        self.sessions = root / "sessions"
        self.env = process_env(
            REAL_REDIS_URL, self.sessions, PREFIX=f"{tag}:", QUEUE=tag, LOCK_TTL="2",
            MAINTENANCE_TTL="2", LEASE_RENEW="1", MOVER_INTERVAL="0.1",
            RECONCILE_INTERVAL="1",
        )
        self.settings = Settings.from_env(self.env)
        self.client = client
        self.store = JsonlStore(self.sessions)
        self.coordination = Coordination(client, self.settings)
        self.procs = Processes(root, self.env)
        self.host: ReferenceHost | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def session(self, session_id: str) -> str:
        self.store.create(SessionHeader(id=session_id, createdAt=0))
        return session_id

    def open_host(self, *sessions: str, run: bool) -> ReferenceHost:
        host = ReferenceHost(self.store, self.coordination, self.settings)
        for session in sessions:
            host.open_root(session)
        if run:
            self._thread = threading.Thread(target=host.run, args=(self._stop,), daemon=True)
            self._thread.start()
        self.host = host
        return host

    def call(self, session: str, tool: str, args: dict[str, Any]) -> Any:
        assert self.host is not None
        _definition, handler = self.host.agents[session].tools[tool]
        return value(handler(args).content)

    def cli(self, *args: str) -> tuple[int, str]:
        result = self.procs.run(*args)
        assert "Traceback" not in result.stderr, result.stderr
        return result.returncode, result.stdout

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.procs.close()


@pytest.fixture
def deployment(tmp_path: Path, real_redis: redis.Redis) -> Iterator[Deployment]:
    d = Deployment(tmp_path, real_redis, f"ops{free_port()}")
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def host_metrics() -> Iterator[metrics.MetricsServer]:
    server = metrics.serve(free_port(), "127.0.0.1")
    try:
        yield server
    finally:
        server.close()
        metrics.disable()


def test_metrics_of_real_processes_count_every_delivery_and_tool_call(
    deployment: Deployment, host_metrics: metrics.MetricsServer
) -> None:
    worker_port, scheduler_port = free_port(), free_port()
    sessions = [deployment.session(f"s{i}") for i in range(3)]
    deployment.procs.spawn("worker", "worker", "--log-format", "json",
                           "--metrics-port", str(worker_port), "--metrics-addr", "127.0.0.1")
    deployment.procs.spawn("scheduler", "scheduler", "--metrics-port", str(scheduler_port),
                           "--metrics-addr", "127.0.0.1")
    deployment.open_host(*sessions, run=True)
    for index, session in enumerate(sessions):
        created = deployment.call(session, "schedule_create",
                                  {"prompt": f"reminder {index}", "after_seconds": 1 + index})
        assert created["id"] == "schedule-1"
    assert deployment.call(sessions[0], "schedule_create",
                           {"prompt": " ", "after_seconds": 5})["code"] == "invalid_prompt"
    assert len(deployment.call(sessions[1], "schedule_list", {})) == 1

    def delivered() -> int:
        return sum(len(reminder_messages(deployment.store, s)) for s in sessions)

    assert wait_until(lambda: delivered() == 3, timeout=30), deployment.procs.describe()
    # The worker records a dispatch right after its append, the host right after its own:
    # wait for the scrapes to catch up with the logs, then check they agree exactly.
    assert wait_until(lambda: get(scrape(worker_port), "dsh_schedule_lateness_seconds_count",
                                  stage="followup") == 3), deployment.procs.describe()
    assert wait_until(lambda: get(scrape(scheduler_port), "dsh_schedule_live_agents") == 3)
    time.sleep(0.5)  # nothing more may arrive: a duplicate would show here
    worker, scheduler, host = (scrape(worker_port), scrape(scheduler_port),
                               scrape(host_metrics.port))
    assert delivered() == 3

    assert get(worker, "dsh_schedule_lateness_seconds_count", stage="followup") == 3
    assert get(worker, "dsh_schedule_dispatches_total", kind="one-shot") == 3
    assert get(worker, "dsh_schedule_wakes_total", outcome="settled") is not None
    assert get(worker, "dsh_schedule_due_transaction_seconds_count") is not None
    assert get(host, "dsh_schedule_lateness_seconds_count", stage="session") == 3
    assert get(host, "dsh_schedule_deliveries_total", outcome="delivered") == 3
    assert get(host, "dsh_schedule_deliveries_total", outcome="dropped") is None
    assert get(host, "dsh_schedule_tool_calls_total", tool="schedule_create", code="ok") == 3
    assert get(host, "dsh_schedule_tool_calls_total", tool="schedule_create",
               code="invalid_prompt") == 1
    assert get(host, "dsh_schedule_tool_calls_total", tool="schedule_list", code="ok") == 1
    assert get(host, "dsh_schedule_tool_call_seconds_count", tool="schedule_create") == 4
    assert (get(host, "dsh_schedule_last_pass_timestamp_seconds", loop="lease_renewal")
            or 0) > 0
    for loop in ("mover", "reconcile"):
        assert (get(scheduler, "dsh_schedule_last_pass_timestamp_seconds", loop=loop) or 0) > 0
    assert get(scheduler, "dsh_schedule_scheduled_wakes") is not None
    for samples in (worker, scheduler, host):
        assert get(samples, "dsh_schedule_redis_errors_total") == 0

    # The worker's log: JSON lines only, rq's own included, and ours name the agent.
    deployment.close()
    lines = [json.loads(line) for line in
             deployment.procs.logs["worker"][-1].read_text(encoding="utf-8").splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    dispatched = [line for line in lines if line["message"].startswith("dispatched ")]
    assert {line["agent"] for line in dispatched} == set(sessions)
    assert {line["schedule_id"] for line in dispatched} == {"schedule-1"}
    assert all(line.get("wake_id") for line in dispatched)
    rq_lines = [line for line in lines if line["logger"].startswith("rq.")]
    assert any("Job OK" in line["message"] and line.get("wake_id") for line in rq_lines)


def test_status_reports_what_was_armed_and_health_follows_the_processes(
    deployment: Deployment,
) -> None:
    queue = deployment.settings.queue
    sessions = [deployment.session(f"s{i}") for i in range(3)]
    host = deployment.open_host(*sessions, run=False)
    later = [deployment.call(s, "schedule_create", {"prompt": "p", "after_seconds": seconds})
             for s, seconds in ((sessions[0], 600), (sessions[1], 900))]
    # An hour behind: its reminder is already overdue, and no scheduler moves it.
    behind = ScheduleTools(deployment.store, deployment.coordination, deployment.settings,
                           lambda: wall_clock_ms() - 3_600_000)
    overdue = value(behind.call(sessions[2], "schedule_create",
                                {"prompt": "late", "after_seconds": 60}).content)

    code, out = deployment.cli("status", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["liveAgents"] == 3
    assert report["scheduledWakes"] == 3
    assert [(w["agent"], w["due"]) for w in report["nextWakes"]] == [
        (sessions[2], overdue["scheduledAt"]),
        (sessions[0], later[0]["scheduledAt"]),
        (sessions[1], later[1]["scheduledAt"]),
    ]
    assert report["overdueWakes"] == 1
    assert report["oldestOverdueSeconds"] >= 3540  # its target was 59 minutes back
    assert report["nextWakes"][1]["dueInSeconds"] > 0
    assert [(q["name"], q["liveAgents"], q["workers"])
            for q in report["queues"]] == [(queue, 3, [])]
    assert report["scheduler"] is None
    assert report["lastReconcile"] is None
    assert report["health"]["ok"] is False

    code, out = deployment.cli("health")
    assert (code, out.count("\n")) == (1, 1), out
    assert out.startswith("unhealthy: no scheduler heartbeat")
    assert not host.plugin.health().ok

    deployment.procs.spawn("scheduler", "scheduler")
    assert wait_until(lambda: deployment.client.exists(
        deployment.coordination.keys.scheduler_heartbeat()) == 1), deployment.procs.describe()
    code, out = deployment.cli("health")
    assert code == 1, out
    assert out == f"unhealthy: queue {queue!r} has 3 live agent(s) and no worker\n"
    assert host.plugin.health() == Health(ok=False, reason=f"queue {queue!r} has no worker")

    deployment.procs.spawn("worker", "worker")
    assert wait_until(lambda: deployment.cli("health")[0] == 0), deployment.procs.describe()
    code, out = deployment.cli("health", "--json")
    assert code == 0
    assert json.loads(out)["ok"] is True
    assert host.plugin.health().ok
    # A queue named on the command line needs a worker too, live agents or not.
    code, out = deployment.cli("health", "--queue", f"{queue}-other")
    assert (code, out) == (1, f"unhealthy: queue {queue + '-other'!r} has no worker\n")

    # The scheduler moved the overdue wake and the worker dispatched it; nobody delivers.
    assert wait_until(lambda: json.loads(deployment.cli("status", "--json")[1])
                      ["followupsPending"] == 1)
    report = json.loads(deployment.cli("status", "--json")[1])
    assert report["overdueWakes"] == 0
    assert report["scheduledWakes"] == 2
    assert report["scheduler"]["fresh"] is True
    assert report["lastReconcile"]["live"] == 3
    (only,) = report["queues"]
    assert [w["queues"] for w in only["workers"]] == [[queue]]
    assert report["health"] == {"ok": True, "reason": report["health"]["reason"]}
    code, text = deployment.cli("status")
    assert code == 0
    assert "live agents: 3" in text and "health: ok" in text

    deployment.procs.send("worker", signal.SIGTERM)  # a stopped worker leaves rq's registry
    assert wait_until(lambda: "worker" in deployment.procs.dead())
    code, out = deployment.cli("health")
    assert (code, out) == (1, f"unhealthy: queue {queue!r} has 3 live agent(s) and no worker\n")


def test_health_fails_once_the_only_worker_is_killed_and_once_a_wake_waits_too_long(
    deployment: Deployment, tmp_path: Path,
) -> None:
    """A worker killed with SIGKILL stays in rq's registry for up to 90 s; health fails
    as soon as its beat is overdue (a second here, its liveness window, 15 s by default),
    while rq still lists it. A wake that then waits in the queue past
    ``wake_wait_alarm_s`` fails it too, and status shows how long it has waited."""
    queue = deployment.settings.queue
    cli = Processes(tmp_path / "cli", {**deployment.env, "DSH_SCHEDULE_WAKE_WAIT_ALARM": "1"})

    def health() -> tuple[int, str]:
        result = cli.run("health")
        return result.returncode, result.stdout

    sessions = [deployment.session(f"k{i}") for i in range(2)]
    deployment.open_host(*sessions, run=False)
    deployment.procs.spawn("scheduler", "scheduler")
    deployment.procs.spawn("worker", "worker")
    assert wait_until(lambda: health()[0] == 0), (health(), deployment.procs.describe())

    deployment.procs.kill("worker")
    assert wait_until(lambda: health()[0] == 1), deployment.procs.describe()
    registered = Worker.all(queue=Queue(queue, connection=deployment.client))
    assert len(registered) == 1  # rq's registry still holds the killed worker
    code, out = health()
    assert (code, out) == (1, f"unhealthy: queue {queue!r} has 2 live agent(s) and no "
                              "beating worker (its 1 registered worker(s) stopped beating: "
                              "killed, or hung)\n")
    report = json.loads(cli.run("status", "--json").stdout)
    assert [w["beating"] for w in report["queues"][0]["workers"]] == [False]

    # A reminder comes due: the scheduler moves its wake to the queue, where it waits.
    deployment.call(sessions[0], "schedule_create", {"prompt": "p", "after_seconds": 1})
    assert wait_until(lambda: "a wake has waited" in health()[1]), health()
    report = json.loads(cli.run("status", "--json").stdout)
    assert report["oldestQueuedSeconds"] > 1
    assert report["queues"][0]["oldestQueuedSeconds"] == report["oldestQueuedSeconds"]
    assert report["queues"][0]["queuedJobs"] >= 1
    text = cli.run("status").stdout
    assert "queued wakes: " in text and "NOT BEATING" in text


def test_health_without_redis_is_unhealthy_not_an_input_error(tmp_path: Path) -> None:
    procs = Processes(tmp_path, process_env(f"redis://127.0.0.1:{free_port()}/0", tmp_path))
    result = procs.run("health", "--redis-wait", "0.3")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("unhealthy: Redis at 127.0.0.1:")
    assert result.stdout.count("\n") == 1
    result = procs.run("status", "--redis-wait", "0.3")
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1
