"""The lifecycle delivering (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders):
``dsh-schedule worker``, ``scheduler`` and ``host`` processes, changed through
``dsh-schedule call`` with ``DSH_SCHEDULE_LIFECYCLE=on``; and, where a test needs several
recurring periods (batches are at least 300 s apart, which no setting shortens), the
embedded runtime's worker and scheduler on a clock the test advances."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.runtime import EmbeddedRuntime, ManualClock, embedded_runtime
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.redis_server import RedisServer
from tests.support import (
    Processes,
    delivered_counts,
    dispatch_counts,
    dispatch_records,
    process_env,
    reminder_messages,
    wait_until,
)


def call(env: dict[str, str], tool: str, args: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "call", "s1", tool, json.dumps(args)],
        capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    value: dict[str, Any] = json.loads(done.stdout)
    return value


def _processes(tmp_path: Path, redis_server: RedisServer, tag: str,
               lines: list[dict[str, Any]] | None = None) -> tuple[Processes, dict[str, str]]:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    header = {"type": "session", "version": 0, "id": "s1", "createdAt": 0}
    (sessions / "s1.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in [header, *(lines or [])]))
    env = process_env(redis_server.url(), sessions, PREFIX=f"{tag}:", QUEUE=tag,
                      LOCK_TTL="5", MAINTENANCE_TTL="5", MOVER_INTERVAL="0.05",
                      RECONCILE_INTERVAL="2", LEASE_RENEW="1", LIFECYCLE="on")
    procs = Processes(tmp_path, env)
    procs.spawn("worker", "worker")
    procs.spawn("scheduler", "scheduler")
    procs.spawn("host", "host", "s1")
    return procs, env


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_edited_reminder_fires_once_at_its_new_time_never_at_its_old(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    procs, env = _processes(tmp_path, redis_server, "lifeedit")
    store = JsonlStore(tmp_path / "sessions")
    try:
        # given a reminder 12 s away, moved to 3 s from the edit, its prompt changed too
        made = call(env, "schedule_create", {"prompt": "old text", "after_seconds": 12})
        old_target = parse_instant(made["scheduledAt"])
        edited = call(env, "schedule_update",
                      {"id": "schedule-1", "after_seconds": 3, "prompt": "new text"})
        new_target = parse_instant(edited["scheduledAt"])
        assert new_target < old_target
        # when the new time comes, and the old one passes
        assert wait_until(lambda: len(reminder_messages(store, "s1")) >= 1, timeout=60), (
            procs.describe())
        while time.time() * 1000 < old_target + 3000:
            time.sleep(0.2)
        assert not procs.dead(), procs.describe_dead()
    finally:
        procs.close()
    # then exactly one message, at the new time, with the new prompt
    messages = reminder_messages(store, "s1")
    assert len(messages) == 1, messages
    assert messages[0]["source"]["reminders"] == [
        {"scheduleId": "schedule-1", "occurrenceAt": format_instant(new_target)}]
    assert '"new text"' in messages[0]["content"][0]["text"]
    assert dispatch_counts(store, "s1") == {"schedule-1": 1}
    assert fold(store.read("s1").events).active == ()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_reminder_moved_later_sends_nothing_at_its_old_time_and_fires_once_at_its_new(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    procs, env = _processes(tmp_path, redis_server, "lifelater")
    store = JsonlStore(tmp_path / "sessions")
    try:
        # given a reminder 4 s away (its wake armed), moved to 10 s from the edit
        made = call(env, "schedule_create", {"prompt": "old text", "after_seconds": 4})
        old_target = parse_instant(made["scheduledAt"])
        edited = call(env, "schedule_update",
                      {"id": "schedule-1", "after_seconds": 10, "prompt": "new text"})
        new_target = parse_instant(edited["scheduledAt"])
        assert new_target > old_target + 3000
        # when the old time passes: nothing is sent
        while time.time() * 1000 < old_target + 2500:
            time.sleep(0.2)
        assert reminder_messages(store, "s1") == [] and dispatch_records(store, "s1") == []
        # then the new time comes
        assert wait_until(lambda: len(reminder_messages(store, "s1")) >= 1, timeout=60), (
            procs.describe())
        time.sleep(1.0)
        assert not procs.dead(), procs.describe_dead()
    finally:
        procs.close()
    # then exactly one message, at the new time, with the new prompt
    (message,) = reminder_messages(store, "s1")
    assert message["source"]["reminders"] == [
        {"scheduleId": "schedule-1", "occurrenceAt": format_instant(new_target)}]
    assert '"new text"' in message["content"][0]["text"]
    assert dispatch_counts(store, "s1") == {"schedule-1": 1}


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_paused_record_sends_nothing_and_resumes_on_an_aligned_target(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    # given an every-300-s record paused before its first target, three of its periods
    # ago: its next aligned target is 30 s from now
    now = int(time.time() * 1000)
    anchor = now - 3 * 300_000 + 30_000
    lines = [
        {"type": "schedule/change", "seq": 0, "time": anchor - 60_000, "data": {
            "version": 1, "operation": "create", "schedule": {
                "id": "schedule-1", "kind": "every", "prompt": "stretch", "everySeconds": 300,
                "scheduledAt": format_instant(anchor)}}},
        {"type": "schedule/change", "seq": 1, "time": anchor - 30_000, "data": {
            "version": 2, "operation": "update", "id": "schedule-1", "paused": True}},
        {"type": "schedule/change", "seq": 2, "time": anchor - 30_000, "data": {
            "version": 1, "operation": "create", "schedule": {
                "id": "schedule-2", "kind": "at", "prompt": "ping",
                "scheduledAt": format_instant(now + 2_000)}}},
    ]
    procs, env = _processes(tmp_path, redis_server, "lifepause", lines)
    store = JsonlStore(tmp_path / "sessions")
    try:
        # when the processes run with it overdue by three periods, and deliver a one-shot
        # due meanwhile (so they are seen working), the paused record sends nothing
        assert wait_until(lambda: len(reminder_messages(store, "s1")) >= 1, timeout=60), (
            procs.describe())
        time.sleep(2.0)
        assert [d["id"] for d in dispatch_records(store, "s1")] == ["schedule-2"]
        listed = call(env, "schedule_list", {})
        assert [v["state"] for v in listed] == ["paused"]
        # when it is resumed
        resumed = call(env, "schedule_update", {"id": "schedule-1", "paused": False})
        target = parse_instant(resumed["scheduledAt"])
        assert (target - anchor) % 300_000 == 0 and target > now
        assert wait_until(lambda: len(reminder_messages(store, "s1")) >= 2, timeout=60), (
            procs.describe())
        time.sleep(1.0)
        assert not procs.dead(), procs.describe_dead()
    finally:
        procs.close()
    # then one message of it, on the anchor-aligned target, no backlog
    messages = reminder_messages(store, "s1")
    assert [m["source"]["reminders"] for m in messages][1:] == [
        [{"scheduleId": "schedule-1", "occurrenceAt": format_instant(target)}]]
    assert target == anchor + 3 * 300_000


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    settings = Settings(lifecycle=True)
    with embedded_runtime(tmp_path / "sessions", settings=settings,
                          clock=ManualClock()) as rt:
        rt.create_session("s1")
        yield rt


def _tool(rt: EmbeddedRuntime, host: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    (result,) = host.prompt("s1", tool, tool_calls=[(tool, args)])
    assert not result.is_error, result.content
    value: dict[str, Any] = json.loads(result.content)
    return value


def test_a_count_3_record_delivers_three_times_and_leaves_the_list(
        runtime: EmbeddedRuntime) -> None:
    host = runtime.reference_host()
    host.open_root("s1")
    made = _tool(runtime, host, "schedule_create",
                 {"prompt": "drink water", "every_seconds": 600, "count": 3})
    assert made["count"] == 3 and made["deliveredCount"] == 0
    counts = []
    for _ in range(5):
        runtime.advance(600)
        counts.append(len(host.pump("s1")))
    assert counts == [1, 1, 1, 0, 0]
    assert delivered_counts(runtime.store, "s1") == {"schedule-1": 3}
    assert _tool(runtime, host, "schedule_list", {}) == []


def test_a_paused_record_sends_nothing_across_three_periods_then_resumes_aligned(
        runtime: EmbeddedRuntime) -> None:
    host = runtime.reference_host()
    host.open_root("s1")
    made = _tool(runtime, host, "schedule_create", {"prompt": "stretch", "every_seconds": 600})
    anchor = parse_instant(made["scheduledAt"])
    runtime.advance(600)
    assert len(host.pump("s1")) == 1
    _tool(runtime, host, "schedule_update", {"id": "schedule-1", "paused": True})
    for _ in range(3):  # three periods, and a little
        runtime.advance(620)
        assert host.pump("s1") == []
    resumed = _tool(runtime, host, "schedule_update", {"id": "schedule-1", "paused": False})
    target = parse_instant(resumed["scheduledAt"])
    now = runtime.clock()
    assert (target - anchor) % 600_000 == 0 and now < target <= now + 600_000
    runtime.advance((target - now) / 1000)
    (delivery,) = host.pump("s1")
    assert [p.occurrenceAt for p in delivery.pairs] == [format_instant(target)]
    assert dispatch_counts(runtime.store, "s1") == {"schedule-1": 2}



@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_processes_deliver_a_count_3_records_last_occurrence_once_and_it_leaves_the_list(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    """The end of a ``count`` by real processes: two occurrences delivered in the past (by
    the embedded runtime on a clock set back, since batches are 600 s apart here), the
    third falls due seconds from now and is the last."""
    # given a count-3 record made 1 795 s ago, delivered at 1 195 s and 595 s ago
    start = int(time.time() * 1000) - 1_795_000
    earlier = tmp_path / "earlier"
    with embedded_runtime(earlier, settings=Settings(lifecycle=True),
                          clock=ManualClock(start)) as rt:
        rt.create_session("s1")
        host = rt.reference_host()
        host.open_root("s1")
        made = _tool(rt, host, "schedule_create",
                     {"prompt": "drink water", "every_seconds": 600, "count": 3})
        third = parse_instant(made["scheduledAt"]) + 2 * 600_000
        for _ in range(2):
            rt.advance(600)
            assert len(host.pump("s1")) == 1
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "s1.jsonl").write_bytes((earlier / "s1.jsonl").read_bytes())
    env = process_env(redis_server.url(), sessions, PREFIX="lifecount:", QUEUE="lifecount",
                      LOCK_TTL="5", MAINTENANCE_TTL="5", MOVER_INTERVAL="0.05",
                      RECONCILE_INTERVAL="2", LEASE_RENEW="1", LIFECYCLE="on")
    procs = Processes(tmp_path, env)
    store = JsonlStore(sessions)
    try:
        for name in ("worker", "scheduler"):
            procs.spawn(name, name)
        procs.spawn("host", "host", "s1")
        # when its third target passes
        assert wait_until(lambda: delivered_counts(store, "s1").get("schedule-1") == 3,
                          timeout=90), procs.describe()
        while time.time() * 1000 < third + 3000:
            time.sleep(0.2)
        listed = call(env, "schedule_list", {})
        assert not procs.dead(), procs.describe_dead()
    finally:
        procs.close()
    # then it was delivered three times in all, the third at its target, and has ended
    assert delivered_counts(store, "s1") == {"schedule-1": 3}
    assert dispatch_counts(store, "s1") == {"schedule-1": 3}
    last = reminder_messages(store, "s1")[-1]
    assert last["source"]["reminders"] == [
        {"scheduleId": "schedule-1", "occurrenceAt": format_instant(third)}]
    assert listed == []
    assert fold(store.read("s1").events).active == ()
