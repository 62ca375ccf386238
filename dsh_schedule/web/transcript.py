"""A session log read as the console's transcript: prompts, readings, delivered
reminders (with the prompts their receipts name), tool calls with their answers, and
the receipts of dispatches. Plain data for the templates; reading only.

Every text a person or a model wrote stays plain text here: the templates escape it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, Event
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.ledger import SOURCE_PLUGIN
from dsh_schedule.shared.core.presentation import receipt_value, reminder_presentation
from dsh_schedule.shared.core.views import render

ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_CALL: Final = "tool/call"
TOOL_RESULT: Final = "tool/result"
TIME_CONTEXT: Final = "time-context"


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
class Receipt:
    """The receipt of one dispatch, labelled ``session-local``."""

    seq: int
    time_ms: int
    value: dict[str, Any]

    @property
    def json(self) -> str:
        return render(self.value)



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


def reminder_pairs(event: Event) -> list[tuple[str, str]]:
    reminders = _source(event.data).get("reminders")
    if not isinstance(reminders, list):
        return []
    return [(str(r.get("scheduleId")), str(r.get("occurrenceAt"))) for r in reminders
            if isinstance(r, dict)]


def occurrence_ms(text: str) -> int | None:
    try:
        return parse_instant(text)
    except ValueError:
        return None


def receipts(events: Sequence[Event], start: int, seed_length: int) -> list[Receipt]:
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
                for schedule_id, occurrence in reminder_pairs(event):
                    at = occurrence_ms(occurrence)
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
