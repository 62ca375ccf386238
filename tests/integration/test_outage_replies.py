"""A Redis that answers but refuses writes, under real processes: ``dsh-schedule host`` and
``dsh-schedule scheduler`` keep running while their Redis answers OOM (``maxmemory`` under
``noeviction``), NOREPLICAS (``min-replicas-to-write``) or READONLY (made a replica of a
master that is not there, as after a failover), each say so in one line when it starts
and one when it ends, and the reminder that fell due meanwhile is delivered exactly once
afterwards (docs/architecture.md#outages).

The Redis is one this test starts on a port of its own (``tests/redis_server.py``), so
reconfiguring it touches nothing else. The worker starts once Redis takes writes again:
riding out the refusal inside rq's own loop is the worker's part, tested with it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.redis_server import RedisServer
from tests.support import (
    Processes,
    delivered_counts,
    dispatch_counts,
    process_env,
    refuse_writes,
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SESSION = "refusal-s1"
DUE_AFTER_S = 3  # falls due while Redis refuses writes
REFUSAL_S = 8  # spans several lease renewals and mover and reconcile passes
DUPLICATE_WATCH_S = 3  # a second delivery would show up in this time

TIMINGS = {
    "LEASE_TTL": "6",
    "LEASE_RENEW": "2",
    "LOCK_TTL": "2",
    "MAINTENANCE_TTL": "2",
    "TURN_TTL": "4",
    "MOVER_INTERVAL": "0.1",
    "RECONCILE_INTERVAL": "2",
}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _lines(procs: Processes, name: str, text: str) -> int:
    log = procs.logs[name][-1].read_text(encoding="utf-8", errors="replace")
    return sum(text in line for line in log.splitlines())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["OOM", "NOREPLICAS", "READONLY"])
def test_host_and_scheduler_ride_out_an_error_reply_and_deliver_once_afterwards(
    how: str, tmp_path: Path, redis_server: RedisServer
) -> None:
    sessions = tmp_path / "sessions"
    env = process_env(redis_server.url(), sessions, PREFIX="refusal:", QUEUE="refusal",
                      **TIMINGS)
    procs = Processes(tmp_path, env)
    store = JsonlStore(sessions)
    client = redis_server.client()
    coordination = Coordination(client, Settings.from_env(env))
    try:
        # given a host and a scheduler serving a session with a reminder due soon
        assert procs.run("session", "create", SESSION).returncode == 0
        procs.spawn("host", "host", SESSION)
        procs.spawn("scheduler", "scheduler")
        assert wait_until(
            lambda: bool(coordination.leases.live_among([SESSION], now_ms=_now_ms()))), (
            "the host never took its lease\n" + procs.describe())
        created = procs.run("call", SESSION, "schedule_create",
                            json.dumps({"prompt": "through the refusal",
                                        "after_seconds": DUE_AFTER_S}))
        assert created.returncode == 0, created.stdout + created.stderr
        schedule_id = json.loads(created.stdout)["id"]

        # when Redis refuses every write for a while, the reminder falling due meanwhile
        restore = refuse_writes(client, how)
        try:
            time.sleep(REFUSAL_S)
            died_during_refusal = procs.dead()
        finally:
            restore()
        procs.spawn("worker", "worker")

        # then both kept running, the reminder is delivered exactly once, and each said
        # once that Redis went away and once that it was back
        delivered = wait_until(
            lambda: delivered_counts(store, SESSION)[schedule_id] >= 1, timeout=30)
        time.sleep(DUPLICATE_WATCH_S)
        picture = (
            f"died while Redis refused writes: {died_during_refusal}; "
            f"deliveries {dict(delivered_counts(store, SESSION))}; "
            f"dispatches {dict(dispatch_counts(store, SESSION))}\n{procs.describe()}"
        )
        assert died_during_refusal == {}, picture
        assert not procs.dead(), picture
        assert delivered, picture
        assert delivered_counts(store, SESSION) == {schedule_id: 1}, picture
        assert dispatch_counts(store, SESSION) == {schedule_id: 1}, picture
        for name in ("host", "scheduler"):
            # (the backoff between tries is at most 5 s)
            assert wait_until(lambda name=name: _lines(procs, name, f"{name}: Redis is back")
                              >= 1, timeout=10), picture
            assert _lines(procs, name, f"{name}: Redis unavailable") == 1, picture
            assert _lines(procs, name, f"{name}: Redis is back") == 1, picture
            assert _lines(procs, name, "Traceback") == 0, picture
        assert not procs.dead(), procs.describe()
        checked = procs.check(sessions)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        client.close()
        procs.close()
