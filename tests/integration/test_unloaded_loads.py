"""Hosts answering load requests for unloaded sessions, in process on the suite's real
Redis (docs/architecture.md#unloaded-sessions): one host of a group loads a session, at
most ``load_concurrency`` loads at once, the asyncio twin, ``status`` and the metrics."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import redis

from dsh_schedule import status
from dsh_schedule.host.aio import AsyncAgentRegistry, AsyncSchedulePlugin
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler.process import ask_unloaded
from dsh_schedule.shared import metrics
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.support import unloaded_timer, wait_until

pytestmark = [pytest.mark.redis]


@pytest.fixture
def on(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, wake_unloaded=True, load_retry_s=30.0,
                                   load_concurrency=2)


@pytest.fixture
def store(tmp_path: Path) -> JsonlStore:
    made = JsonlStore(tmp_path / "sessions", syncfs=False)
    for n in range(10):
        made.create(SessionHeader(id=f"s{n}", createdAt=0))
    return made


@pytest.fixture
def coord(real_redis: redis.Redis, on: Settings) -> Coordination:
    return Coordination(real_redis, on)


class BlockingHost(ReferenceHost):
    """A host whose loads wait for ``release``, counting how many run at once."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, all_sessions=True, **kwargs)  # type: ignore[arg-type]
        self.release = threading.Event()
        self.running = 0
        self.most = 0
        self.count = threading.Lock()

    def _load_due(self, session_id: str) -> bool:
        with self.count:
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(30)
        with self.count:
            self.running -= 1
        return super()._load_due(session_id)


@pytest.fixture
def hosts(store: JsonlStore, coord: Coordination, on: Settings) -> Iterator[list[ReferenceHost]]:
    made: list[ReferenceHost] = []
    yield made
    for host in made:
        host.close()


def listening(*hosts: ReferenceHost) -> None:
    """Wait until each host reads the load requests announced from now on."""
    for host in hosts:
        assert host.plugin.loads is not None
        assert host.plugin.loads.listening.wait(10)


def ask(coord: Coordination, on: Settings, sessions: list[str]) -> int:
    """Make these sessions' timers due now, and run the scheduler's pass."""
    coord.unloaded.park(on.queue, {s: coord.clock() - 1 for s in sessions})
    return ask_unloaded(coord)


def test_two_hosts_of_a_group_never_load_one_session_twice(
        store: JsonlStore, coord: Coordination, on: Settings,
        hosts: list[ReferenceHost]) -> None:
    hosts.extend(ReferenceHost(store, coord, on, all_sessions=True,
                               consumer=f"h{n}-{uuid.uuid4().hex[:6]}") for n in range(2))
    listening(*hosts)
    # when
    assert ask(coord, on, ["s1"]) == 1
    # then: one host loaded it, and the other's answer was a no-op
    assert wait_until(lambda: sum("s1" in h.agents for h in hosts) == 1, timeout=10)
    assert not wait_until(lambda: sum("s1" in h.agents for h in hosts) > 1, timeout=2)
    assert unloaded_timer(coord, on.queue, "s1") is None


def test_a_rebuild_that_one_file_fails_leaves_load_requests_answered(
        store: JsonlStore, coord: Coordination, on: Settings, hosts: list[ReferenceHost],
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # given a store in which one session's file is not a file the store can read
    (tmp_path / "sessions" / "bad.jsonl").mkdir()
    host = ReferenceHost(store, coord, on, all_sessions=True)
    hosts.append(host)

    # when the host starts (its rebuild of the timers fails) and a session is asked for
    listening(host)
    assert ask(coord, on, ["s1"]) == 1

    # then the request is answered, and the failure was said once, naming the file
    assert wait_until(lambda: "s1" in host.agents, timeout=10)
    said = [r.getMessage() for r in caplog.records if "rebuild of the timers" in r.getMessage()]
    assert len(said) == 1 and "bad" in said[0], said


def test_a_host_loads_at_most_load_concurrency_sessions_at_once(
        store: JsonlStore, coord: Coordination, on: Settings,
        hosts: list[ReferenceHost]) -> None:
    host = BlockingHost(store, coord, on)
    hosts.append(host)
    listening(host)
    sessions = [f"s{n}" for n in range(10)]
    assert ask(coord, on, sessions) == 10
    assert wait_until(lambda: host.running == 2, timeout=10)
    assert not wait_until(lambda: host.running > 2, timeout=1)
    # when: the loads may end
    host.release.set()
    # then: every session is loaded, never more than two at once
    assert wait_until(lambda: all(s in host.agents for s in sessions), timeout=20)
    assert host.most == 2


def test_the_asyncio_twin_awaits_its_callback(store: JsonlStore, coord: Coordination,
                                              on: Settings) -> None:
    async def scenario() -> list[str]:
        registry = AsyncAgentRegistry()

        async def load(session_id: str) -> None:
            await registry.create(session_id)

        plugin = AsyncSchedulePlugin(store=store, coordination=coord, settings=on,
                                     on_due_unloaded=load)
        plugin.load(registry)
        try:
            assert plugin.loads is not None
            assert await asyncio.to_thread(plugin.loads.listening.wait, 10)
            await asyncio.to_thread(ask, coord, on, ["s3"])
            for _ in range(200):
                if plugin.installed:
                    break
                await asyncio.sleep(0.05)
            return plugin.installed
        finally:
            await plugin.dispose()

    assert asyncio.run(scenario()) == ["s3"]


def test_status_shows_unloaded_timers_apart_and_metrics_count_requests(
        store: JsonlStore, coord: Coordination, on: Settings, settings: Settings,
        hosts: list[ReferenceHost]) -> None:
    recorder = metrics.enable()
    try:
        coord.unloaded.park(on.queue, {"s1": coord.clock() + 3_600_000})
        host = BlockingHost(store, coord, on)
        hosts.append(host)
        listening(host)
        assert ask(coord, on, ["s2"]) == 1
        assert wait_until(lambda: host.running == 1, timeout=10)
        shown = status.read_status(coord.client, on, now_ms=coord.clock())
        assert [(u.queue, u.timers, u.load_requests) for u in shown.unloaded] == [
            (on.queue, 2, 1)]
        assert shown.live_agents == 0
        assert f"unloaded sessions of {on.queue}: 2 timer(s), 1 load request(s)" in (
            status.render_status(shown))
        # with the mode off, status says nothing of them
        off = status.read_status(coord.client, settings, now_ms=coord.clock())
        assert "unloaded" not in msgspec.json.encode(off).decode()
        # the host answers the request
        host.release.set()
        assert wait_until(lambda: "s2" in host.agents, timeout=10)
        assert wait_until(lambda: recorder.registry.get_sample_value(
            "dsh_schedule_load_answers_total", {"outcome": "loaded"}) == 1.0, timeout=5)
        assert recorder.registry.get_sample_value("dsh_schedule_load_requests_total") == 1.0
        assert recorder.registry.get_sample_value("dsh_schedule_load_seconds_count") == 1.0
    finally:
        metrics.disable()


def test_a_prompt_loads_a_session_and_an_idle_one_is_let_go_with_its_timer(
        store: JsonlStore, coord: Coordination, on: Settings,
        hosts: list[ReferenceHost]) -> None:
    brief = msgspec.structs.replace(on, unload_after_s=0.2)
    host = ReferenceHost(store, coord, brief, all_sessions=True)
    hosts.append(host)
    # when: a prompt comes for a session the host has not loaded
    results = host.prompt("s4", "remind me", tool_calls=[
        ("schedule_create", {"prompt": "p", "after_seconds": 3600})])
    # then: it is loaded, live, and its wake is its timer
    assert not results[0].is_error, results[0].content
    assert "s4" in host.agents and coord.leases.live_agents(now_ms=coord.clock()) == ["s4"]
    assert unloaded_timer(coord, on.queue, "s4") is None
    # and once idle it is let go, keeping an unloaded session's timer at its reminder
    assert wait_until(lambda: host.unload_idle() == ["s4"], timeout=5)
    assert "s4" not in host.agents and coord.leases.live_agents(now_ms=coord.clock()) == []
    target = unloaded_timer(coord, on.queue, "s4")
    assert target is not None and target > coord.clock() + 3_500_000


def test_a_session_whose_reminder_is_due_and_not_yet_dispatched_is_kept(
        store: JsonlStore, coord: Coordination, on: Settings,
        hosts: list[ReferenceHost]) -> None:
    """Letting it go would only have it asked for again at once (no worker runs here)."""
    brief = msgspec.structs.replace(on, unload_after_s=0.2)
    host = ReferenceHost(store, coord, brief, all_sessions=True)
    hosts.append(host)
    (created,) = host.prompt("s5", "remind me", tool_calls=[
        ("schedule_create", {"prompt": "p", "after_seconds": 1})])
    target = parse_instant(msgspec.json.decode(created.content)["scheduledAt"])
    assert wait_until(lambda: coord.clock() > target, timeout=5)
    assert not wait_until(lambda: bool(host.unload_idle()), timeout=1.5)
    assert "s5" in host.agents
