"""The replay rules of ``schedule/change`` records, written once
(docs/architecture.md#replay-rules).

``deliver`` is what one dispatch does to the record it names: which occurrence it
delivered and what the record becomes. ``Replay`` applies whole changes to a fold in
progress and adds the session-wide rules (ids created once, only active records change,
recurring batches at least 300 seconds apart). The fold, the ledger of dispatches and the
receipt projection all replay through this module, so they cannot disagree.
"""

from __future__ import annotations

from typing import Final

import msgspec

from dsh_schedule.shared.core.cron import parse_rule
from dsh_schedule.shared.core.cron_occurrences import latest_at_or_before, next_after
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.instant import MAX_MS, format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    RECURRING_TYPES,
    Change,
    CreateChange,
    CronSchedule,
    DeleteChange,
    DispatchChange,
    EverySchedule,
    RecurringSchedule,
    Schedule,
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


def advance_every(record: EverySchedule, accepted_ms: int) -> EverySchedule | None:
    """The record after a dispatch accepted at ``accepted_ms`` (>= scheduledAt): its target
    moves to the first anchor-aligned one after the delivered occurrence; None when that
    target is beyond 9999-12-31T23:59:59.999Z, which ends the record."""
    return _following(record, occurrence_at(record, accepted_ms))


def _following(record: EverySchedule, occurrence_ms: int) -> EverySchedule | None:
    """The record once ``occurrence_ms`` was delivered; None past the last instant."""
    following = occurrence_ms + record.everySeconds * 1000
    if following > MAX_MS:
        return None
    return EverySchedule(
        id=record.id,
        prompt=record.prompt,
        everySeconds=record.everySeconds,
        scheduledAt=format_instant(following),
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
    return CronSchedule(
        id=record.id,
        prompt=record.prompt,
        cron=record.cron,
        timeZone=record.timeZone,
        scheduledAt=format_instant(following),
    )


def _recurring_delivery(record: RecurringSchedule, accepted_ms: int) -> tuple[int, Schedule | None]:
    """The occurrence a recurring dispatch accepted at ``accepted_ms`` delivers, and the
    record after it."""
    if isinstance(record, CronSchedule):
        return cron_occurrence_at(record, accepted_ms), advance_cron(record, accepted_ms)
    occurrence = occurrence_at(record, accepted_ms)
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
        return Delivery(
            record=record,
            occurrence_ms=parse_instant(record.scheduledAt),
            accepted_ms=None,
            following=None,
        )
    if dispatch.acceptedAt is None:
        raise ScheduleLogError("recurring dispatch lacks acceptedAt")
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
