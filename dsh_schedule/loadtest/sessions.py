"""Session logs the load test starts from, written straight into a JSONL store's files,
and what the processes later wrote into them.

Writing is set-up, not measurement: files are written whole with the store's own line
codec and made durable once, so that the measured transactions find them as a long-lived
deployment would. Every log written here passes the v1 invariant. Reading follows only the
session log format (docs/architecture.md#session-logs), so the figures taken from real
host and worker processes do not depend on how those processes work inside.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

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
    _write(store, session_id, b"".join(encode_event(e) for e in events),
           created_at_ms=created_at_ms, durable=durable)


def write_sessions(store: JsonlStore, session_ids: Sequence[str], events: Sequence[Event], *,
                   created_at_ms: int) -> int:
    """Write every session of ``session_ids`` with the same ``events`` (encoded once), not
    fsynced (call ``os.sync`` after); returns the bytes written."""
    body = b"".join(encode_event(e) for e in events)
    total = 0
    for session_id in session_ids:
        total += _write(store, session_id, body, created_at_ms=created_at_ms, durable=False)
    return total


def _write(store: JsonlStore, session_id: str, body: bytes, *, created_at_ms: int,
           durable: bool) -> int:
    header = SessionHeader(id=session_id, createdAt=created_at_ms)
    payload = encode_header(header) + body
    store.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(store.path(session_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                 0o666)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return len(payload)


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


def served_session(length: int, *, now_ms: int) -> list[Event]:
    """A session of ``length`` events of ordinary agent work (``conversation``, ending a
    day before ``now_ms``) and then one ``at`` reminder, created a minute before
    ``now_ms``, that is due 30 seconds before it: the first wake dispatches it and the host
    delivers it, so the worker and the host each read the whole session once."""
    start_ms = now_ms - length * 1000 - DAY_MS
    events = conversation(length, start_ms=start_ms)
    record = AtSchedule(id="schedule-served", prompt="served reminder",
                        scheduledAt=format_instant(now_ms - 30_000))
    events.append(Event(type=SCHEDULE_CHANGE, seq=len(events), time=now_ms - 60_000,
                        data=encode_change(CreateChange(schedule=record))))
    return events


# -- reading what the processes wrote ------------------------------------------------------

DISPATCH: Final = "dispatch"
DELIVERY: Final = "delivery"


def reminder_mark(line: bytes) -> tuple[str, int] | None:
    """What an event line says about a reminder: (``DISPATCH``, its time) for a dispatch
    record (written by the worker just before its followup entry), (``DELIVERY``, its time)
    for the ``user/message`` that delivered a reminder into the session, else None."""
    try:
        event: Any = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("time"), int):
        return None
    data = event.get("data")
    if not isinstance(data, dict):
        return None
    if event.get("type") == SCHEDULE_CHANGE and data.get("operation") == "dispatch":
        return DISPATCH, event["time"]
    source = data.get("source")
    if (event.get("type") == USER_MESSAGE and isinstance(source, dict)
            and source.get("kind") == "plugin" and source.get("reminders")):
        return DELIVERY, event["time"]
    return None


class SessionTails:
    """The first reminder dispatch and delivery in each of many session files, read from
    where each file ended when it was handed over (only new complete lines are read)."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self._paths = paths
        self._offsets = {name: path.stat().st_size for name, path in paths.items()}
        self.dispatched: dict[str, int] = {}
        self.delivered: dict[str, int] = {}

    def pending(self) -> int:
        return len(self._paths) - len(self.delivered)

    def forget(self, names: Iterable[str]) -> None:
        """Stop following these sessions (nothing is to come in them)."""
        for name in names:
            self._paths.pop(name, None)
            self.dispatched.pop(name, None)
            self.delivered.pop(name, None)

    def poll(self) -> int:
        """Read what the sessions not yet delivered to have gained; how many remain."""
        for name, path in self._paths.items():
            if name in self.delivered:
                continue
            offset = self._offsets[name]
            try:
                if path.stat().st_size <= offset:
                    continue
                with path.open("rb") as file:
                    file.seek(offset)
                    chunk = file.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1
            self._offsets[name] = offset + end
            for line in chunk[:end].splitlines():
                mark = reminder_mark(line)
                if mark is None:
                    continue
                seen = self.dispatched if mark[0] == DISPATCH else self.delivered
                seen.setdefault(name, mark[1])
        return self.pending()
