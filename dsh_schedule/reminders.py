"""One view across sessions: the active reminders of every session of a store, what
``dsh-schedule reminders`` prints and the console's sessions page shows (docs/web.md).

The store is walked session by session (``SessionStore.sessions`` for the ids, then
``load`` of one session at a time) and the rows are yielded as they are found, so a
caller that prints or stops early never holds more than one session's reminders. A
session that cannot be read, or whose Schedule records do not fold, is yielded as an
``Unreadable`` row in its place, never left out: a list that silently lacked a session
would be a false answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.views import list_value
from dsh_schedule.shared.store.port import SessionStore


@dataclass(frozen=True)
class ActiveReminder:
    """One active reminder of one session: its ``schedule_list`` view and its next
    target, the instant it is next due (``deliveryNotBefore`` when it has one, else
    ``scheduledAt``), in epoch milliseconds."""

    session: str
    view: dict[str, Any]
    due_ms: int

    def value(self) -> dict[str, Any]:
        """The row as one JSON object: ``session``, then the view's fields."""
        return {"session": self.session, **self.view}

    def matches(self, text: str) -> bool:
        """Whether ``text`` occurs, ignoring case, in the session id, the reminder's id,
        kind or prompt."""
        needle = text.casefold()
        return any(needle in str(field).casefold() for field in (
            self.session, self.view.get("id", ""), self.view.get("kind", ""),
            self.view.get("prompt", "")))


@dataclass(frozen=True)
class Unreadable:
    """A session whose reminders cannot be listed, and why."""

    session: str
    reason: str


def active_reminders(store: SessionStore, *, now_ms: int,
                     due_before_ms: int | None = None) -> Iterator[ActiveReminder | Unreadable]:
    """The active reminders of every session of ``store``, sessions in id order and each
    session's reminders in create order; with ``due_before_ms``, only those whose next
    target lies before it. A session that cannot be read or folded is an ``Unreadable``
    row (``PersistenceError`` only when the store cannot list its sessions)."""
    for session_id in store.sessions():
        try:
            _, state = store.load(session_id)
        except (PersistenceError, ScheduleLogError) as exc:
            yield Unreadable(session_id, str(exc))
            continue
        for view in list_value(state, now_ms):
            not_before = view.get("deliveryNotBefore")
            due_ms = parse_instant(not_before if not_before is not None else view["scheduledAt"])
            if due_before_ms is None or due_ms < due_before_ms:
                yield ActiveReminder(session_id, view, due_ms)
