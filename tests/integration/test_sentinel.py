"""Redis behind Sentinel (docs/architecture.md#sentinel): every process takes a
``redis+sentinel://`` URL, and a failover in the middle of a run — the replica promoted
while reminders fall due before, during and after it — loses, duplicates and delays
nothing beyond the failover itself.

The deployment is real: a primary, a replica and three sentinels, each a redis-server
process on a free loopback port (``tests/sentinel_servers.py``), and real ``dsh-schedule
host``, ``worker`` and ``scheduler`` processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import (
    connect,
    location,
    parse_sentinel_url,
)
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.integration.test_cli import cli, one_line_error
from tests.sentinel_servers import SentinelGroup
from tests.support import (
    Processes,
    delivered_counts,
    dispatch_counts,
    process_env,
    wait_until,
)

SESSION = "sentinel-s1"
REMINDERS = 6
SPACING_S = 2  # the reminders fall due this far apart, the failover among them
ON_TIME_S = 3  # how late a reminder may be beyond the failover itself (a mover interval, a wake)
DUPLICATE_WATCH_S = 4
TIMINGS = {
    "LEASE_TTL": "6", "LEASE_RENEW": "2", "LOCK_TTL": "2", "MAINTENANCE_TTL": "2",
    "MOVER_INTERVAL": "0.1", "RECONCILE_INTERVAL": "2",
}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.mark.parametrize(("url", "named"), [
    ("redis+sentinel://a:26379,b:26380,[::1]:26381/schedule/2",
     ((("a", 26379), ("b", 26380), ("::1", 26381)), "schedule", 2, None, None)),
    ("redis+sentinel://:p%40ss@a:26379/schedule", ((("a", 26379),), "schedule", 0, None, "p@ss")),
    ("REDIS+SENTINEL://user:pw@a:1/s/", ((("a", 1),), "s", 0, "user", "pw")),
])
def test_a_sentinel_url_names_the_sentinels_service_database_and_credentials(
        url: str, named: tuple[object, ...]) -> None:
    assert tuple(parse_sentinel_url(url)) == named
    assert "pw" not in location(url) and "p@ss" not in location(url)


@pytest.mark.parametrize("url", [
    "redis+sentinel://a:26379", "redis+sentinel://a:26379/", "redis+sentinel://a/s",
    "redis+sentinel://a:26379/s/x", "redis+sentinel://a:26379/s/0/1",
    "redis+sentinel://a:99999/s", "redis+sentinel://a:26379/s?x=1",
])
def test_a_malformed_sentinel_url_is_one_line_naming_the_form(url: str) -> None:
    with pytest.raises(ValueError, match="a Sentinel URL is redis"):
        parse_sentinel_url(url)
    line = one_line_error(cli("rebuild", "--redis", url.replace("a:", ":secret@a:", 1)
                              if "@" not in url else url, "--redis-wait", "0"))
    assert "the Redis URL is not usable" in line and "secret" not in line


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "sentinel")
    try:
        yield group.start()
    finally:
        group.close()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["asked", "primary-killed"])
def test_a_failover_mid_run_loses_duplicates_and_delays_nothing(
        tmp_path: Path, sentinel_group: SentinelGroup, how: str) -> None:
    """Asked for (``SENTINEL FAILOVER``: the primary hands over once the replica caught
    up) or forced (the primary SIGKILLed: the sentinels agree it is down, then promote)."""
    group = sentinel_group
    sessions = tmp_path / "sessions"
    env = process_env(group.url, sessions, PREFIX="sentinel:", QUEUE="sentinel", **TIMINGS)
    procs = Processes(tmp_path, env)
    store = JsonlStore(sessions)
    client = connect(group.url, socket_timeout=5)
    settings = Settings.from_env(env)
    coordination = Coordination(client, settings)
    try:
        # given a host, a worker and a scheduler, all told only the sentinels' addresses
        assert procs.run("session", "create", SESSION).returncode == 0
        procs.spawn("host", "host", SESSION)
        procs.spawn("worker", "worker")
        procs.spawn("scheduler", "scheduler")
        assert wait_until(lambda: bool(coordination.leases.live_among([SESSION], now_ms=_now_ms())),
                          timeout=30), "the host never took its lease\n" + procs.describe()

        # and reminders falling due every SPACING_S seconds around the failover
        failover_at_ms = _now_ms() + 10_000
        # (half of them before it; the next one half a second after it starts)
        first_ms = failover_at_ms - (REMINDERS // 2) * SPACING_S * 1000 + 500
        due: dict[str, int] = {}
        tools = ScheduleTools(store, coordination, settings=settings, clock=wall_clock_ms)
        for n in range(REMINDERS):  # as `dsh-schedule call` would, without its start-up
            at_ms = first_ms + n * SPACING_S * 1000
            created = tools.call(SESSION, "schedule_create",
                                 {"prompt": f"reminder {n}", "at": format_instant(at_ms)})
            assert not created.is_error, created.content
            due[json.loads(created.content)["id"]] = at_ms
        assert _now_ms() < first_ms - 1000, "creating the reminders took too long"

        # when the replica is promoted while they fall due
        time.sleep(max(0.0, (failover_at_ms - _now_ms()) / 1000))
        old_primary = group.primary_port()
        started_ms = _now_ms()
        new_primary = group.failover(kill=how == "primary-killed")
        ended_ms = _now_ms()
        assert new_primary != old_primary

        # then each is delivered once, late by no more than the failover itself
        everything = wait_until(
            lambda: set(delivered_counts(store, SESSION)) == set(due), timeout=60)
        time.sleep(DUPLICATE_WATCH_S)
        dispatched = {e.data["id"]: e.time for e in store.read(SESSION).events
                      if e.type == "schedule/change" and e.data["operation"] == "dispatch"}
        late_s = {sid: (dispatched.get(sid, _now_ms()) - at) / 1000 for sid, at in due.items()}
        allowed_s = {sid: ON_TIME_S + (ended_ms - at) / 1000 if started_ms <= at < ended_ms
                     else ON_TIME_S for sid, at in due.items()}
        picture = (
            f"{how}: failover {started_ms - first_ms} to {ended_ms - first_ms} ms after the first "
            f"due moment; due at {[at - first_ms for at in due.values()]} ms; late (s) "
            f"{late_s}; allowed (s) {allowed_s}; deliveries "
            f"{dict(delivered_counts(store, SESSION))}; dispatches "
            f"{dict(dispatch_counts(store, SESSION))}\n{procs.describe()}")
        assert not procs.dead(), picture
        assert everything, picture
        assert delivered_counts(store, SESSION) == dict.fromkeys(due, 1), picture
        assert dispatch_counts(store, SESSION) == dict.fromkeys(due, 1), picture
        assert all(0 <= late_s[sid] <= allowed_s[sid] for sid in due), picture
        assert any(at < started_ms for at in due.values()), picture  # some before,
        assert any(at > ended_ms for at in due.values()), picture  # and some after it
        print("\n" + picture.splitlines()[0])  # the figures, with -s
        checked = procs.check(sessions)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        health = procs.run("health")
        assert health.returncode == 0, health.stdout + health.stderr
    finally:
        client.close()
        procs.close()
