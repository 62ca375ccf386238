"""The times a delivery records (docs/architecture.md#one-clock): every process reads
Redis's clock, each up to a round trip behind it, so the worker that wrote a dispatch may
have read a few milliseconds more than the host that delivers it. The delivery is never
stamped before the events it follows, and is lifted by no more than the clocks' known
disagreement."""

from __future__ import annotations

from dsh_schedule.host.gate import delivery_events
from dsh_schedule.shared.coordination.clock import LIVE_SLACK_MS
from dsh_schedule.shared.coordination.followups import FollowupEntry, Pair
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.records import (
    AtSchedule,
    CreateChange,
    DispatchChange,
    encode_change,
)
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.transaction import Read
from tests.support import T0, new_session

TARGET = T0 + 60_000


def _dispatched_at(dispatch_ms: int) -> Read:
    """A log whose last event is the dispatch of schedule-1, stamped ``dispatch_ms``."""
    store = MemoryStore()
    session = new_session(store)
    store.append(session, [
        NewEvent(type=SCHEDULE_CHANGE, time=T0, data=encode_change(CreateChange(
            schedule=AtSchedule(id="schedule-1", prompt="stretch",
                                scheduledAt=format_instant(TARGET))))),
        NewEvent(type=SCHEDULE_CHANGE, time=dispatch_ms,
                 data=encode_change(DispatchChange(id="schedule-1"))),
    ], 0)
    return Read(*store.load(session))


ENTRY = FollowupEntry(entry_id="1-0", text="stretch", pairs=(
    Pair(scheduleId="schedule-1", occurrenceAt=format_instant(TARGET)),))


def test_a_delivery_is_never_stamped_before_the_dispatch_it_delivers() -> None:
    # given a dispatch stamped by a clock 4 ms ahead of the delivering host's
    read = _dispatched_at(TARGET + 10)
    # when the host delivers it, then its events carry the dispatch's time
    events = delivery_events(ENTRY, read, TARGET + 6)
    assert [e.time for e in events] == [TARGET + 10, TARGET + 10]
    # and a host whose clock reads later stamps its own time
    assert [e.time for e in delivery_events(ENTRY, read, TARGET + 50)] == [TARGET + 50] * 2


def test_a_log_time_far_ahead_lifts_a_delivery_by_the_clocks_disagreement_at_most() -> None:
    # given a dispatch stamped an hour ahead (a log written before the shared clock)
    read = _dispatched_at(TARGET + 3_600_000)
    # then the delivery is stamped at most LIVE_SLACK_MS past this host's reading
    events = delivery_events(ENTRY, read, TARGET + 6)
    assert [e.time for e in events] == [TARGET + 6 + LIVE_SLACK_MS] * 2
