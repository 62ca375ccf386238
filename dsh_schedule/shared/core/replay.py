"""The replay rules of ``schedule/change`` records, written once
(docs/architecture.md#replay-rules).

``deliver`` is what one dispatch does to the record it names: which occurrence it
delivered and what the record becomes. ``Replay`` applies whole changes to a fold in
progress and adds the session-wide rules (ids created once, only active records change,
recurring batches at least 300 seconds apart). ``apply_update`` is what one
``update`` does to the record it names. The fold, the ledger of dispatches and the
receipt projection all replay through this module, so they cannot disagree.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec

from dsh_schedule.shared.core.cron import parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.instant import MAX_MS, format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    RECURRING_TYPES,
    AfterSchedule,
    AtSchedule,
    Change,
    CreateChange,
    CronSchedule,
    DeleteChange,
    DispatchChange,
    EverySchedule,
    RecurringSchedule,
    Schedule,
    UpdateChange,
    check_until,
)
from dsh_schedule.shared.core.timesel import load_zone

RECURRING_GAP_MS: Final[int] = 300_000


class FoldState(msgspec.Struct, frozen=True, kw_only=True):
    """Active records in create order, every id ever created, the last recurring batch."""

    active: tuple[Schedule, ...] = ()
    created: frozenset[str] = frozenset()
    last_batch_ms: int | None = None

    def find(self, schedule_id: str) -> Schedule | None:
        for record in self.active:
            if record.id == schedule_id:
                return record
        return None


EMPTY: Final = FoldState()


def occurrence_at(record: EverySchedule, accepted_ms: int) -> int:
    """The latest anchor-aligned occurrence not after ``accepted_ms`` (>= scheduledAt)."""
    target = parse_instant(record.scheduledAt)
    period = record.everySeconds * 1000
    return target + (accepted_ms - target) // period * period


def _following(record: EverySchedule, occurrence_ms: int) -> EverySchedule | None:
    """The record once ``occurrence_ms`` was delivered; None past the last instant or
    once it has reached its end condition."""
    following = occurrence_ms + record.everySeconds * 1000
    if following > MAX_MS:
        return None
    return _continued(record, following)


_RecurringT = TypeVar("_RecurringT", EverySchedule, CronSchedule)


def _continued(record: _RecurringT, following_ms: int) -> _RecurringT | None:
    """``record`` after one more delivery, its next target ``following_ms``; None when
    that delivery reached ``count`` or the next target would pass ``until``."""
    delivered = record.deliveredCount + 1
    if record.count is not None and delivered >= record.count:
        return None
    if record.until is not None and following_ms > parse_instant(record.until):
        return None
    return msgspec.structs.replace(
        record, scheduledAt=format_instant(following_ms), deliveredCount=delivered
    )


def cron_occurrence_at(record: CronSchedule, accepted_ms: int) -> int:
    """The latest occurrence of the rule not after ``accepted_ms`` (>= scheduledAt).

    It is never before the record's target: under the zone data a log was written with,
    the target is itself an occurrence not after the acceptance; should the zone data
    have moved an occurrence since, the target still bounds it, so replay never fails
    on it (docs/decisions.md#calendar-rules).
    """
    target = parse_instant(record.scheduledAt)
    latest = latest_at_or_before(parse_rule(record.cron), load_zone(record.timeZone), accepted_ms)
    return target if latest is None else max(latest, target)


def advance_cron(record: CronSchedule, accepted_ms: int) -> CronSchedule | None:
    """The record after a dispatch accepted at ``accepted_ms``: its target becomes the
    rule's first occurrence strictly after it; None past 9999, which ends the record."""
    following = next_after(parse_rule(record.cron), load_zone(record.timeZone), accepted_ms)
    if following is None:
        return None
    return _continued(record, following)


def _recurring_delivery(record: RecurringSchedule, accepted_ms: int) -> tuple[int, Schedule | None]:
    """The occurrence a recurring dispatch accepted at ``accepted_ms`` delivers, and the
    record after it. A dispatch accepted after ``until`` delivers the last occurrence not
    after ``until`` (never a later one), and the record ends with it."""
    until = parse_instant(record.until) if record.until is not None else None
    # A late wake: the latest occurrence due, but none past the end.
    latest = accepted_ms if until is None else min(accepted_ms, until)
    if isinstance(record, CronSchedule):
        occurrence = cron_occurrence_at(record, latest)
        return occurrence, advance_cron(record, latest)
    occurrence = occurrence_at(record, latest)
    return occurrence, _following(record, occurrence)


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """What one dispatch did: the record as it was dispatched, the occurrence it
    delivered, the batch time (None for a one-shot) and the record after it (None once
    the record has ended)."""

    record: Schedule
    occurrence_ms: int
    accepted_ms: int | None
    following: Schedule | None

    @property
    def occurrence_at(self) -> str:
        """The delivered occurrence as a canonical instant."""
        return format_instant(self.occurrence_ms)

    @property
    def accepted_at(self) -> str | None:
        """The batch's ``acceptedAt``; None for a one-shot."""
        return None if self.accepted_ms is None else format_instant(self.accepted_ms)


def deliver(record: Schedule, dispatch: DispatchChange) -> Delivery:
    """The delivery ``dispatch`` makes of ``record`` (the record as of the dispatch).

    ScheduleLogError when a one-shot dispatch carries ``acceptedAt``, a recurring one
    lacks it, or a recurring one was accepted before the record's current target.
    """
    if not isinstance(record, RECURRING_TYPES):
        if dispatch.acceptedAt is not None:
            raise ScheduleLogError("one-shot dispatch carries acceptedAt")
        if record.paused:
            raise ScheduleLogError(f"dispatch of paused schedule id {record.id!r}")
        return Delivery(
            record=record,
            occurrence_ms=parse_instant(record.scheduledAt),
            accepted_ms=None,
            following=None,
        )
    if dispatch.acceptedAt is None:
        raise ScheduleLogError("recurring dispatch lacks acceptedAt")
    if record.paused:
        raise ScheduleLogError(f"dispatch of paused schedule id {record.id!r}")
    accepted = parse_instant(dispatch.acceptedAt)
    if accepted < parse_instant(record.scheduledAt):
        raise ScheduleLogError("recurring dispatch accepted before its target")
    occurrence, following = _recurring_delivery(record, accepted)
    return Delivery(
        record=record, occurrence_ms=occurrence, accepted_ms=accepted, following=following
    )


class Replay:
    """A fold in progress, continued one decoded change at a time.

    Mutable and not thread-safe; ``state`` freezes what was replayed so far. A change
    that breaks a rule raises ScheduleLogError and leaves the replay unchanged.
    """

    def __init__(self, state: FoldState = EMPTY) -> None:
        # A dict keeps create order and finds an id at once.
        self._active: dict[str, Schedule] = {r.id: r for r in state.active}
        self._created: set[str] = set(state.created)
        self._last_batch_ms = state.last_batch_ms

    def apply(self, change: Change) -> Delivery | None:
        """Apply ``change``; the delivery when it is a dispatch, else None."""
        if isinstance(change, CreateChange):
            schedule = change.schedule
            if schedule.id in self._created:
                raise ScheduleLogError(f"schedule id {schedule.id!r} is created twice")
            self._created.add(schedule.id)
            self._active[schedule.id] = schedule
            return None
        record = self._active.get(change.id)
        if record is None:
            raise ScheduleLogError(f"{change.operation} of inactive schedule id {change.id!r}")
        if isinstance(change, DeleteChange):
            del self._active[change.id]
            return None
        if isinstance(change, UpdateChange):
            self._active[change.id] = apply_update(record, change)
            return None
        delivery = deliver(record, change)
        if delivery.accepted_ms is not None:
            self._open_batch(delivery.accepted_ms)
        if delivery.following is None:
            del self._active[change.id]
        else:
            self._active[change.id] = delivery.following
        return delivery

    def _open_batch(self, accepted_ms: int) -> None:
        """Make ``accepted_ms`` the last recurring batch: the same batch as the last one,
        or one at least 300 seconds after it (earlier ones included)."""
        last = self._last_batch_ms
        if last is not None and accepted_ms != last and accepted_ms < last + RECURRING_GAP_MS:
            raise ScheduleLogError("recurring batches less than 300 seconds apart")
        self._last_batch_ms = accepted_ms

    def state(self) -> FoldState:
        """What was replayed so far, frozen."""
        return FoldState(
            active=tuple(self._active.values()),
            created=frozenset(self._created),
            last_batch_ms=self._last_batch_ms,
        )


def apply_update(record: Schedule, change: UpdateChange) -> Schedule:
    """``record`` after ``change`` (docs/decisions.md#lifecycle-editing-pausing-and-ending-
    reminders): ScheduleLogError when a field it carries changes nothing, an end condition
    lands on a one-shot, ``count`` is not above the deliveries made, ``until`` is before the
    target, or a resume moves the target anywhere but to a later occurrence."""
    updated = record
    if change.prompt is not None:
        if change.prompt == record.prompt:
            raise ScheduleLogError("update leaves the prompt unchanged")
        updated = msgspec.structs.replace(updated, prompt=change.prompt)
    if change.kind is not None:
        updated = _retimed(updated, change)
        if updated.kind == record.kind and updated.scheduledAt == record.scheduledAt and (
            _timing(updated) == _timing(record)
        ):
            raise ScheduleLogError("update leaves the timing unchanged")
    if change.paused is not None:
        if change.paused == record.paused:
            raise ScheduleLogError("update leaves paused unchanged")
        updated = msgspec.structs.replace(updated, paused=change.paused)
    if change.kind is None and change.scheduledAt is not None:
        updated = _resumed(updated, record, change.scheduledAt)
    if change.until is not None or change.count is not None:
        if not isinstance(updated, RECURRING_TYPES):
            raise ScheduleLogError("update puts an end condition on a one-shot")
        updated = _ended(updated, change)
    if isinstance(updated, RECURRING_TYPES) and updated.until is not None:
        check_until(updated.until, updated.scheduledAt)
    return updated


def _timing(record: Schedule) -> tuple[object, ...]:
    if isinstance(record, AfterSchedule):
        return (record.afterSeconds,)
    if isinstance(record, EverySchedule):
        return (record.everySeconds,)
    if isinstance(record, CronSchedule):
        return (record.cron, record.timeZone)
    return ()


def _retimed(record: Schedule, change: UpdateChange) -> Schedule:
    """``record`` with the timing ``change`` carries: the id, prompt and pause kept; the
    end conditions and the count of deliveries kept only from recurring to recurring."""
    # decode_change guarantees each kind's fields; the checks only narrow their types.
    at = change.scheduledAt
    if at is None:
        raise ScheduleLogError("update timing lacks scheduledAt")
    if change.kind == "after" and change.afterSeconds is not None:
        return AfterSchedule(id=record.id, prompt=record.prompt, afterSeconds=change.afterSeconds,
                             scheduledAt=at, paused=record.paused)
    if change.kind == "at":
        return AtSchedule(id=record.id, prompt=record.prompt, scheduledAt=at, paused=record.paused)
    until = record.until if isinstance(record, RECURRING_TYPES) else None
    count = record.count if isinstance(record, RECURRING_TYPES) else None
    delivered = record.deliveredCount if isinstance(record, RECURRING_TYPES) else 0
    if change.kind == "every" and change.everySeconds is not None:
        return EverySchedule(id=record.id, prompt=record.prompt, everySeconds=change.everySeconds,
                             scheduledAt=at, until=until, count=count, paused=record.paused,
                             deliveredCount=delivered)
    if change.kind != "cron" or change.cron is None or change.timeZone is None:
        raise ScheduleLogError("update timing lacks its fields")
    return CronSchedule(id=record.id, prompt=record.prompt, cron=change.cron,
                        timeZone=change.timeZone, scheduledAt=at, until=until, count=count,
                        paused=record.paused, deliveredCount=delivered)


def _resumed(updated: Schedule, record: Schedule, scheduled_at: str) -> Schedule:
    """A resume that moves a recurring record's target: only from a paused record, only
    to a later occurrence of the same timing."""
    if not isinstance(updated, RECURRING_TYPES) or not record.paused:
        raise ScheduleLogError("update moves the target of a record it does not resume")
    target = parse_instant(record.scheduledAt)
    moved = parse_instant(scheduled_at)
    if moved <= target:
        raise ScheduleLogError("a resume moves the target back or nowhere")
    if isinstance(updated, EverySchedule):
        aligned = (moved - target) % (updated.everySeconds * 1000) == 0
    else:
        zone = load_zone(updated.timeZone)
        aligned = next_after(parse_rule(updated.cron), zone, moved - 1) == moved
    if not aligned:
        raise ScheduleLogError("a resume moves the target off its occurrences")
    return msgspec.structs.replace(updated, scheduledAt=scheduled_at)


def _ended(record: RecurringSchedule, change: UpdateChange) -> RecurringSchedule:
    if change.until is not None:
        if change.until == record.until:
            raise ScheduleLogError("update leaves until unchanged")
        record = msgspec.structs.replace(record, until=change.until)
    if change.count is not None:
        if change.count == record.count:
            raise ScheduleLogError("update leaves count unchanged")
        if change.count <= record.deliveredCount:
            raise ScheduleLogError("update sets count at or below the deliveries made")
        record = msgspec.structs.replace(record, count=change.count)
    return record
