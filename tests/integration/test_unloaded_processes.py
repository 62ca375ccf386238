"""Reminders in sessions no host has loaded, with real processes: ``dsh-schedule host
--all-sessions``, a worker and a scheduler on the suite's redis-server
(docs/architecture.md#unloaded-sessions). Each reminder is delivered exactly once, never
before its target, and the session is let go afterwards; a host killed with a load
request outstanding is replaced by another; a callback that raises is asked again."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.conftest import real_redis_url
from tests.support import (
    FakeClock,
    Processes,
    delivered_counts,
    dispatch_records,
    process_env,
    unloaded_timer,
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]


class Group:
    """One host group's store and Redis, the processes that serve it, and tool calls made
    with no host (the sessions are never loaded by the test)."""

    def __init__(self, root: Path, client: redis.Redis) -> None:
        tag = uuid.uuid4().hex[:8]
        self.sessions = root / "sessions"
        self.env = process_env(
            real_redis_url(), self.sessions, PREFIX=f"u{tag}:", QUEUE=f"u{tag}",
            LOCK_TTL="2", MAINTENANCE_TTL="2", LEASE_TTL="4", LEASE_RENEW="1",
            MOVER_INTERVAL="0.1", RECONCILE_INTERVAL="1", WAKE_UNLOADED="on",
            LOAD_RETRY="1", LOAD_RETRY_MAX="2", CALENDAR="on")
        self.settings = Settings.from_env(self.env)
        self.store = JsonlStore(self.sessions)
        self.client = client
        self.coordination = Coordination(client, self.settings)
        self.procs = Processes(root, self.env)

    def now(self) -> int:
        return self.coordination.clock()

    def session(self, session_id: str) -> str:
        self.store.create(SessionHeader(id=session_id, createdAt=self.now(), timeZone="UTC"))
        return session_id

    def create(self, session: str, args: dict[str, Any], *, at_ms: int | None = None) -> Any:
        clock = FakeClock(self.now() if at_ms is None else at_ms)
        tools = ScheduleTools(self.store, self.coordination, self.settings, clock)
        result = tools.call(session, "schedule_create", args)
        assert not result.is_error, result.content
        return msgspec.json.decode(result.content)

    def live(self, session: str) -> bool:
        return self.client.hget(self.coordination.keys.agent_host(), session) is not None

    def delivered(self, session: str) -> int:
        return sum(delivered_counts(self.store, session).values())

    def dispatch_times(self, session: str) -> list[int]:
        """When each dispatch record of the session was appended (epoch ms)."""
        return [e.time for e in self.store.read(session).events
                if e.type == SCHEDULE_CHANGE and e.data["operation"] == "dispatch"]


@pytest.fixture
def group(tmp_path: Path, real_redis: redis.Redis) -> Iterator[Group]:
    made = Group(tmp_path, real_redis)
    yield made
    made.procs.close()


def test_each_kind_fires_once_in_a_session_never_loaded_and_is_let_go(group: Group) -> None:
    # given: four sessions no host has loaded, a reminder of each kind
    now = group.now()
    minute = datetime.fromtimestamp(now / 1000, UTC).minute
    targets: dict[str, int] = {}
    for kind in ("after", "at", "every", "cron"):
        group.session(kind)
    targets["after"] = parse_instant(group.create("after", {"prompt": "a", "after_seconds": 3})
                                     ["scheduledAt"])
    targets["at"] = parse_instant(group.create(
        "at", {"prompt": "b", "at": format_instant(now + 4_000)})["scheduledAt"])
    # an ``every`` created 296 s ago falls due in 4 s, then in five minutes
    targets["every"] = parse_instant(group.create(
        "every", {"prompt": "c", "every_seconds": 300}, at_ms=now - 296_000)["scheduledAt"])
    # a calendar rule at the next minute of the hour, then an hour later
    targets["cron"] = parse_instant(group.create(
        "cron", {"prompt": "d", "cron": {"expression": f"{(minute + 1) % 60} * * * *",
                                            "time_zone": "UTC"}})["scheduledAt"])
    assert all(not group.live(kind) for kind in targets)
    # when: the group runs, its host serving every session on demand
    procs = group.procs
    procs.spawn("scheduler", "scheduler")
    procs.spawn("worker", "worker")
    procs.spawn("host", "host", "--all-sessions", "--unload-after", "2")
    # then: each delivered exactly once, never before its target
    assert wait_until(lambda: all(group.delivered(s) >= 1 for s in targets), timeout=90), (
        procs.describe())
    for session, target in targets.items():
        times = group.dispatch_times(session)
        assert len(times) == 1, (session, times)
        assert times[0] >= target, (session, times, target)
        assert group.delivered(session) == 1
    # and each is let go, the recurring ones keeping a timer at their next occurrence
    assert wait_until(lambda: not any(group.live(s) for s in targets), timeout=30), (
        procs.describe())
    coord = group.coordination
    queue = group.settings.queue
    assert unloaded_timer(coord, queue, "after") is None
    assert unloaded_timer(coord, queue, "at") is None
    assert unloaded_timer(coord, queue, "every") == targets["every"] + 300_000
    assert unloaded_timer(coord, queue, "cron") == targets["cron"] + 3_600_000
    assert all(group.delivered(s) == 1 for s in targets)
    assert not procs.dead(), procs.describe_dead()


def test_a_host_killed_with_a_request_outstanding_is_replaced(group: Group) -> None:
    # given: a host, stopped before the reminder of a session it never loaded falls due
    session = group.session("s1")
    procs = group.procs
    procs.spawn("scheduler", "scheduler")
    procs.spawn("worker", "worker")
    procs.spawn("host-a", "host", "--all-sessions")
    assert wait_until(lambda: "rebuilt" in procs.log_tail("host-a", 100), timeout=30), (
        procs.describe())
    procs.send("host-a", signal.SIGSTOP)
    target = parse_instant(group.create(session, {"prompt": "p", "after_seconds": 1})
                           ["scheduledAt"])
    # when: the request is announced to the stopped host, which is then killed
    assert wait_until(lambda: "asked" in procs.log_tail("scheduler", 100), timeout=30), (
        procs.describe())
    procs.kill("host-a")
    assert group.delivered(session) == 0
    procs.spawn("host-b", "host", "--all-sessions")
    # then: the other host loads it and delivers it once
    assert wait_until(lambda: group.delivered(session) >= 1, timeout=30), procs.describe()
    assert wait_until(lambda: "loaded s1" in procs.log_tail("host-b", 100), timeout=5)
    times = group.dispatch_times(session)
    assert len(times) == 1 and times[0] >= target, (times, target)
    assert group.delivered(session) == 1


class FailingHost(ReferenceHost):
    """A host whose ``on_due_unloaded`` raises ``failures`` times, then loads."""

    failures = 2
    attempts = 0

    def _load_due(self, session_id: str) -> bool:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise RuntimeError("no room for this session now")
        return super()._load_due(session_id)


def test_a_callback_that_raises_is_asked_again_and_a_later_load_delivers_once(
        group: Group) -> None:
    # given: a session whose reminder is due, and a host whose first loads fail
    session = group.session("s1")
    group.create(session, {"prompt": "p", "after_seconds": 1})
    procs = group.procs
    procs.spawn("scheduler", "scheduler")
    procs.spawn("worker", "worker")
    host = FailingHost(group.store, group.coordination, group.settings, all_sessions=True)
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), daemon=True)
    thread.start()
    try:
        # then: it stays overdue through the failures, and the third request delivers once
        assert wait_until(lambda: group.delivered(session) >= 1, timeout=30), (
            procs.describe())
        assert host.attempts == 3
        assert len(dispatch_records(group.store, session)) == 1
        assert group.delivered(session) == 1
        scheduler_log = procs.log_tail("scheduler", 200)
        assert scheduler_log.count("session s1 is due") == 3, scheduler_log
    finally:
        stop.set()
        thread.join(10)
        host.close()


def test_a_flush_restores_the_timers_and_a_grown_log_is_delivered(group: Group) -> None:
    """1 000 unloaded sessions with a reminder a day ahead; one log grew after its index
    entry (an earlier reminder written with the entry left stale). After a flush the host
    rebuilds every timer from the index, and the grown one fires from its log."""
    # given
    now = group.now()
    later = format_instant(now + 86_400_000)
    ids = [f"s{n:04d}" for n in range(1000)]
    for session_id in ids:
        group.session(session_id)
        group.store.append(session_id, [reminder("r1", later, now)], 0)
    procs = group.procs
    procs.spawn("scheduler", "scheduler")
    procs.spawn("worker", "worker")
    procs.spawn("host", "host", "--all-sessions")
    assert wait_until(lambda: "rebuilt" in procs.log_tail("host", 100), timeout=30), (
        procs.describe())
    queue = group.settings.queue
    assert group.client.zcard(group.coordination.keys.unloaded(queue)) == 1000
    grown = ids[500]
    due_file = group.sessions / ".due" / f"{grown}.due"
    entry = due_file.read_bytes()
    target = group.now() + 8_000
    group.store.append(grown, [reminder("r0", format_instant(target), now)], 1)
    due_file.write_bytes(entry)
    # when: Redis loses everything
    group.client.flushdb()
    # then: every timer is back, the grown log's at its own moment, and it is delivered
    assert wait_until(lambda: group.client.zcard(
        group.coordination.keys.unloaded(queue)) == 1000, timeout=30), procs.describe()
    assert unloaded_timer(group.coordination, queue, grown) == target
    assert wait_until(lambda: group.delivered(grown) == 1, timeout=30), procs.describe()
    times = group.dispatch_times(grown)
    assert len(times) == 1 and times[0] >= target
    assert unloaded_timer(group.coordination, queue, ids[0]) == parse_instant(later)


def reminder(schedule_id: str, when: str, now_ms: int) -> NewEvent:
    schedule = {"id": schedule_id, "kind": "at", "prompt": "call back", "scheduledAt": when}
    return NewEvent(type=SCHEDULE_CHANGE, time=now_ms,
                    data={"version": 1, "operation": "create", "schedule": schedule})


def test_rebuild_writes_the_timers_and_unload_after_needs_all_sessions(group: Group) -> None:
    later = format_instant(group.now() + 86_400_000)
    for session_id in ("s1", "s2"):
        group.session(session_id)
        group.store.append(session_id, [reminder("r1", later, group.now())], 0)
    done = group.procs.run("rebuild")
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["unloadedTimers"] == 2
    assert unloaded_timer(group.coordination, group.settings.queue, "s2") == parse_instant(later)
    refused = group.procs.run("host", "s1", "--unload-after", "5")
    assert refused.returncode != 0
    assert "--unload-after needs --all-sessions" in refused.stderr
