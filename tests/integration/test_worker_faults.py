"""A worker's own faults under real processes (docs/architecture.md#a-dead-workers-wakes,
docs/architecture.md#outages): a worker killed inside a due transaction has its wakes
taken over from its own liveness, not by the reconcile sweep; a worker re-registers once
Redis lost its registration; a Redis refusing writes is ridden out like a lost one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.integration.test_processes import CRASH_ENV, Cluster
from tests.redis_server import RedisServer
from tests.support import (
    Processes,
    dispatch_records,
    process_env,
    refuse_writes,
    reminder_texts,
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

# Today's only other ways back to an abandoned wake: the reconcile pass (its projection
# slice, the stale-followup check, the sweep) every RECONCILE_INTERVAL, and the sweep's
# period. Both far past the wait below, so only the dead worker's own recovery can
# deliver in time.
NO_SWEEP = {
    "DSH_SCHEDULE_RECONCILE_INTERVAL": "600",
    "DSH_SCHEDULE_SWEEP_PERIOD": "600",
    "DSH_SCHEDULE_FOLLOWUP_STALE": "600",
}
# Lock and maintenance TTLs are 2 s in the cluster, so the worker is taken for dead 1 s
# after its last beat and its agents can be woken again 2 s after it took them.
RECOVERED_WITHIN_S = 20


@pytest.fixture
def quiet_cluster(tmp_path: Path, real_redis: redis.Redis) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, real_redis)
    cluster.env.update(NO_SWEEP)
    yield cluster
    cluster.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", ["before-followup", "after-followup", "after-append"])
def test_a_killed_workers_reminder_is_delivered_once_without_the_sweep(
    quiet_cluster: Cluster, point: str
) -> None:
    cluster = quiet_cluster
    sessions = [cluster.session(f"s{i}") for i in range(2)]
    crashing = cluster.spawn("worker", **{CRASH_ENV: point})
    cluster.spawn("scheduler")
    cluster.start_host(*sessions)
    for session in sessions:
        cluster.call(session, "schedule_create", {"prompt": f"p-{session}", "after_seconds": 2})
    assert wait_until(lambda: crashing.poll() is not None, 20)
    assert crashing.returncode == -signal.SIGKILL
    cluster.spawn("worker")
    assert wait_until(
        lambda: all(len(reminder_texts(cluster.store, s)) == 1 for s in sessions),
        RECOVERED_WITHIN_S,
    ), (cluster.root / "scheduler-1.log").read_text()
    time.sleep(3.0)
    for session in sessions:
        assert len(reminder_texts(cluster.store, session)) == 1
        assert len(dispatch_records(cluster.store, session)) == 1
    log = (cluster.root / "scheduler-1.log").read_text()
    assert "stopped beating while it held wake" in log
    keys = Keys(cluster.settings.prefix)
    # The dead worker is forgotten, and so is the rq job it held: rq's own clean-up will
    # not file it as failed later.
    assert cluster.client.hlen(keys.worker_holds()) == 0
    assert cluster.client.zcard(f"rq:wip:{cluster.settings.queue}") == 0
    assert cluster.check().returncode == 0


# -- registration and error replies, on a Redis of the test's own ----------------------


def _health(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh_schedule", "health"], env=env,
                          capture_output=True, text=True, timeout=30)


def _registered(client: redis.Redis, queue: str) -> bool:
    members = client.smembers(f"rq:workers:{queue}")
    return any(client.hexists(m, "birth") for m in members) and bool(
        client.smembers("rq:workers"))


TIMINGS = {
    "LEASE_TTL": "6", "LEASE_RENEW": "1", "LOCK_TTL": "6", "MAINTENANCE_TTL": "6",
    "MOVER_INTERVAL": "0.1", "RECONCILE_INTERVAL": "2",
}
BACK_WITHIN_S = 10  # a beat comes every LOCK_TTL / 6 s; the wait leaves room for a slow box


@pytest.mark.timeout(120)
def test_a_running_worker_registers_again_after_redis_lost_everything(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    env = process_env(redis_server.url(), tmp_path / "sessions", PREFIX="reg:", QUEUE="reg",
                      **TIMINGS)
    procs = Processes(tmp_path, env)
    client = redis_server.client()
    try:
        # A live agent on the queue: health then needs a worker there, not only the
        # scheduler's heartbeat.
        assert procs.run("session", "create", "reg-s1").returncode == 0
        procs.spawn("host", "host", "reg-s1")
        procs.spawn("worker", "worker")
        procs.spawn("scheduler", "scheduler")
        assert wait_until(lambda: _health(env).returncode == 0, 30), procs.describe()
        client.flushall()
        assert not _registered(client, "reg")
        assert wait_until(lambda: _registered(client, "reg"), BACK_WITHIN_S), procs.describe()
        assert wait_until(lambda: _health(env).returncode == 0, BACK_WITHIN_S), (
            _health(env).stdout)
        redis_server.restart()  # empty, on the same port
        client = redis_server.client()
        assert wait_until(lambda: _registered(client, "reg"), BACK_WITHIN_S), procs.describe()
        assert wait_until(lambda: _health(env).returncode == 0, BACK_WITHIN_S), (
            _health(env).stdout)
        assert not procs.dead(), procs.describe_dead()
        # The hash is rq's whole registration again, as ``rq info`` and ``status`` read it.
        (member,) = client.smembers("rq:workers:reg")
        assert client.hget(member, "state") in (b"idle", b"busy")
        assert client.hget(member, "queues") == b"reg"
        log = procs.logs["worker"][-1].read_text()
        assert "registered again" in log
    finally:
        codes = procs.close()
    assert codes["worker"] == 0


# rq's worker writes while it waits for a job only once per dequeue timeout (its TTL less
# 15 s: 15 s for ours), so the refusal outlasts one.
REFUSAL_S = 18


@pytest.mark.timeout(150)
@pytest.mark.parametrize("refusal", ["oom", "noreplicas"])
def test_a_worker_rides_out_a_redis_that_refuses_writes(
    tmp_path: Path, redis_server: RedisServer, refusal: str
) -> None:
    sessions = tmp_path / "sessions"
    env = process_env(redis_server.url(), sessions, PREFIX="ref:", QUEUE="ref", **TIMINGS)
    procs = Processes(tmp_path, env)
    client = redis_server.client()
    store = JsonlStore(sessions)
    settings = Settings.from_env(env)
    store.create(SessionHeader(id="r1", createdAt=0))
    host = ReferenceHost(store, Coordination(client, settings), settings)
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), daemon=True)
    try:
        procs.spawn("worker", "worker")
        assert wait_until(lambda: _registered(client, "ref"), 20), procs.describe()
        restore = refuse_writes(client, refusal.upper())
        time.sleep(REFUSAL_S)
        restore()
        assert procs.procs["worker"].poll() is None, procs.describe()
        # Only now the rest of the system: the worker is what this test is about.
        procs.spawn("scheduler", "scheduler")
        host.open_root("r1")
        thread.start()
        _definition, handler = host.agents["r1"].tools["schedule_create"]
        assert not handler({"prompt": "after the refusal", "after_seconds": 1}).is_error
        assert wait_until(lambda: len(reminder_texts(store, "r1")) == 1, 30), procs.describe()
        assert procs.procs["worker"].poll() is None, procs.describe()
        log = procs.logs["worker"][-1].read_text()
        assert "Traceback" not in log, log
        assert log.count("Redis unavailable") == 1, log
        assert log.count("Redis is back") == 1, log
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(10)
        codes = procs.close()
    assert codes["worker"] == 0
