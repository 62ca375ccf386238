"""Session logs the load test starts from, written straight into a JSONL store's files.

These are set-up, not measurement: files are written whole with the store's own line codec
and made durable once, so that the measured transactions find them as a long-lived
deployment would. Every log written here passes the v1 invariant.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Final

from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    Event,
    SessionHeader,
)
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.records import (
    AfterSchedule,
    AtSchedule,
    CreateChange,
    DeleteChange,
    encode_change,
)
from dsh_schedule.shared.store.codec import encode_event, encode_header
from dsh_schedule.shared.store.jsonl import JsonlStore

DAY_MS: Final = 86_400_000
# One schedule/change per this many events: about 300 in a 100 000-event log.
CHANGE_EVERY: Final = 333
# A long session keeps this many reminders active; older ones are deleted.
ACTIVE_KEPT: Final = 8
_TURN_TEXT: Final = "Please look at the build log and tell me what failed in the last run."
_TOOL_OUTPUT: Final = "line " * 60


def write_session(store: JsonlStore, session_id: str, events: list[Event], *,
                  created_at_ms: int, durable: bool = True) -> None:
    """Write a whole session file (header + events); fsync it when ``durable``."""
    header = SessionHeader(id=session_id, createdAt=created_at_ms)
    payload = encode_header(header) + b"".join(encode_event(e) for e in events)
    store.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(store.path(session_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                 0o666)
    try:
        os.write(fd, payload)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def conversation(length: int, *, start_ms: int) -> list[Event]:
    """``length`` events of ordinary agent work (turns, messages, tool calls, answers) with
    one ``schedule/change`` every ``CHANGE_EVERY`` events: creates of far-future reminders,
    and deletes that keep at most ``ACTIVE_KEPT`` of them active."""
    events: list[Event] = []
    created = 0
    active: list[str] = []
    turn = 0
    while len(events) < length:
        for kind, data in _turn_events(turn):
            events.append(_event(kind, len(events), start_ms, data))
            if len(events) % CHANGE_EVERY == 0:
                change, created = _next_change(created, active, start_ms + len(events) * 1000)
                events.append(_event(SCHEDULE_CHANGE, len(events), start_ms, change))
        turn += 1
    # Every prefix of a valid log is valid, so cutting never breaks the Schedule fold.
    return events[:length]


def _event(kind: str, seq: int, start_ms: int, data: Any) -> Event:
    return Event(type=kind, seq=seq, time=start_ms + seq * 1000, data=data)


def _turn_events(turn: int) -> Iterator[tuple[str, Any]]:
    text = [{"type": "text", "text": _TURN_TEXT}]
    yield TURN_START, {"turn": turn}
    yield USER_MESSAGE, {"content": text, "source": {"kind": "user", "rpcId": f"rpc-{turn}"}}
    yield STEP_START, {"turn": turn, "step": 0}
    yield "tool/call", {"name": "read_file", "args": {"path": f"logs/build-{turn}.txt"}}
    yield "tool/result", {"content": _TOOL_OUTPUT, "isError": False}
    yield STEP_END, {"turn": turn, "step": 0}
    yield STEP_START, {"turn": turn, "step": 1}
    yield "assistant/message", {"content": [{"type": "text", "text": "The linker failed."}]}
    yield STEP_END, {"turn": turn, "step": 1}
    yield TURN_END, {"turn": turn}


def _next_change(created: int, active: list[str], now_ms: int) -> tuple[dict[str, Any], int]:
    if len(active) >= ACTIVE_KEPT:
        return encode_change(DeleteChange(id=active.pop(0))), created
    created += 1
    schedule_id = f"schedule-{created}"
    active.append(schedule_id)
    record = AfterSchedule(id=schedule_id, prompt=f"check item {created}",
                           afterSeconds=60 * 86_400,
                           scheduledAt=format_instant(now_ms + 60 * DAY_MS))
    return encode_change(CreateChange(schedule=record)), created


def reminders(count: int, *, agent_index: int, base_ms: int) -> list[Event]:
    """``count`` creates of future ``at`` reminders, distinct targets per agent."""
    events = []
    for k in range(count):
        target = base_ms + (agent_index % 3600) * 1000 + k * 60_000
        record = AtSchedule(id=f"schedule-{k + 1}", prompt=f"reminder {k + 1}",
                            scheduledAt=format_instant(target))
        change = encode_change(CreateChange(schedule=record))
        events.append(Event(type=SCHEDULE_CHANGE, seq=k, time=base_ms - DAY_MS, data=change))
    return events
