"""A Redis outage under real processes: ``dsh-schedule host``, ``worker`` and ``scheduler``
keep running while their Redis is gone for half a minute and comes back empty, and the
reminder that fell due meanwhile is delivered exactly once after it is back.

The Redis is one this test starts on a port of its own (``tests/redis_server.py``); it is
killed, so everything it held is lost, as after a crash of a Redis without persistence.
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
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SESSION = "outage-s1"
DUE_AFTER_S = 8  # falls due while Redis is down
OUTAGE_S = 30  # spans many lease renewals and the lease's whole time to live
BACK_WITHIN_S = 10  # the brief's bound from Redis being back to the delivery
DUPLICATE_WATCH_S = 4  # a second delivery would show up in this time

TIMINGS = {
    "LEASE_TTL": "6",
    "LEASE_RENEW": "2",
    "LOCK_TTL": "2",
    "MAINTENANCE_TTL": "2",
    "MOVER_INTERVAL": "0.1",
    "RECONCILE_INTERVAL": "2",
}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.timeout(180)
def test_processes_ride_out_an_outage_and_deliver_once_when_redis_is_back(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    sessions = tmp_path / "sessions"
    env = process_env(redis_server.url(), sessions, PREFIX="outage:", QUEUE="outage",
                      **TIMINGS)
    procs = Processes(tmp_path, env)
    store = JsonlStore(sessions)
    client = redis_server.client()
    coordination = Coordination(client, Settings.from_env(env))
    try:
        assert procs.run("session", "create", SESSION).returncode == 0
        procs.spawn("host", "host", SESSION)
        procs.spawn("worker", "worker")
        procs.spawn("scheduler", "scheduler")
        assert wait_until(
            lambda: bool(coordination.leases.live_among([SESSION], now_ms=_now_ms()))), (
            "the host never took its lease\n" + procs.describe())

        created = procs.run("call", SESSION, "schedule_create",
                            json.dumps({"prompt": "through the outage",
                                        "after_seconds": DUE_AFTER_S}))
        assert created.returncode == 0, created.stdout + created.stderr
        schedule_id = json.loads(created.stdout)["id"]

        redis_server.kill()
        time.sleep(OUTAGE_S)
        died_during_outage = sorted(procs.dead())
        redis_server.start()  # same port, empty

        delivered_in_time = wait_until(
            lambda: delivered_counts(store, SESSION)[schedule_id] >= 1, timeout=BACK_WITHIN_S)
        time.sleep(DUPLICATE_WATCH_S)
        picture = (
            f"died while Redis was down: {died_during_outage}; "
            f"delivered within {BACK_WITHIN_S} s of Redis being back: {delivered_in_time}; "
            f"deliveries {dict(delivered_counts(store, SESSION))}; "
            f"dispatches {dict(dispatch_counts(store, SESSION))}\n{procs.describe()}"
        )
        assert not procs.dead(), "every process must ride out the outage; " + picture
        assert delivered_in_time, picture
        assert delivered_counts(store, SESSION) == {schedule_id: 1}, picture
        assert dispatch_counts(store, SESSION) == {schedule_id: 1}, picture
        checked = procs.check(sessions)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    finally:
        client.close()
        procs.close()
