"""Idle cost flat in the number of agents (docs/architecture.md#leases): a host's renewal
and the scheduler's reconcile pass send Redis the same commands whatever the number of
agents; a dead host's agents are taken over; a flush is found by the generation marker; a
re-arm that failed after a durable create is owed and repaid once Redis answers.

Each test runs on a redis-server of its own, with real worker and scheduler processes
where a reminder has to be delivered."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler.process import Reconciler
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.store.port import SessionStore
from tests.redis_server import RedisServer
from tests.support import (
    FakeClock,
    Processes,
    delivered_counts,
    new_session,
    process_env,
    refuse_writes,
    reminder_texts,
    value,
    wait_until,
)

pytestmark = [pytest.mark.redis]


def _calls(client: redis.Redis) -> dict[str, int]:
    stats: Any = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def _delta(client: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = _calls(client)
    return {name: n - before.get(name, 0) for name, n in after.items()
            if n - before.get(name, 0) and name != "info"}


# -- commands per renewal and per reconcile pass --------------------------------------------


def _host_with(count: int, client: redis.Redis, settings: Settings,
               clock: FakeClock) -> ReferenceHost:
    store = MemoryStore()
    host = ReferenceHost(store, Coordination(client, settings), settings, clock=clock)
    host.open_roots([new_session(store, f"idle-{i:05d}") for i in range(count)])
    return host


def test_a_renewal_and_a_reconcile_pass_send_the_same_commands_for_50_or_5000_agents(
    redis_server: RedisServer, settings: Settings
) -> None:
    # given two hosts under prefixes of their own on one Redis: 50 idle agents, and 5 000
    client = redis_server.client()
    clock = FakeClock()
    per_host: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
    for count in (50, 5_000):
        own = msgspec.structs.replace(settings, prefix=f"idle-{count}:",
                                      queue=f"idle-{count}")
        host = _host_with(count, client, own, clock)
        reconciler = Reconciler(host.coordination, own)
        reconciler.rebuild(now_ms=clock())
        host.plugin.renew_leases()
        reconciler.reconcile(now_ms=clock())  # the scripts are loaded
        # when the host renews three times, and the scheduler runs three passes 20 s apart
        renewals: dict[str, int] = {}
        passes: dict[str, int] = {}
        for _ in range(3):
            clock.advance(20)
            before = _calls(client)
            assert host.plugin.renew_leases() == []
            for name, n in _delta(client, before).items():
                renewals[name] = renewals.get(name, 0) + n
            before = _calls(client)
            assert reconciler.reconcile(now_ms=clock()).woken == ()
            for name, n in _delta(client, before).items():
                passes[name] = passes.get(name, 0) + n
        per_host[count] = (renewals, passes)
    # then both send Redis exactly the same commands: none per agent
    assert per_host[50] == per_host[5_000]
    renewals, passes = per_host[5_000]
    assert sum(renewals.values()) <= 3 * 5  # one script call: ZSCORE, ZADD, SCARD, HGET
    assert sum(passes.values()) < 3 * 10


class _CountingServed(dict[str, None]):
    """A bridge's served agents, counting every agent an iteration hands out."""

    visited = 0

    def __iter__(self) -> Iterator[str]:
        for agent in super().__iter__():
            self.visited += 1
            yield agent


def test_a_renewal_walks_none_of_the_agents_a_host_serves(
    redis_server: RedisServer, settings: Settings
) -> None:
    """A renewal that finds every lease in place costs the host no walk over its agents,
    nor a copy of them (it compares two counts)."""
    clock = FakeClock()
    host = _host_with(2_000, redis_server.client(), settings, clock)
    bridge = host.plugin.bridge
    counting = _CountingServed(bridge._served)
    bridge._served = counting
    for _ in range(3):
        clock.advance(20)
        assert host.plugin.renew_leases() == []
    assert counting.visited == 0


class _CountingDue(dict[str, int]):
    """A bridge's agents to look at later, counting every agent a walk over them reads."""

    visited = 0

    def __iter__(self) -> Iterator[str]:
        for agent in super().__iter__():
            self.visited += 1
            yield agent

    def items(self) -> Any:
        self.visited += len(self)
        return super().items()

    def values(self) -> Any:
        self.visited += len(self)
        return super().values()


def test_a_look_for_ready_agents_walks_none_of_those_not_due(
    redis_server: RedisServer, settings: Settings
) -> None:
    """``ready`` takes the agents whose own check has come, earliest first, without a walk
    over the thousands still waiting for theirs; they come, in the order asked, once due."""
    clock = FakeClock()
    host = _host_with(2_000, redis_server.client(), settings, clock)
    bridge = host.plugin.bridge
    bridge.ready(0)  # the looks every install asked for
    agents = bridge.served
    bridge.later(agents, 60.0)
    counting = _CountingDue(bridge._due)
    bridge._due = counting
    for _ in range(3):
        clock.advance(10)
        assert bridge.ready(0) == []
    assert counting.visited == 0
    clock.advance(31)
    assert bridge.ready(0) == agents
    assert bridge.ready(0) == []


# -- processes ------------------------------------------------------------------------------


class Deployment:
    """A worker and a scheduler process on a Redis of the test's own, and hosts in the
    test (each a ``ReferenceHost`` in a thread) sharing one sessions directory."""

    def __init__(self, root: Path, server: RedisServer, **timings: str) -> None:
        self.sessions = root / "sessions"
        timings = {"LOCK_TTL": "2", "MAINTENANCE_TTL": "2", "LEASE_TTL": "4",
                   "LEASE_RENEW": "1", "MOVER_INTERVAL": "0.1", "RECONCILE_INTERVAL": "1",
                   **timings}
        self.env = process_env(server.url(), self.sessions, PREFIX="idle:", QUEUE="idle",
                               **timings)
        self.settings = Settings.from_env(self.env)
        self.client = server.client()
        self.store = JsonlStore(self.settings.sessions)
        self.procs = Processes(root, self.env)
        self._hosts: list[tuple[ReferenceHost, threading.Event, threading.Thread]] = []

    def start(self) -> None:
        self.procs.spawn("worker", "worker")
        self.procs.spawn("scheduler", "scheduler")

    def host(self, *sessions: str, store: SessionStore | None = None) -> ReferenceHost:
        host = ReferenceHost(store or self.store, Coordination(self.client, self.settings),
                             self.settings)
        host.open_roots(list(sessions))
        stop = threading.Event()
        thread = threading.Thread(target=host.run, args=(stop,), kwargs={"poll_s": 0.2},
                                  daemon=True)
        thread.start()
        self._hosts.append((host, stop, thread))
        return host

    def die(self, host: ReferenceHost) -> None:
        """The host stops as a killed one does: it renews nothing and disposes nothing."""
        for served, stop, thread in self._hosts:
            if served is host:
                stop.set()
                thread.join(10)

    def close(self) -> None:
        for _host, stop, thread in self._hosts:
            stop.set()
            thread.join(10)
        self.procs.close()


@pytest.fixture
def deployment(tmp_path: Path, redis_server: RedisServer) -> Iterator[Deployment]:
    system = Deployment(tmp_path, redis_server)
    try:
        yield system
    finally:
        system.close()


def _create(host: ReferenceHost, session: str, args: dict[str, Any]) -> Any:
    _definition, handler = host.agents[session].tools["schedule_create"]
    return value(handler(args).content)


@pytest.mark.slow
@pytest.mark.parametrize("taken_over", ["by-another-host", "after-its-lease-expired"])
def test_a_dead_hosts_agent_is_taken_over_and_its_reminder_delivered_once(
    deployment: Deployment, taken_over: str
) -> None:
    # given a host serving s1, with a reminder due in a few seconds, that dies
    deployment.start()
    session = new_session(deployment.store, "s1")
    first = deployment.host(session)
    assert _create(first, session, {"prompt": "stretch", "after_seconds": 6})["id"]
    deployment.die(first)
    leases = first.coordination.leases
    if taken_over == "after-its-lease-expired":
        # the scheduler retires its agents once its lease ran out
        assert wait_until(lambda: not bool(leases.live_among([session], now_ms=first.clock())), 30)
        assert wait_until(lambda: leases.expired_hosts(now_ms=first.clock()) == [], 30)
    # when another host (or the same one, started again: a new host) opens the session
    second = deployment.host(session)
    # then the reminder is delivered once, by the new host
    assert wait_until(lambda: len(reminder_texts(deployment.store, session)) == 1, 60), \
        deployment.procs.describe()
    assert '"stretch"' in reminder_texts(deployment.store, session)[0]
    assert leases.hosts_of([session], now_ms=second.clock()) == [second.plugin.bridge.host]
    deployment.procs.run("rebuild")  # a rebuild's wake on top delivers nothing again
    assert wait_until(lambda: deployment.client.llen("rq:queue:idle") == 0, 30)
    assert list(delivered_counts(deployment.store, session).values()) == [1]


@pytest.mark.slow
def test_a_flush_is_found_by_the_generation_marker_and_every_wake_comes_back(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # given 50 idle agents, each armed a day ahead, whose host renews its lease only
    # every 10 minutes
    system = Deployment(tmp_path, redis_server, LEASE_TTL="1200", LEASE_RENEW="600")
    try:
        system.start()
        sessions = [new_session(system.store, f"a{i:02d}") for i in range(50)]
        host = system.host(*sessions)
        for session in sessions:
            assert _create(host, session, {"prompt": "later", "after_seconds": 86_400})["id"]
        scheduled = host.coordination.keys.scheduled_jobs()
        assert wait_until(lambda: system.client.zcard(scheduled) == 50, 30)
        renewals = []
        renew = host.plugin.renew_leases

        def counted() -> list[str]:
            renewals.append(1)
            return renew()

        host.plugin.renew_leases = counted  # type: ignore[method-assign]
        # when Redis loses everything
        system.client.flushall()
        # then the host finds the marker gone and installs its agents again, whose wakes
        # re-arm every reminder, long before any renewal is due
        assert wait_until(lambda: system.client.zcard(scheduled) == 50, 30), \
            system.procs.describe()
        assert renewals == []
        assert all(bool(host.coordination.leases.live_among([s], now_ms=host.clock()))
                   for s in sessions)
    finally:
        system.close()


@pytest.mark.slow
def test_a_rearm_that_failed_after_a_durable_delete_is_repaid_when_redis_is_back(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # given a host whose Redis starts refusing writes right after its next append, and a
    # scheduler that runs no reconcile pass (no sweep) after its start
    system = Deployment(tmp_path, redis_server, RECONCILE_INTERVAL="3600")
    try:
        system.start()
        session = new_session(system.store, "s1")
        undo: list[Any] = []
        cut = threading.Event()

        class CutAfterAppend(JsonlStore):
            def append(self, *args: Any, **kwargs: Any) -> Any:
                appended = super().append(*args, **kwargs)
                if cut.is_set():
                    cut.clear()
                    undo.append(refuse_writes(system.client, "OOM"))
                return appended

        host = system.host(session, store=CutAfterAppend(system.settings.sessions))
        assert wait_until(lambda: system.client.llen("rq:queue:idle") == 0, 30)
        dropped = _create(host, session, {"prompt": "dropped", "after_seconds": 3})
        _create(host, session, {"prompt": "water the plants", "after_seconds": 5})
        # when a delete is durable but its re-arm cannot reach Redis (a delete moves the
        # wake later: it is re-armed after the write, not before)
        cut.set()
        _definition, delete = host.agents[session].tools["schedule_delete"]
        assert value(delete({"id": dropped["id"]}).content)["deleted"] is True
        assert host.plugin.tools.owed.owed() == [session]
        # then, once Redis takes writes again, the host repays the owed wake, and the
        # reminder left is delivered once, the deleted one never
        undo[0]()
        assert wait_until(lambda: len(reminder_texts(system.store, session)) == 1, 60), \
            system.procs.describe()
        assert '"water the plants"' in reminder_texts(system.store, session)[0]
        assert host.plugin.tools.owed.owed() == []
        assert list(delivered_counts(system.store, session).values()) == [1]
    finally:
        system.close()
