"""The management transactions against fakeredis and real Redis
(docs/architecture.md#management-tools)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    STEP_START,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
)
from dsh_schedule.shared.settings import Settings, SettingsError
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, append_raw_line, new_session, value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def tools(
    store: MemoryStore, coordination: Coordination, settings: Settings, clock: FakeClock
) -> ScheduleTools:
    return ScheduleTools(store, coordination, settings, clock)


def test_create_list_delete_and_ids_are_never_reused(
    store: MemoryStore, tools: ScheduleTools
) -> None:
    session = new_session(store)
    first = tools.call(session, "schedule_create", {"prompt": " stretch ", "after_seconds": 600})
    assert not first.is_error
    assert first.content == (
        '{"id":"schedule-1","kind":"after","prompt":"stretch","afterSeconds":600,'
        '"scheduledAt":"2026-12-01T12:10:00.000Z","state":"scheduled",'
        '"deliveryMode":"session-local"}'
    )
    deleted = tools.call(session, "schedule_delete", {"id": "schedule-1"})
    assert value(deleted.content) == {"id": "schedule-1", "deleted": True}
    again = tools.call(session, "schedule_delete", {"id": "schedule-1"})
    assert value(again.content) == {
        "id": "schedule-1", "deleted": False, "code": "schedule_not_found"
    }
    assert not again.is_error
    second = tools.call(session, "schedule_create", {"prompt": "check CI", "every_seconds": 3600})
    assert value(second.content)["id"] == "schedule-2"
    listed = value(tools.call(session, "schedule_list", {}).content)
    assert [v["id"] for v in listed] == ["schedule-2"]


@pytest.mark.parametrize("bad_id", ["", " schedule-1", "schedule-1\n", 7])
def test_padded_or_empty_delete_id_is_rejected_before_any_flush(
    store: MemoryStore, tools: ScheduleTools, bad_id: object
) -> None:
    session = new_session(store)
    result = tools.call(session, "schedule_delete", {"id": bad_id})
    assert result.is_error and value(result.content)["code"] == "invalid_rule"
    assert store.flush_count(session) == 0


def test_failed_preflight_answers_persistence_uncertain_and_appends_nothing(
    store: MemoryStore, tools: ScheduleTools
) -> None:
    session = new_session(store)
    store.fail_next_flush()
    result = tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60})
    assert value(result.content) == {
        "code": "persistence_uncertain",
        "message": value(result.content)["message"],
        "operation": "create",
    }
    assert store.read(session).events == ()


def test_failed_barrier_carries_the_id_and_a_later_list_confirms_it(
    store: MemoryStore, tools: ScheduleTools
) -> None:
    session = new_session(store)
    # The preflight flush passes, the barrier flush fails.
    original = store.flush
    calls = {"n": 0}

    def flaky(session_id: str) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            store.fail_next_flush()
        original(session_id)

    store.flush = flaky  # type: ignore[method-assign]
    result = tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60})
    store.flush = original  # type: ignore[method-assign]
    got = value(result.content)
    assert got["code"] == "persistence_uncertain"
    assert got["operation"] == "create" and got["id"] == "schedule-1"
    listed = value(tools.call(session, "schedule_list", {}).content)
    assert [v["id"] for v in listed] == ["schedule-1"]


def test_corrupt_log_answers_corrupt_schedule_log_for_every_tool(
    tmp_path: Path, coordination: Coordination, clock: FakeClock, settings: Settings
) -> None:
    store = JsonlStore(tmp_path)
    session = new_session(store)
    path = next(tmp_path.glob("*.jsonl"))
    append_raw_line(path, {"type": SCHEDULE_CHANGE, "seq": 0, "time": 0,
                           "data": {"version": 1, "operation": "delete", "id": "schedule-9"}})
    tools = ScheduleTools(JsonlStore(tmp_path), coordination, settings, clock)
    for tool, args in [
        ("schedule_create", {"prompt": "x", "after_seconds": 60}),
        ("schedule_list", {}),
        ("schedule_delete", {"id": "schedule-9"}),
    ]:
        result = tools.call(session, tool, args)
        assert result.is_error
        assert value(result.content)["code"] == "corrupt_schedule_log"


def _open_turn(store: MemoryStore, session: str, zones: list[str | None], reading: bool) -> None:
    events = [NewEvent(type=TURN_START, time=0, data={"turn": 0})]
    for i, zone in enumerate(zones):
        source: dict[str, object] = {"kind": "user", "rpcId": f"r{i}"}
        if zone is not None:
            source["clientTimeZone"] = zone
        events.append(NewEvent(type=USER_MESSAGE, time=0, data={
            "content": [{"type": "text", "text": "hi"}], "source": source}))
    if reading:
        events.append(NewEvent(type=USER_MESSAGE, time=0, data={
            "content": [{"type": "text", "text": "now"}],
            "source": {"kind": "plugin", "plugin": "time-context", "form": "reading"}}))
    events.append(NewEvent(type=STEP_START, time=0, data={"turn": 0, "step": 0}))
    store.append(session, events, expected_seq=len(store.read(session).events))


LOCAL_AT = {"date": "2026-12-24", "time": "18:00:00"}


def test_headerless_session_requires_time_zone_confirmation(
    store: MemoryStore, tools: ScheduleTools
) -> None:
    session = new_session(store)
    _open_turn(store, session, ["Europe/Berlin"], reading=True)
    result = tools.call(session, "schedule_create", {"prompt": "x", "at": LOCAL_AT})
    got = value(result.content)
    assert got["code"] == "timezone_confirmation_required"
    assert got["sessionTimeZone"] == "unavailable"


def test_differing_client_zones_are_reported_sorted(
    store: MemoryStore, tools: ScheduleTools
) -> None:
    session = new_session(store, time_zone="Europe/Berlin")
    _open_turn(store, session, ["Europe/Berlin", "America/New_York"], reading=True)
    got = value(tools.call(session, "schedule_create", {"prompt": "x", "at": LOCAL_AT}).content)
    assert got["code"] == "timezone_confirmation_required"
    assert got["sessionTimeZone"] == "Europe/Berlin"
    assert got["clientTimeZones"] == ["America/New_York", "Europe/Berlin"]


def test_omitted_zone_is_accepted_when_header_and_single_client_zone_agree(
    store: MemoryStore, tools: ScheduleTools
) -> None:
    session = new_session(store, time_zone="Europe/Berlin")
    _open_turn(store, session, ["Europe/Berlin"], reading=True)
    got = value(tools.call(session, "schedule_create", {"prompt": "x", "at": LOCAL_AT}).content)
    assert got["scheduledAt"] == "2026-12-24T17:00:00.000Z"


def test_lock_held_elsewhere_answers_internal_error_and_changes_nothing(
    store: MemoryStore, coordination: Coordination, clock: FakeClock, redis_client: redis.Redis,
    settings: Settings,
) -> None:
    session = new_session(store)
    other = redis_client.lock(coordination.keys.lock(session), timeout=30, thread_local=False)
    assert other.acquire(blocking=False)
    quick = _short_wait(settings)
    tools = ScheduleTools(store, Coordination(redis_client, quick), quick, clock)
    result = tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60})
    other.release()
    got = value(result.content)
    assert got["code"] == "internal_error"
    assert "Lock" not in got["message"] and "redis" not in got["message"].lower()
    assert store.read(session).events == ()


def test_redis_down_answers_internal_error(store: MemoryStore, clock: FakeClock,
                                           settings: Settings) -> None:
    session = new_session(store)
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    tools = ScheduleTools(store, Coordination(dead, settings), settings, clock)
    got = value(tools.call(session, "schedule_list", {}).content)
    assert got["code"] == "internal_error"
    assert store.read(session).events == ()


def _short_wait(settings: Settings) -> Settings:
    import msgspec

    return msgspec.structs.replace(settings, tool_lock_wait_s=0.2)


def test_a_failed_re_arm_does_not_turn_a_durable_create_into_an_error(
    store: MemoryStore, tools: ScheduleTools, coordination: Coordination,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = new_session(store)
    arm = coordination.rearm

    def broken(*args: object, **kwargs: object) -> str | None:
        if store.read(session).events:  # Redis is gone once the create is written
            raise redis.ConnectionError("gone")
        return arm(*args, **kwargs)

    monkeypatch.setattr(coordination, "rearm", broken)
    result = tools.call(session, "schedule_create", {"prompt": "x", "after_seconds": 60})
    assert not result.is_error
    assert value(result.content)["id"] == "schedule-1"


def test_a_create_past_the_prompt_limit_is_refused_and_a_longer_logged_prompt_still_lists(
    store: MemoryStore, coordination: Coordination, settings: Settings, clock: FakeClock
) -> None:
    # given a deployment whose limit is 64 bytes, read from its environment
    limited = Settings.from_env({"DSH_SCHEDULE_MAX_PROMPT_BYTES": "64"},
                                sessions=settings.sessions, prefix=settings.prefix)
    assert limited.max_prompt_bytes == 64
    tools = ScheduleTools(store, coordination, limited, clock)
    session = new_session(store)
    # and a log holding a longer prompt, accepted before the limit
    old = {"version": 1, "operation": "create", "schedule": {
        "id": "schedule-1", "kind": "after", "prompt": "p" * 100, "afterSeconds": 600,
        "scheduledAt": "2026-12-01T12:10:00.000Z"}}
    store.append(session, [NewEvent(type=SCHEDULE_CHANGE, time=clock(), data=old)], 0)

    # when a create carries 65 bytes, and another 64
    refused = tools.call(session, "schedule_create", {"prompt": "q" * 65, "after_seconds": 60})
    made = tools.call(session, "schedule_create", {"prompt": "q" * 64, "after_seconds": 60})

    # then the first is refused naming the limit, with nothing appended for it
    assert value(refused.content) == {"code": "invalid_prompt", "message": (
        "prompt must be at most 64 bytes of UTF-8 after trimming whitespace; shorten it.")}
    assert value(made.content)["id"] == "schedule-2"
    listed = value(tools.call(session, "schedule_list", {}).content)
    assert [len(v["prompt"]) for v in listed] == [100, 64]


@pytest.mark.parametrize("raw", ["0", "1048577", "32k", "-5"])
def test_a_prompt_limit_out_of_range_is_a_bad_setting(raw: str) -> None:
    with pytest.raises(SettingsError, match="max_prompt_bytes must be a whole number of bytes"):
        Settings.from_env({"DSH_SCHEDULE_MAX_PROMPT_BYTES": raw})
