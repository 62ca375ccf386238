"""What the console's pages show, read from session logs: the transcript, the active
reminders, the receipts of dispatches, a session's live state and the lateness of
deliveries. Plain data for the templates; reading only (nothing here writes a log).

Every text a person or a model wrote stays plain text here: the templates escape it.
The transcript is read by ``transcript``, deliveries and their lateness by ``deliveries``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from dsh_schedule.reminders import ActiveReminder, Unreadable
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Session
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.views import list_value, render
from dsh_schedule.web.deliveries import Lateness, deliveries, last_delivery_ms, lateness
from dsh_schedule.web.model import local_text
from dsh_schedule.web.transcript import Receipt, TranscriptItem, receipts, transcript

__all__ = [
    "Lateness",
    "ReminderListing",
    "ReminderRow",
    "SessionPage",
    "SessionSummary",
    "TranscriptItem",
    "deliveries",
    "lateness",
    "reminder_listing",
    "reminder_rows",
    "session_page",
    "session_summary",
    "unreadable_summary",
]

TRANSCRIPT_EVENTS: Final = 400  # the transcript shows at most the latest this many events
RECEIPTS: Final = 50  # the receipts panel shows at most the latest this many dispatches


@dataclass(frozen=True)
class ReminderRow:
    """One active reminder: its ``schedule_list`` view and when it is due."""

    view: dict[str, Any]
    due_ms: int  # deliveryNotBefore when the gate holds it back, else scheduledAt
    local: str  # scheduledAt in the session's zone
    not_before_local: str | None



@dataclass(frozen=True)
class SessionPage:
    """Everything the session page shows of one log at one length."""

    id: str
    zone: str | None
    created_ms: int
    length: int
    transcript: tuple[TranscriptItem, ...]
    hidden_events: int  # earlier events the transcript leaves out
    reminders: tuple[ReminderRow, ...]
    list_json: str  # the schedule_list value, as the tool renders it
    receipts: tuple[Receipt, ...]
    problem: str | None = None  # why the reminders could not be folded


@dataclass(frozen=True)
class SessionSummary:
    """One row of the sessions page."""

    id: str
    zone: str | None
    length: int
    active: int
    overdue: int
    next_due_ms: int | None
    next_due_local: str | None
    last_delivery_ms: int | None
    problem: str | None = None



def reminder_rows(state: FoldState, *, now_ms: int, zone: str | None) -> list[ReminderRow]:
    rows = []
    for view in list_value(state, now_ms):
        scheduled = parse_instant(view["scheduledAt"])
        not_before = view.get("deliveryNotBefore")
        not_before_ms = parse_instant(not_before) if not_before is not None else None
        rows.append(ReminderRow(
            view=view,
            due_ms=not_before_ms if not_before_ms is not None else scheduled,
            local=local_text(scheduled, zone),
            not_before_local=None if not_before_ms is None else local_text(not_before_ms, zone),
        ))
    return rows


def session_page(session: Session, state: FoldState | None, problem: str | None, *,
                 now_ms: int) -> SessionPage:
    """The session page of a log read at one length (``state`` None: it does not fold,
    and ``problem`` says why)."""
    events = session.events
    zone = session.header.timeZone
    start = max(len(events) - TRANSCRIPT_EVENTS, 0)
    seed = session.seed_length
    found = receipts(events, max(start, seed), seed)
    rows = [] if state is None else reminder_rows(state, now_ms=now_ms, zone=zone)
    return SessionPage(
        id=session.header.id,
        zone=zone,
        created_ms=session.header.createdAt,
        length=len(events),
        transcript=tuple(transcript(events, start, found)),
        hidden_events=start,
        reminders=tuple(rows),
        list_json=render([row.view for row in rows]),
        receipts=tuple(reversed(found[-RECEIPTS:])),
        problem=problem,
    )



def session_summary(session: Session, state: FoldState | None, problem: str | None, *,
                    now_ms: int) -> SessionSummary:
    zone = session.header.timeZone
    rows = [] if state is None else reminder_rows(state, now_ms=now_ms, zone=zone)
    waiting = [row for row in rows if row.view["state"] != "paused"]  # a paused one is not due
    upcoming = min(waiting, key=lambda row: row.due_ms, default=None)
    return SessionSummary(
        id=session.header.id,
        zone=zone,
        length=len(session.events),
        active=len(rows),
        overdue=sum(1 for row in rows if row.view["state"] == "overdue"),
        next_due_ms=None if upcoming is None else upcoming.due_ms,
        next_due_local=None if upcoming is None else local_text(upcoming.due_ms, zone),
        last_delivery_ms=last_delivery_ms(session.events),
        problem=problem,
    )


def unreadable_summary(session_id: str, exc: PersistenceError | ScheduleLogError
                       ) -> SessionSummary:
    return SessionSummary(id=session_id, zone=None, length=0, active=0, overdue=0,
                          next_due_ms=None, next_due_local=None, last_delivery_ms=None,
                          problem=str(exc))


# -- lateness -------------------------------------------------------------------------------



LISTED_REMINDERS: Final = 200  # the sessions page lists at most this many reminders


@dataclass(frozen=True)
class ReminderListing:
    """The active reminders of every session that pass the filter, at most
    ``LISTED_REMINDERS`` of them (``more``: others pass it too), and the sessions that
    could not be listed, with why."""

    rows: tuple[ActiveReminder, ...]
    more: bool
    unreadable: tuple[Unreadable, ...]


def reminder_listing(found: Iterable[ActiveReminder | Unreadable], text: str, *,
                     limit: int = LISTED_REMINDERS) -> ReminderListing:
    """The rows of ``found`` whose fields hold ``text`` (all when it is empty), taken
    until ``limit`` of them and one more are seen: the walk stops there."""
    rows: list[ActiveReminder] = []
    unreadable: list[Unreadable] = []
    for row in found:
        if isinstance(row, Unreadable):
            unreadable.append(row)
        elif not text or row.matches(text):
            if len(rows) == limit:
                return ReminderListing(tuple(rows), True, tuple(unreadable))
            rows.append(row)
    return ReminderListing(tuple(rows), False, tuple(unreadable))
