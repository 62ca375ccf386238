"""The session log's plain data: the header line and the events after it (DESIGN §3.1)."""

from __future__ import annotations

from typing import Any, Final

import msgspec

SCHEDULE_CHANGE: Final = "schedule/change"
USER_MESSAGE: Final = "user/message"
TURN_START: Final = "turn/start"
TURN_END: Final = "turn/end"
STEP_START: Final = "step/start"
STEP_END: Final = "step/end"


class SessionHeader(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Line 1 of a session file. Without ``timeZone`` the session is *headerless*."""

    type: str = "session"
    version: int = 0
    id: str
    createdAt: int
    timeZone: str | None = None
    parentSession: str | None = None
    seedLength: int | None = None


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One log event; ``seq`` equals its index in the log."""

    type: str
    seq: int
    time: int
    data: Any


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """A header and its events, as read from a store."""

    header: SessionHeader
    events: tuple[Event, ...]

    @property
    def seed_length(self) -> int:
        return self.header.seedLength or 0


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to append; the store assigns its ``seq``."""

    type: str
    time: int
    data: Any
