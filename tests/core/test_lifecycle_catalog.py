"""The catalog with the lifecycle on describes what the tools answer with it
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders): views with an end
condition or paused, the update's not-found answer and every error value (``limit_exceeded``
and a persistence error of an update among them) are valid against its output schemas."""

from __future__ import annotations

import pytest

from dsh_schedule.shared.core.catalog import catalog_json
from dsh_schedule.shared.core.errors import ERROR_CODES, ToolError
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.views import list_value, update_not_found_value
from tests.core.test_catalog import _valid
from tests.core.test_lifecycle_records import T, dispatch, every, log, ms, plus, update

CRON = {"version": 2, "operation": "create", "schedule": {
    "id": "schedule-3", "kind": "cron", "prompt": "stand-up", "cron": "0 9 * * *",
    "timeZone": "Europe/Berlin", "scheduledAt": "2026-12-02T08:00:00.000Z", "count": 2}}


def _views(calendar: bool) -> list[dict[str, object]]:
    """The list at T + 1 min of: an every with both ends, delivered once; a paused every;
    and, with calendar rules, a cron with a count."""
    events = [every("schedule-1", until=plus(T, 3600), count=3), dispatch("schedule-1", T),
              every("schedule-2"), update("schedule-2", paused=True)]
    if calendar:
        events.append(CRON)
    return list_value(fold(log(*events)), ms(T) + 60_000)


@pytest.mark.parametrize("calendar", [False, True])
def test_lifecycle_views_match_the_output_schemas_with_the_lifecycle_on(calendar: bool) -> None:
    views = _views(calendar)
    assert [v["state"] for v in views][:2] == ["scheduled", "paused"]
    assert {"until", "count", "deliveredCount"} <= views[0].keys()
    tools = {t["name"]: t for t in catalog_json(calendar, True)}
    for name in ("schedule_create", "schedule_update"):
        schema = tools[name]["outputSchema"]
        assert all(_valid(v, schema, schema) for v in views), name
    listing = tools["schedule_list"]["outputSchema"]
    assert _valid(views, listing, listing)
    update_schema = tools["schedule_update"]["outputSchema"]
    assert _valid(update_not_found_value("schedule-9"), update_schema, update_schema)
    # and without the lifecycle, a view carrying its fields is not a valid answer
    off = catalog_json(calendar, False)[0]["outputSchema"]
    assert not _valid(views[0], off, off)


@pytest.mark.parametrize("code", ERROR_CODES)
def test_every_error_value_matches_every_tool_with_the_lifecycle_on(code: str) -> None:
    extra: dict[str, object] = {}
    if code == "persistence_uncertain":
        extra = {"operation": "update", "id": "schedule-1"}
    if code == "timezone_confirmation_required":
        extra = {"sessionTimeZone": "unavailable", "clientTimeZones": []}
    value = ToolError(code, **extra).value()  # type: ignore[arg-type]
    for tool in catalog_json(True, True):
        schema = tool["outputSchema"]
        assert _valid(value, schema, schema), tool["name"]
