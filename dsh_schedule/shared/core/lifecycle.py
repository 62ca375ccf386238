"""Decisions of the lifecycle (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders):
where a resumed record's target lands, as a pure function of the record and ``now``."""

from __future__ import annotations

from dsh_schedule.shared.core.cron import parse_rule
from dsh_schedule.shared.core.cron_occurrences import next_after
from dsh_schedule.shared.core.instant import MAX_MS, parse_instant
from dsh_schedule.shared.core.records import RECURRING_TYPES, EverySchedule, Schedule
from dsh_schedule.shared.core.timesel import load_zone


def resume_target_ms(record: Schedule, now_ms: int) -> int | None:
    """The target ``record`` resumes at ``now``: its own while still ahead, or for a one-shot
    (overdue at once, delivered once); else a recurring record's first occurrence after
    ``now`` (no backlog: anchor-aligned for ``every``, the rule's next for ``cron``). None
    when no instant up to 9999-12-31T23:59:59.999Z is one."""
    target = parse_instant(record.scheduledAt)
    if target > now_ms or not isinstance(record, RECURRING_TYPES):
        return target
    if isinstance(record, EverySchedule):
        period = record.everySeconds * 1000
        following = target + ((now_ms - target) // period + 1) * period
        return following if following <= MAX_MS else None
    return next_after(parse_rule(record.cron), load_zone(record.timeZone), now_ms)
