"""The session log's plain data: the header line and the events after it
(docs/architecture.md#session-logs)."""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Final, overload

import msgspec

from dsh_schedule.shared.core.delivered import LedgerView

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


class EventSequence(Sequence[Event]):
    """A read-only sequence of a fixed number of log events, equal to any sequence of the
    same events. Subclasses say how one event is had (``_event``) and keep ``_length``."""

    __slots__ = ()
    _length: int

    @abstractmethod
    def _event(self, index: int) -> Event:
        """The event at ``index``, which is within ``0..len(self)``."""

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Event, ...]: ...

    def __getitem__(self, index: int | slice) -> Event | tuple[Event, ...]:
        if isinstance(index, slice):
            return tuple(self._event(i) for i in range(*index.indices(self._length)))
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("event index out of range")
        return self._event(index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(other) == self._length and all(
            a == b for a, b in zip(self, other, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]


class EventLog(EventSequence):
    """A read-only view of the first ``length`` events of an append-only list.

    The in-memory store hands these out instead of copying a long log on every read: the
    list it keeps only ever grows, so a view taken at one length keeps seeing exactly
    those events, whatever is appended later.
    """

    __slots__ = ("_base", "_length")

    def __init__(self, base: list[Event], length: int | None = None) -> None:
        self._base = base
        self._length = len(base) if length is None else length

    def _event(self, index: int) -> Event:
        return self._base[index]

    def __iter__(self) -> Iterator[Event]:
        return itertools.islice(self._base, self._length)

    def __repr__(self) -> str:
        return f"EventLog(length={self._length})"


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """A header and its events, as read from a store (``events[i].seq == i``).

    ``events`` may hold only part of the log in memory and read the rest back from the
    store when asked (docs/architecture.md#session-logs); its length is always the log's.
    ``ledger`` is the delivery ledger of the session's own suffix at that length, when
    the store kept one (a store answers one whenever the session's Schedule records
    fold); None means "derive it from the events".
    """

    header: SessionHeader
    events: Sequence[Event]
    ledger: LedgerView | None = None

    @property
    def seed_length(self) -> int:
        return self.header.seedLength or 0


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event to append; the store assigns its ``seq``."""

    type: str
    time: int
    data: Any
