"""Small test helpers shared by the integration tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, SessionHeader
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.store.port import SessionStore

T0 = parse_instant("2026-12-01T12:00:00.000Z")


class FakeClock:
    """An injectable wall clock in epoch milliseconds."""

    def __init__(self, now_ms: int = T0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)


def new_session(store: SessionStore, session_id: str = "s1", time_zone: str | None = None) -> str:
    store.create(SessionHeader(id=session_id, createdAt=T0, timeZone=time_zone))
    return session_id


def value(content: str) -> Any:
    return json.loads(content)


def append_raw_line(path: Path, obj: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(obj) + "\n")


def reminder_messages(store: SessionStore, session: str) -> list[dict[str, Any]]:
    """The data of every reminder ``user/message`` delivered into the session."""
    return [
        e.data for e in store.read(session).events
        if e.type == USER_MESSAGE and e.data["source"].get("plugin") == "tool-schedule"
    ]


def reminder_texts(store: SessionStore, session: str) -> list[str]:
    """The framing text of every reminder delivered into the session."""
    return [m["content"][0]["text"] for m in reminder_messages(store, session)]


def dispatch_records(store: SessionStore, session: str) -> list[dict[str, Any]]:
    """Every ``schedule/change`` dispatch record in the session log."""
    return [
        e.data for e in store.read(session).events
        if e.type == SCHEDULE_CHANGE and e.data["operation"] == "dispatch"
    ]
