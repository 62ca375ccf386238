"""Timers of sessions no host has loaded (docs/architecture.md#unloaded-sessions): written
from a tool call's fold and at disposal, rebuilt from the store's index, moved by the
scheduler's pass into load requests with a doubling backoff, claimed by one host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from dsh_schedule.host.plugin import CompositionError, SchedulePlugin
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.scheduler.process import ask_unloaded
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.settings import Settings, SettingsError
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.adapters.test_store_contract import WHEN, at_create, header, message
from tests.support import FakeClock, unloaded_timer

DUE = parse_instant(WHEN)


class CountingStore(JsonlStore):
    """The JSONL store, counting the logs it opens."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, syncfs=False)
        self.log_opens = 0

    def _open_locked(self, session_id: str, flags: int, operation: int) -> tuple[int, Any]:
        self.log_opens += 1
        return super()._open_locked(session_id, flags, operation)


@pytest.fixture
def on(settings: Settings) -> Settings:
    return msgspec.structs.replace(settings, wake_unloaded=True, load_retry_s=10.0,
                                   load_retry_max_s=35.0)


@pytest.fixture
def coord(redis_client: redis.Redis, on: Settings) -> Coordination:
    return Coordination(redis_client, on)


def test_a_due_timer_is_announced_once_per_backoff_step(coord: Coordination, on: Settings) -> None:
    # given: an unloaded session's timer
    timers = coord.unloaded
    timers.park(on.queue, {"s1": DUE})
    # when: passes at, just after, and after each backoff
    first = timers.take_due(DUE)
    again = timers.take_due(DUE + 9_999)
    second = timers.take_due(DUE + 10_000)
    third = timers.take_due(DUE + 30_000)
    fourth = timers.take_due(DUE + 65_000)
    # then: one request per step, the backoff doubling up to its cap
    assert [(a.session, a.attempt, a.backoff_ms) for a in first] == [("s1", 1, 10_000)]
    assert again == []
    assert [(a.attempt, a.backoff_ms) for a in second] == [(2, 20_000)]
    assert [(a.attempt, a.backoff_ms) for a in third] == [(3, 35_000)]
    assert [(a.attempt, a.backoff_ms) for a in fourth] == [(4, 35_000)]
    assert unloaded_timer(coord, on.queue, "s1") == DUE + 100_000
    cursor, requests = timers.read_requests(on.queue, "0-0", block_ms=None, count=10)
    assert [(r.session, r.attempt) for r in requests] == [("s1", 1), ("s1", 2), ("s1", 3),
                                                          ("s1", 4)]
    assert [(o.timers, o.requests) for o in timers.outstanding()] == [(1, 1)]


def test_a_timer_is_never_announced_before_it_is_due(coord: Coordination, on: Settings) -> None:
    coord.unloaded.park(on.queue, {"s1": DUE})
    assert coord.unloaded.take_due(DUE - 1) == []
    assert coord.unloaded.next_due_ms == DUE


def test_a_live_session_drops_its_timer_unless_its_lock_is_held(
        coord: Coordination, on: Settings) -> None:
    # given: two sessions a live host serves, one of them locked, both with a due timer
    coord.leases.install("h1", ["s1", "s2"], on.queue, now_ms=DUE, ttl_s=60)
    coord.unloaded.park(on.queue, {"s1": DUE, "s2": DUE})
    with coord.locks.hold("s2", wait_s=1):
        # when
        announced = coord.unloaded.take_due(DUE)
    # then: no request; the locked one is looked at again shortly
    assert announced == []
    assert unloaded_timer(coord, on.queue, "s1") is None
    assert unloaded_timer(coord, on.queue, "s2") == DUE + 1_000


def test_one_host_claims_a_load_and_a_live_session_is_a_no_op(
        coord: Coordination, on: Settings) -> None:
    timers = coord.unloaded
    assert timers.claim(["s1", "s2"], "h1", now_ms=DUE, ttl_ms=10_000) == ["claimed", "claimed"]
    assert timers.claim(["s1"], "h2", now_ms=DUE, ttl_ms=10_000) == ["taken"]
    timers.release(["s1"])
    # a batch answers each session in its order
    assert timers.claim(["s2", "s1"], "h2", now_ms=DUE, ttl_ms=10_000) == ["taken", "claimed"]
    coord.leases.install("h2", ["s1"], on.queue, now_ms=DUE, ttl_s=60)
    assert timers.claim(["s1"], "h1", now_ms=DUE, ttl_ms=10_000) == ["live"]


def test_a_flush_restores_every_timer_from_the_index_without_reading_every_log(
        tmp_path: Path, redis_client: redis.Redis, on: Settings) -> None:
    """1 000 unloaded sessions: the index answers them, and only the log that grew after
    its entry is opened again; its timer is the log's, not the stale entry's."""
    # given: 1 000 sessions with a reminder each, their index written
    writer = JsonlStore(tmp_path / "store", syncfs=False)
    ids = [f"s{n:04d}" for n in range(1000)]
    for session_id in ids:
        writer.create(header(session_id))
        writer.append(session_id, [at_create("r1")], 0)
    # and one log that grew after its entry (a crash between the append and the index
    # write): an earlier reminder appended by a store that writes no index
    grown = ids[500]
    entry = (tmp_path / "store" / ".due" / f"{grown}.due").read_bytes()
    writer.append(grown, [at_create("r0", when="2026-06-01T08:00:00.000Z")], 1)
    (tmp_path / "store" / ".due" / f"{grown}.due").write_bytes(entry)
    coord = Coordination(redis_client, on)
    coord.unloaded.park(on.queue, {session_id: DUE for session_id in ids})
    # when: Redis loses everything, and a fresh store (a host starting) rebuilds
    redis_client.flushdb()
    store = CountingStore(tmp_path / "store")
    written = coord.unloaded.rebuild(store, on.queue, now_ms=DUE - 1)
    # then
    assert written == 1000
    assert store.log_opens == 1
    assert unloaded_timer(coord, on.queue, grown) == parse_instant("2026-06-01T08:00:00.000Z")
    assert unloaded_timer(coord, on.queue, ids[0]) == DUE
    assert [(o.timers, o.requests) for o in coord.unloaded.outstanding()] == [(1000, 0)]


def test_a_rebuild_only_moves_a_timer_earlier_and_skips_live_sessions(
        tmp_path: Path, coord: Coordination, on: Settings) -> None:
    store = JsonlStore(tmp_path / "store", syncfs=False)
    for session_id in ("s1", "s2"):
        store.create(header(session_id))
        store.append(session_id, [at_create("r1")], 0)
    coord.unloaded.park(on.queue, {"s1": DUE - 5})
    coord.leases.install("h1", ["s2"], on.queue, now_ms=DUE - 10, ttl_s=60)
    assert coord.unloaded.rebuild(store, on.queue, now_ms=DUE - 10) == 0
    assert unloaded_timer(coord, on.queue, "s1") == DUE - 5
    assert unloaded_timer(coord, on.queue, "s2") is None


def test_a_tool_call_on_an_unloaded_session_writes_its_timer(
        tmp_path: Path, coord: Coordination, on: Settings) -> None:
    store = JsonlStore(tmp_path / "store", syncfs=False)
    store.create(header("s1"))
    clock = FakeClock(DUE - 3_600_000)
    tools = ScheduleTools(store, coord, on, clock)
    created = tools.call("s1", "schedule_create", {"prompt": "p", "after_seconds": 600})
    assert not created.is_error, created.content
    assert unloaded_timer(coord, on.queue, "s1") == DUE - 3_000_000
    tools.call("s1", "schedule_delete", {"id": "schedule-1"})
    assert unloaded_timer(coord, on.queue, "s1") is None


def test_a_session_let_go_keeps_its_timer_and_the_mode_off_writes_none(
        tmp_path: Path, redis_client: redis.Redis, settings: Settings, on: Settings) -> None:
    for mode in (settings, on):
        store = JsonlStore(tmp_path / f"store-{mode.wake_unloaded}", syncfs=False)
        store.create(header("s1"))
        store.append("s1", [at_create("r1"), message("hi")], 0)
        coord = Coordination(redis_client, mode)
        host = ReferenceHost(store, coord, mode, clock=FakeClock(DUE - 60_000))
        host.open_root("s1")
        host.close()
        found = [k for k in redis_client.scan_iter(f"{mode.prefix}unloaded*")]
        if mode.wake_unloaded:
            assert unloaded_timer(coord, mode.queue, "s1") == DUE
        else:
            assert found == []


def test_a_session_let_go_from_another_queue_has_its_timer_only_there(
        tmp_path: Path, redis_client: redis.Redis, on: Settings) -> None:
    # given: a session let go by a host of queue A, its timer on A
    store = JsonlStore(tmp_path / "store", syncfs=False)
    store.create(header("s1"))
    store.append("s1", [at_create("r1"), message("hi")], 0)
    group_a = msgspec.structs.replace(on, queue=f"{on.queue}-a")
    group_b = msgspec.structs.replace(on, queue=f"{on.queue}-b")
    coord = Coordination(redis_client, on)
    for group in (group_a, group_b):
        # when: it is loaded and let go by a host of A, then by a host of B
        host = ReferenceHost(store, Coordination(redis_client, group), group,
                             clock=FakeClock(DUE - 60_000))
        host.open_root("s1")
        host.close()
    # then: its one timer is on B, where it was let go last; A announces nothing
    assert unloaded_timer(coord, group_b.queue, "s1") == DUE
    assert unloaded_timer(coord, group_a.queue, "s1") is None
    assert [(a.queue, a.session) for a in coord.unloaded.take_due(DUE)] == [
        (group_b.queue, "s1")]


def test_the_callback_needs_the_mode(tmp_path: Path, redis_client: redis.Redis,
                                     settings: Settings) -> None:
    with pytest.raises(CompositionError, match="wake_unloaded"):
        SchedulePlugin(store=JsonlStore(tmp_path),
                       coordination=Coordination(redis_client, settings),
                       settings=settings, on_due_unloaded=lambda session: None)


def test_the_scheduler_logs_one_line_per_request(coord: Coordination, on: Settings,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    coord.unloaded.park(on.queue, {"s1": 0, "s2": 0})
    caplog.set_level("INFO")
    assert ask_unloaded(coord) == 2
    assert ask_unloaded(coord) == 0
    lines = [r for r in caplog.records if "no host serves it" in r.getMessage()]
    assert len(lines) == 2




@pytest.mark.parametrize(("env", "expected"), [
    ({"DSH_SCHEDULE_WAKE_UNLOADED": "on"}, {"wake_unloaded": True}),
    ({"DSH_SCHEDULE_WAKE_UNLOADED": "off"}, {"wake_unloaded": False}),
    ({"DSH_SCHEDULE_LOAD_CONCURRENCY": "3"}, {"load_concurrency": 3}),
    ({"DSH_SCHEDULE_LOAD_RETRY": "2", "DSH_SCHEDULE_LOAD_RETRY_MAX": "8"},
     {"load_retry_s": 2.0, "load_retry_max_s": 8.0}),
    ({"DSH_SCHEDULE_UNLOAD_AFTER": "60"}, {"unload_after_s": 60.0}),
    ({}, {"wake_unloaded": False, "load_concurrency": 8, "unload_after_s": 300.0}),
])
def test_the_settings_of_the_mode_come_from_the_environment(
        env: dict[str, str], expected: dict[str, object]) -> None:
    made = Settings.from_env(env)
    assert {name: getattr(made, name) for name in expected} == expected


@pytest.mark.parametrize("env", [
    {"DSH_SCHEDULE_WAKE_UNLOADED": "maybe"},
    {"DSH_SCHEDULE_LOAD_CONCURRENCY": "0"},
    {"DSH_SCHEDULE_LOAD_CONCURRENCY": "two"},
    {"DSH_SCHEDULE_UNLOAD_AFTER": "-1"},
])
def test_a_malformed_setting_of_the_mode_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)
