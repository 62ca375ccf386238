"""What the console's pages show, read from session logs: the transcript, the active
reminders, the receipts of dispatches, a session's live state and the lateness of
deliveries. Plain data for the templates; reading only (nothing here writes a log).

Every text a person or a model wrote stays plain text here: the templates escape it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dsh_schedule.reminders import ActiveReminder, Unreadable
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, Event, Session
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.ledger import SOURCE_PLUGIN
from dsh_schedule.shared.core.presentation import receipt_value, reminder_presentation
from dsh_schedule.shared.core.views import list_value, render
from dsh_schedule.web.model import local_text

ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_CALL: Final = "tool/call"
TOOL_RESULT: Final = "tool/result"
TIME_CONTEXT: Final = "time-context"

TRANSCRIPT_EVENTS: Final = 400  # the transcript shows at most the latest this many events
RECEIPTS: Final = 50  # the receipts panel shows at most the latest this many dispatches
SCAN_EVENTS: Final = 2000  # how far back a summary or the histogram looks in one log
RECENT_DELIVERIES: Final = 500  # the histogram counts at most the latest this many

# Lateness buckets, upper bounds in seconds (the last is open).
LATENESS_BOUNDS: Final = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class ReminderLine:
    """One reminder a delivered message carries."""

    schedule_id: str
    occurrence_at: str
    prompt: str | None  # from the dispatch's receipt; None when it cannot be paired
    lateness_ms: int | None  # the message's time minus the occurrence


@dataclass(frozen=True)
class TranscriptItem:
    """One line of the transcript. ``kind`` is ``user``, ``reading``, ``reminder``,
    ``assistant`` or ``tool``."""

    kind: str
    seq: int
    time_ms: int
    text: str
    zone: str | None = None  # a person's prompt: the client's zone
    reminders: tuple[ReminderLine, ...] = ()  # a reminder: what it carries
    tool: str | None = None  # a tool call: its name
    result: str | None = None  # a tool call: the rendered answer
    is_error: bool = False

    @property
    def outcome(self) -> str:
        """A tool call's answer in a word: its error code, or ``ok``."""
        if not self.is_error:
            return "ok"
        try:
            value = json.loads(self.result or "")
        except ValueError:
            return "error"
        code = value.get("code") if isinstance(value, dict) else None
        return code if isinstance(code, str) else "error"

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """A tool call's answer as ``(field, text)`` pairs for a person: an object's
        fields, or one line per item of a list (empty when the answer is not JSON)."""
        try:
            value = json.loads(self.result or "")
        except ValueError:
            return ()
        if isinstance(value, dict):
            return tuple((str(k), _field_text(v)) for k, v in value.items())
        if isinstance(value, list):
            return tuple((str(item.get("id", i + 1)) if isinstance(item, dict) else str(i + 1),
                          _field_text(item)) for i, item in enumerate(value))
        return (("value", _field_text(value)),)


def _field_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_field_text(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_field_text(v) for v in value) or "none"
    return json.dumps(value)


@dataclass(frozen=True)
class ReminderRow:
    """One active reminder: its ``schedule_list`` view and when it is due."""

    view: dict[str, Any]
    due_ms: int  # deliveryNotBefore when the gate holds it back, else scheduledAt
    local: str  # scheduledAt in the session's zone
    not_before_local: str | None


@dataclass(frozen=True)
class Receipt:
    """The receipt of one dispatch, labelled ``session-local``."""

    seq: int
    time_ms: int
    value: dict[str, Any]

    @property
    def json(self) -> str:
        return render(self.value)


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


@dataclass(frozen=True)
class Bucket:
    label: str
    count: int
    share: float  # of the largest bucket, 0..1 (bar length)


@dataclass(frozen=True)
class Lateness:
    """The lateness of recent deliveries: delivered message time minus occurrence."""

    count: int
    buckets: tuple[Bucket, ...]
    median_ms: int | None
    p90_ms: int | None
    max_ms: int | None


# -- reading one log ----------------------------------------------------------------------


def _text(data: Any) -> str:
    """The text of a message's ``content`` (its text parts, joined)."""
    content = data.get("content") if isinstance(data, dict) else None
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(part.get("text", "") for part in content
                     if isinstance(part, dict) and isinstance(part.get("text"), str))


def _source(data: Any) -> dict[str, Any]:
    source = data.get("source") if isinstance(data, dict) else None
    return source if isinstance(source, dict) else {}


def is_reminder_message(event: Event) -> bool:
    return event.type == USER_MESSAGE and _source(event.data).get("plugin") == SOURCE_PLUGIN


def _pairs(event: Event) -> list[tuple[str, str]]:
    reminders = _source(event.data).get("reminders")
    if not isinstance(reminders, list):
        return []
    return [(str(r.get("scheduleId")), str(r.get("occurrenceAt"))) for r in reminders
            if isinstance(r, dict)]


def _occurrence_ms(text: str) -> int | None:
    try:
        return parse_instant(text)
    except ValueError:
        return None


def _receipts(events: Sequence[Event], start: int, seed_length: int) -> list[Receipt]:
    """The receipts of the dispatches in ``events[start:]``, in log order."""
    found: list[Receipt] = []
    for event in events[start:]:
        if event.type != SCHEDULE_CHANGE or not isinstance(event.data, dict):
            continue
        if event.data.get("operation") != "dispatch":
            continue
        try:
            shown = reminder_presentation(events, event.seq, seed_length)
        except ScheduleLogError:
            continue
        if shown is not None:
            found.append(Receipt(seq=event.seq, time_ms=event.time,
                                 value=receipt_value(shown)))
    return found


def transcript(events: Sequence[Event], start: int, receipts: Iterable[Receipt]
               ) -> list[TranscriptItem]:
    """The transcript of ``events[start:]``: prompts, readings, reminders (with the
    prompts their receipts name), tool calls with their answers, assistant answers."""
    prompts = {(r.value["scheduleId"], r.value["occurrenceAt"]): r.value["prompt"]
               for r in receipts}
    items: list[TranscriptItem] = []
    pending_call: Event | None = None
    for event in events[start:]:
        data = event.data
        if event.type == USER_MESSAGE:
            source = _source(data)
            if source.get("plugin") == SOURCE_PLUGIN:
                lines = []
                for schedule_id, occurrence in _pairs(event):
                    at = _occurrence_ms(occurrence)
                    lines.append(ReminderLine(
                        schedule_id=schedule_id, occurrence_at=occurrence,
                        prompt=prompts.get((schedule_id, occurrence)),
                        lateness_ms=None if at is None else event.time - at,
                    ))
                items.append(TranscriptItem(kind="reminder", seq=event.seq,
                                            time_ms=event.time, text=_text(data),
                                            reminders=tuple(lines)))
            elif source.get("plugin") == TIME_CONTEXT:
                items.append(TranscriptItem(kind="reading", seq=event.seq,
                                            time_ms=event.time, text=_text(data)))
            else:
                zone = source.get("clientTimeZone")
                items.append(TranscriptItem(
                    kind="user", seq=event.seq, time_ms=event.time, text=_text(data),
                    zone=zone if isinstance(zone, str) else None,
                ))
        elif event.type == ASSISTANT_MESSAGE:
            items.append(TranscriptItem(kind="assistant", seq=event.seq, time_ms=event.time,
                                        text=_text(data)))
        elif event.type == TOOL_CALL:
            pending_call = event
        elif event.type == TOOL_RESULT and pending_call is not None and isinstance(data, dict):
            call = pending_call.data if isinstance(pending_call.data, dict) else {}
            items.append(TranscriptItem(
                kind="tool", seq=pending_call.seq, time_ms=pending_call.time,
                text=_compact(call.get("args")), tool=str(call.get("name")),
                result=str(data.get("content")), is_error=bool(data.get("isError")),
            ))
            pending_call = None
    return items


def _compact(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(value)


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
    receipts = _receipts(events, max(start, seed), seed)
    rows = [] if state is None else reminder_rows(state, now_ms=now_ms, zone=zone)
    return SessionPage(
        id=session.header.id,
        zone=zone,
        created_ms=session.header.createdAt,
        length=len(events),
        transcript=tuple(transcript(events, start, receipts)),
        hidden_events=start,
        reminders=tuple(rows),
        list_json=render([row.view for row in rows]),
        receipts=tuple(reversed(receipts[-RECEIPTS:])),
        problem=problem,
    )


def last_delivery_ms(events: Sequence[Event]) -> int | None:
    """When the latest reminder was delivered into the log (within the last
    ``SCAN_EVENTS`` events)."""
    for index in range(len(events) - 1, max(len(events) - SCAN_EVENTS, 0) - 1, -1):
        event = events[index]
        if is_reminder_message(event):
            return event.time
    return None


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


def deliveries(events: Sequence[Event]) -> list[tuple[int, int]]:
    """``(delivered at, lateness)`` in ms for every reminder each delivered message
    carries, within the last ``SCAN_EVENTS`` events."""
    found = []
    for event in events[max(len(events) - SCAN_EVENTS, 0):]:
        if not is_reminder_message(event):
            continue
        for _schedule_id, occurrence in _pairs(event):
            at = _occurrence_ms(occurrence)
            if at is not None:
                found.append((event.time, event.time - at))
    return found


def _bucket_label(index: int) -> str:
    if index == 0:
        return f"< {LATENESS_BOUNDS[0]:g} s"
    if index == len(LATENESS_BOUNDS):
        return f"≥ {LATENESS_BOUNDS[-1]:g} s"
    return f"{LATENESS_BOUNDS[index - 1]:g}–{LATENESS_BOUNDS[index]:g} s"


def _percentile(ordered: Sequence[int], fraction: float) -> int:
    """The nearest-rank percentile of a sorted, non-empty sequence."""
    rank = max(math.ceil(fraction * len(ordered)), 1)
    return ordered[rank - 1]


def lateness(found: Iterable[tuple[int, int]], *, limit: int = RECENT_DELIVERIES) -> Lateness:
    """The histogram of the latest ``limit`` deliveries' lateness. A negative lateness (a
    message whose time lies before its occurrence: clocks of different machines) counts
    in the first bucket."""
    recent = sorted(found)[-limit:] if limit > 0 else []
    counts = [0] * (len(LATENESS_BOUNDS) + 1)
    for _at, late_ms in recent:
        seconds = late_ms / 1000
        index = next((i for i, bound in enumerate(LATENESS_BOUNDS) if seconds < bound),
                     len(LATENESS_BOUNDS))
        counts[index] += 1
    most = max(counts)
    buckets = tuple(Bucket(label=_bucket_label(i), count=n, share=n / most if most else 0.0)
                    for i, n in enumerate(counts))
    ordered = sorted(late for _at, late in recent)
    return Lateness(
        count=len(ordered),
        buckets=buckets,
        median_ms=_percentile(ordered, 0.5) if ordered else None,
        p90_ms=_percentile(ordered, 0.9) if ordered else None,
        max_ms=ordered[-1] if ordered else None,
    )


# -- one view across sessions ---------------------------------------------------------------

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
