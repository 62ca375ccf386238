"""Outages of a PostgreSQL server of the test's own (``tests/postgres_private.py``;
docs/architecture.md#outages): restarted or crashed under real processes mid-burst (``dsh-schedule
host``, ``worker`` and ``scheduler`` keep running while it is down; every reminder due
around it is delivered exactly once), and its disk full (a tmpfs of its own: the tool call answers
``persistence_uncertain`` and changes nothing, a due reminder waits, and once space
returns it is delivered once). Each outage is said once when it starts and once when it
ends.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import USER_MESSAGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.naming import close_store
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.store.postgres import PostgresStore
from dsh_schedule.worker.due import DueOwner
from dsh_schedule.worker.outcome import WakeOutcome
from tests.postgres_private import PrivateServer, private_server
from tests.postgres_server import in_ci
from tests.redis_server import RedisServer
from tests.support import (
    Processes,
    delivered_counts,
    dispatch_counts,
    new_session,
    process_env,
    value,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

AGENTS = 30
REMINDERS = 2  # each agent's, due at different moments of the burst
SPREAD_MS = 4000  # the burst's due moments spread over this
CRASH_AT_MS = 1500  # into the burst
DOWN_S = 4.0
DELIVERED_WITHIN_S = 90.0
DUPLICATE_WATCH_S = 4.0
# What an operation that met the outage failed with.
CAUSES = ("PoolTimeout", "OperationalError", "AdminShutdown", "ConnectionTimeout")

TIMINGS = {
    "LEASE_TTL": "6",
    "LEASE_RENEW": "2",
    "LOCK_TTL": "2",
    "MAINTENANCE_TTL": "2",
    "MOVER_INTERVAL": "0.1",
    "RECONCILE_INTERVAL": "2",
}


@pytest.fixture
def server() -> Iterator[PrivateServer]:
    # The server writes what asynchronous commits leave in its memory only every 10 s, so a
    # crash loses every commit of the burst that no synchronous commit made durable after.
    with private_server(wal_writer_delay="10s", wal_writer_flush_after="0") as server:
        yield server


def _agents() -> list[str]:
    return [f"burst-{i:02d}" for i in range(AGENTS)]


def _create_burst(store: PostgresStore, coordination: Coordination, settings: Settings,
                  base_ms: int) -> dict[str, list[str]]:
    """Each agent's reminders, due from ``base_ms`` on, spread over ``SPREAD_MS``."""
    tools = ScheduleTools(store, coordination, settings, wall_clock_ms)
    created: dict[str, list[str]] = {}
    for index, agent in enumerate(_agents()):
        for k in range(REMINDERS):
            step = (index * REMINDERS + k) * SPREAD_MS // (AGENTS * REMINDERS)
            result = tools.call(agent, "schedule_create", {
                "prompt": f"{agent} #{k}", "at": format_instant(base_ms + step)})
            assert not result.is_error, result.content
            created.setdefault(agent, []).append(value(result.content)["id"])
    tools.close()
    return created


def _counts(store: PostgresStore, created: dict[str, list[str]]
            ) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    delivered: Counter[tuple[str, str]] = Counter()
    dispatched: Counter[tuple[str, str]] = Counter()
    for agent in created:
        delivered.update({(agent, k): n for k, n in delivered_counts(store, agent).items()})
        dispatched.update({(agent, k): n for k, n in dispatch_counts(store, agent).items()})
    return delivered, dispatched


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["stop", "crash"])
def test_a_postgres_restart_mid_burst_loses_nothing_and_duplicates_nothing(
    tmp_path: Path, redis_server: RedisServer, server: PrivateServer, how: str
) -> None:
    """The server stops (a fast shutdown: every commit kept) or crashes (an immediate
    shutdown: the asynchronous commits it had not written are lost, with ``wal_writer_delay``
    long enough that the burst's are) and starts again."""
    # given: a host of every agent, a worker and a scheduler on the private server
    env = process_env(redis_server.url(), tmp_path / "unused", STORE=server.url,
                      PREFIX="pgr:", QUEUE="pgr", **TIMINGS)
    settings = Settings.from_env(env)
    store = PostgresStore(server.url, timeout_s=2)
    procs = Processes(tmp_path, env)
    client = redis_server.client()
    coordination = Coordination(client, settings)
    try:
        for agent in _agents():
            store.create(SessionHeader(id=agent, createdAt=wall_clock_ms()))
        procs.spawn("host", "host", *_agents())
        procs.spawn("worker", "worker")
        procs.spawn("scheduler", "scheduler")
        deadline = time.monotonic() + 60
        while coordination.leases.live_among(_agents(), now_ms=wall_clock_ms()) != _agents():
            assert time.monotonic() < deadline, "the host took no lease\n" + procs.describe()
            time.sleep(0.2)
        base_ms = wall_clock_ms() + 8000
        created = _create_burst(store, coordination, settings, base_ms)
        expected = Counter({(a, k): 1 for a, ids in created.items() for k in ids})
        assert wall_clock_ms() < base_ms, "the set-up took past the burst; raise its lead"
        # when: the server is restarted mid-burst (a fast shutdown: every connection cut,
        # every commit kept) and answers again after DOWN_S
        time.sleep((base_ms + CRASH_AT_MS - wall_clock_ms()) / 1000)
        server.stop() if how == "stop" else server.crash()
        time.sleep(DOWN_S)
        server.start()
        # then every reminder is delivered, once
        deadline = time.monotonic() + DELIVERED_WITHIN_S
        delivered, dispatched = Counter(), Counter()
        while time.monotonic() < deadline:
            try:
                delivered, dispatched = _counts(store, created)
            except OSError:
                pass  # the pool reconnects after its own backoff
            if set(delivered) == set(expected):
                break
            time.sleep(0.5)
        time.sleep(DUPLICATE_WATCH_S)
        delivered, dispatched = _counts(store, created)
        with PostgresStore(server.url) as fresh:  # what a store with nothing kept reads
            fresh_counts = _counts(fresh, created)
            missing = sorted(set(expected) - set(delivered))
            logs = {agent: [(e.seq, e.type, str(e.data)[:120]) for e in fresh.read(agent).events]
                    for agent, _ in missing}
        picture = (f"delivered {len(delivered)} of {len(expected)}; duplicates "
                   f"{ {k: n for k, n in delivered.items() if n > 1} }; missing {missing}; "
                   f"a fresh store reads the same: {fresh_counts == (delivered, dispatched)}; "
                   f"their logs {logs}\n{procs.describe()}")
        assert not procs.dead(), "every process must ride out the restart; " + picture
        assert delivered == expected, picture
        assert dispatched == expected, picture
        # and each process said the outage once when it started and once when it ended,
        # and no failure of it per agent (what the crash lost is said for its agent)
        for name in ("host", "worker"):
            log = procs.logs[name][-1].read_text(errors="replace")
            assert log.count("PostgreSQL session store unavailable (EIO") == 1, (name, log)
            assert log.count("PostgreSQL session store is back after") == 1, (name, log)
            per_agent = [line for line in log.splitlines() if "session store unavailable"
                         not in line and any(cause in line for cause in CAUSES)]
            assert per_agent == [], (name, per_agent)
    finally:
        client.close()
        procs.close()
        store.close()


def test_every_flushed_append_survives_a_crash_of_the_server(server: PrivateServer) -> None:
    # given appends to a session, each flushed (the barrier a tool call answers after)
    with PostgresStore(server.url, timeout_s=2) as store:
        session = new_session(store)
        for seq in range(5):
            store.append(session, [NewEvent(type=USER_MESSAGE, time=0, data={
                "content": [{"type": "text", "text": f"m{seq}"}]})], seq)
            store.flush(session)
    # when the server crashes: what it had not written to its disk is lost
    server.crash()
    server.start()
    # then every flushed append is there
    with PostgresStore(server.url, timeout_s=2) as fresh:
        texts = [e.data["content"][0]["text"] for e in fresh.read(session).events]
    assert texts == [f"m{seq}" for seq in range(5)]


# -- a full disk on the server ----------------------------------------------------------

SMALL_DISK_MB = 64


@pytest.fixture
def small_disk_server() -> Iterator[PrivateServer]:
    if os.geteuid() != 0:
        reason = ("a full server disk needs a tmpfs of its own, which only root may mount"
                  " (CI runs as root)")
        if in_ci():
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    with private_server(small_disk_mb=SMALL_DISK_MB) as server:
        yield server


def _fill(server: PrivateServer, store: SessionStore) -> None:
    """Fill the server's disk, then the free room in its tables' pages, until even a small
    row needs a page the disk cannot give."""
    assert server.mount is not None
    with (server.mount / "filler").open("wb") as filler:
        try:
            while True:
                filler.write(bytes(1 << 16))
        except OSError:
            pass
        try:
            filler.close()
        except OSError:
            pass
    new_session(store, "ballast")
    text = "x" * 64
    for seq in range(20_000):
        try:
            store.append("ballast", [NewEvent(type=USER_MESSAGE, time=0, data={
                "content": [{"type": "text", "text": text}]})], seq)
        except OSError:
            return
    raise AssertionError("the server's disk never filled")


def _free(server: PrivateServer) -> None:
    assert server.mount is not None
    (server.mount / "filler").unlink()


def test_a_full_server_disk_is_an_outage_said_once_and_the_reminder_waits_for_space(
    small_disk_server: PrivateServer, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a reminder due in a second, its agent live, on a server whose disk then fills
    caplog.set_level(logging.INFO)
    store = PostgresStore(small_disk_server.url, timeout_s=2)
    coordination = Coordination(fakeredis.FakeRedis(server=fakeredis.FakeServer()), settings)
    tools = ScheduleTools(store, coordination, settings, wall_clock_ms)
    owner = DueOwner(PostgresStore(small_disk_server.url, timeout_s=2), coordination,
                     settings, clock=wall_clock_ms)
    try:
        session = new_session(store, "s1")
        coordination.leases.install("host", [session], settings.queue,
                                    now_ms=wall_clock_ms(), ttl_s=3600)
        first = tools.call(session, "schedule_create", {"prompt": "due", "after_seconds": 1})
        assert not first.is_error, first.content
        _fill(small_disk_server, store)
        # when a tool call and the due wake meet the full disk
        refused = tools.call(session, "schedule_create", {"prompt": "no", "after_seconds": 1})
        time.sleep(1.2)
        waited = owner.wake([(session, None)])[session]
        # then the call is not confirmed, and nothing was written or dispatched
        assert json.loads(refused.content)["code"] == "persistence_uncertain"
        assert waited is not WakeOutcome.SETTLED
        assert dispatch_counts(store, session) == Counter()
        assert [r.id for r in store.load(session)[1].active] == ["schedule-1"]
        # when space returns, the reminder is dispatched once, and the same call succeeds
        _free(small_disk_server)
        assert owner.wake([(session, None)])[session] is WakeOutcome.SETTLED
        assert owner.wake([(session, None)])[session] is WakeOutcome.SETTLED
        assert dispatch_counts(store, session) == Counter({"schedule-1": 1})
        again = tools.call(session, "schedule_create", {"prompt": "no", "after_seconds": 60})
        assert value(again.content)["id"] == "schedule-2"
    finally:
        tools.close()
        close_store(owner._store)
        store.close()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # each store (the tools', the worker's) says it once each way; the refused tool call
    # is said for itself, as its answer is
    assert sum("session store unavailable (ENOSPC" in m for m in said) == 2, said
    assert sum("session store is back" in m for m in said) == 2, said
    assert [m for m in said if "DiskFull" in m and "unavailable" not in m] == [
        "append failed for s1: cannot append to session 's1': DiskFull"], said
