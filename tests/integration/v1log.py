"""A session log that uses every version-1 record, written by the real tools and the due
path's planning on a fixed clock: the same calls must write the same bytes with or without
calendar rules (``tests/integration/data/v1-log.jsonl`` holds the bytes the code before
calendar rules wrote; regenerate it only from that code)."""

from __future__ import annotations

from pathlib import Path

import fakeredis

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.dispatch import plan_dispatch
from dsh_schedule.shared.core.due import Wait, due_decision
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.records import encode_change
from dsh_schedule.shared.core.views import ToolResult
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.port import SessionStore
from tests.support import T0, FakeClock

SESSION = "v1"


def write_v1_log(sessions: Path, *, lifecycle: bool | None = None,
                 answers: list[str] | None = None) -> Path:
    """Create, list, delete and dispatch every version-1 kind, with the lifecycle on or
    off (None: the settings' default); the log file's path. ``answers`` receives each
    tool call's rendered answer."""
    settings = Settings.from_env({}, sessions=sessions, prefix="v1log:", queue="v1log",
                                 lifecycle=lifecycle)
    said = answers if answers is not None else []
    store = JsonlStore(sessions)
    store.create(SessionHeader(id=SESSION, createdAt=T0, timeZone="Europe/Berlin"))
    clock = FakeClock()
    tools = ScheduleTools(store, Coordination(fakeredis.FakeRedis(), settings), settings, clock)
    for args in (
        {"prompt": "stretch", "after_seconds": 600},
        {"prompt": "call the office", "at": {"date": "2026-12-01", "time": "17:00:00",
                                             "time_zone": "Europe/Berlin"}},
        {"prompt": "check CI", "every_seconds": 300},
        {"prompt": "water the plants", "every_seconds": 3600},
        {"prompt": "never mind", "at": "2026-12-02T09:00:00Z"},
    ):
        said.append(_answered(tools.call(SESSION, "schedule_create", args)))
    said.append(_answered(tools.call(SESSION, "schedule_delete", {"id": "schedule-5"})))
    for step_s in (600, 700, 20_000):
        clock.advance(step_s)
        dispatch_due(store, SESSION, clock())
    said.append(_answered(tools.call(SESSION, "schedule_list", {})))
    return sessions / f"{SESSION}.jsonl"


def dispatch_due(store: SessionStore, session_id: str, now_ms: int) -> None:
    """Append what the due path plans at ``now_ms``, one decision after another, until
    nothing is due."""
    while True:
        session, state = store.load(session_id)
        decision = due_decision(state, now_ms)
        if isinstance(decision, Wait):
            return
        plan = plan_dispatch(decision)
        events = [NewEvent(type=SCHEDULE_CHANGE, time=now_ms, data=encode_change(c))
                  for c in plan.changes]
        store.append(session_id, events, expected_seq=len(session.events))


def _answered(result: ToolResult) -> str:
    assert not result.is_error, result.content
    return result.content
