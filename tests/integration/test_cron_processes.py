"""Calendar rules with real processes (docs/decisions.md#calendar-rules): a cron record
overdue in a log is delivered once, in the batch framing, together with an ``every``
record due at the same time, by ``dsh-schedule worker``, ``scheduler`` and ``host``
processes that were not told about calendar rules; and a log that never used them is
byte for byte what the code before them wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from dsh_schedule.shared.core.cron import parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.framing import BATCH_HEADER
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.timesel import load_zone
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.integration.v1log import write_v1_log
from tests.redis_server import RedisServer
from tests.support import Processes, dispatch_records, process_env, reminder_messages, wait_until

DATA = Path(__file__).parent / "data"
RULE, ZONE = "0 9 * * MON-FRI", "Europe/Berlin"


def test_a_log_without_calendar_rules_is_byte_identical_to_the_version_1_code(
    tmp_path: Path,
) -> None:
    written = write_v1_log(tmp_path / "sessions").read_bytes()
    assert written == (DATA / "v1-log.jsonl").read_bytes()
    assert b'"version":2' not in written


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_overdue_cron_record_goes_out_once_in_one_batch_with_a_due_every_record(
    tmp_path: Path, redis_server: RedisServer,
) -> None:
    # given a log whose weekday rule has been due for days, and an every record due since
    # the same instant: the rule's occurrence of some days ago
    rule, zone = parse_rule(RULE), load_zone(ZONE)
    now = int(time.time() * 1000)
    week_ago = latest_at_or_before(rule, zone, now - 7 * 86_400_000)
    assert week_ago is not None
    target = format_instant(week_ago)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    lines = [
        {"type": "session", "version": 0, "id": "s1", "createdAt": week_ago - 60_000},
        {"type": "schedule/change", "seq": 0, "time": week_ago - 60_000, "data": {
            "version": 2, "operation": "create", "schedule": {
                "id": "schedule-1", "kind": "cron", "prompt": "stand-up", "cron": RULE,
                "timeZone": ZONE, "scheduledAt": target}}},
        {"type": "schedule/change", "seq": 1, "time": week_ago - 60_000, "data": {
            "version": 1, "operation": "create", "schedule": {
                "id": "schedule-2", "kind": "every", "prompt": "check CI", "everySeconds": 3600,
                "scheduledAt": target}}},
    ]
    (sessions / "s1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    # when worker, scheduler and a host of that session run (DSH_SCHEDULE_CALENDAR unset)
    env = process_env(redis_server.url(), sessions, PREFIX="crontest:", QUEUE="crontest",
                      LOCK_TTL="5", MAINTENANCE_TTL="5", MOVER_INTERVAL="0.05",
                      RECONCILE_INTERVAL="2", LEASE_RENEW="1")
    assert "DSH_SCHEDULE_CALENDAR" not in env
    procs = Processes(tmp_path, env)
    store = JsonlStore(sessions)
    procs.spawn("worker", "worker")
    procs.spawn("scheduler", "scheduler")
    procs.spawn("host", "host", "s1")
    try:
        assert wait_until(lambda: len(reminder_messages(store, "s1")) >= 1, timeout=60), (
            procs.describe())
        time.sleep(2.0)  # another wake, a reconcile pass: nothing more may go out
        assert not procs.dead(), procs.describe_dead()
    finally:
        procs.close()

    # then exactly one message delivered both, in the batch framing
    messages = reminder_messages(store, "s1")
    assert len(messages) == 1, messages
    text = messages[0]["content"][0]["text"]
    assert text.startswith(BATCH_HEADER)
    dispatches = dispatch_records(store, "s1")
    assert [d["id"] for d in dispatches] == ["schedule-1", "schedule-2"]
    accepted = {d["acceptedAt"] for d in dispatches}
    assert len(accepted) == 1
    accepted_ms = parse_instant(accepted.pop())
    # the rule's latest occurrence not after the batch (not the one a week ago), and the
    # every record's latest aligned one
    cron_at = latest_at_or_before(rule, zone, accepted_ms)
    assert cron_at is not None and cron_at > week_ago
    every_at = week_ago + (accepted_ms - week_ago) // 3_600_000 * 3_600_000
    pairs = messages[0]["source"]["reminders"]
    assert pairs == [
        {"scheduleId": "schedule-1", "occurrenceAt": format_instant(cron_at)},
        {"scheduleId": "schedule-2", "occurrenceAt": format_instant(every_at)},
    ]
    reminders = json.loads(text.split("reminders_json: ", 1)[1])
    assert [r["schedule_id"] for r in reminders] == ["schedule-1", "schedule-2"]
    assert [r["occurrence_at"] for r in reminders] == [p["occurrenceAt"] for p in pairs]
    # and the rule's next target is its first occurrence after the batch
    state = fold(store.read("s1").events)
    record = state.find("schedule-1")
    expected = next_after(rule, zone, accepted_ms)
    assert record is not None and expected is not None
    assert record.scheduledAt == format_instant(expected)
