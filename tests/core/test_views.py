"""Tool values: views, the list and delete values, rendering and tool results
(docs/architecture.md#management-tools)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import MAX_MS, format_instant, parse_instant
from dsh_schedule.shared.core.records import AfterSchedule, AtSchedule, EverySchedule, Schedule
from dsh_schedule.shared.core.views import (
    ToolResult,
    delete_value,
    error_result,
    list_value,
    ok_result,
    render,
    schedule_view,
)

AFTER = AfterSchedule(
    id="schedule-1", prompt="stretch", afterSeconds=600, scheduledAt="2026-12-01T09:10:00.000Z"
)
AT = AtSchedule(id="schedule-2", prompt="call back", scheduledAt="2026-12-01T16:00:00.000Z")
EVERY = EverySchedule(
    id="schedule-3", prompt="check CI", everySeconds=3600, scheduledAt="2026-12-01T10:00:00.000Z"
)
LATE = EverySchedule(
    id="schedule-4", prompt="p", everySeconds=300, scheduledAt="9999-12-31T23:58:00.000Z"
)
BEFORE_ALL = parse_instant("2026-12-01T09:00:00.000Z")


def _state(*records: Schedule, last_batch: str | None = None) -> FoldState:
    return FoldState(
        active=records,
        created=frozenset(r.id for r in records),
        last_batch_ms=None if last_batch is None else parse_instant(last_batch),
    )


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(
            AFTER,
            [
                ("id", "schedule-1"),
                ("kind", "after"),
                ("prompt", "stretch"),
                ("afterSeconds", 600),
                ("scheduledAt", "2026-12-01T09:10:00.000Z"),
                ("state", "scheduled"),
                ("deliveryMode", "session-local"),
            ],
            id="an after view carries afterSeconds between prompt and scheduledAt",
        ),
        pytest.param(
            AT,
            [
                ("id", "schedule-2"),
                ("kind", "at"),
                ("prompt", "call back"),
                ("scheduledAt", "2026-12-01T16:00:00.000Z"),
                ("state", "scheduled"),
                ("deliveryMode", "session-local"),
            ],
            id="an at view carries no seconds field",
        ),
        pytest.param(
            EVERY,
            [
                ("id", "schedule-3"),
                ("kind", "every"),
                ("prompt", "check CI"),
                ("everySeconds", 3600),
                ("scheduledAt", "2026-12-01T10:00:00.000Z"),
                ("state", "scheduled"),
                ("deliveryMode", "session-local"),
            ],
            id="an every view carries everySeconds between prompt and scheduledAt",
        ),
    ],
)
def test_view_keys_come_in_the_documented_order(
    record: Schedule, expected: list[tuple[str, Any]]
) -> None:
    # given an active record before its target
    state = _state(record)
    # when it is viewed
    view = schedule_view(record, state, BEFORE_ALL)
    # then its keys and values are exactly the documented ones, in order
    assert list(view.items()) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        pytest.param("2026-12-01T16:00:00.000Z", "overdue", id="overdue exactly at the target"),
        pytest.param("2026-12-01T16:00:00.001Z", "overdue", id="overdue after the target"),
        pytest.param("2026-12-01T15:59:59.999Z", "scheduled", id="scheduled before the target"),
    ],
)
def test_state_is_overdue_once_now_reaches_the_target(now: str, expected: str) -> None:
    view = schedule_view(AT, _state(AT), parse_instant(now))
    assert view["state"] == expected


@pytest.mark.parametrize(
    ("record", "last_batch", "now", "not_before"),
    [
        pytest.param(
            EVERY,
            "2026-12-01T09:58:00.000Z",
            "2026-12-01T10:00:00.000Z",
            "2026-12-01T10:03:00.000Z",
            id="an overdue every record inside the gate shows last batch + 300 s",
        ),
        pytest.param(
            EVERY,
            "2026-12-01T09:55:00.000Z",
            "2026-12-01T10:00:00.000Z",
            None,
            id="the gate is open exactly 300 s after the last batch",
        ),
        pytest.param(
            EVERY, None, "2026-12-01T10:00:00.000Z", None, id="no batch yet means no gate"
        ),
        pytest.param(
            EVERY,
            "2026-12-01T09:58:00.000Z",
            "2026-12-01T09:59:00.000Z",
            None,
            id="a scheduled every record is not held back",
        ),
        pytest.param(
            AFTER,
            "2026-12-01T09:58:00.000Z",
            "2026-12-01T10:00:00.000Z",
            None,
            id="one-shots bypass the recurring gate",
        ),
        pytest.param(
            LATE,
            "9999-12-31T23:54:59.999Z",
            "9999-12-31T23:59:00.000Z",
            "9999-12-31T23:59:59.999Z",
            id="a gate opening at the last representable instant is shown",
        ),
        pytest.param(
            LATE,
            "9999-12-31T23:57:00.000Z",
            "9999-12-31T23:59:00.000Z",
            None,
            id="a gate that would open after year 9999 is omitted, not clamped",
        ),
    ],
)
def test_delivery_not_before_only_for_gated_overdue_every_records(
    record: Schedule, last_batch: str | None, now: str, not_before: str | None
) -> None:
    # given a record and the session's last recurring batch
    state = _state(record, last_batch=last_batch)
    # when it is viewed at now
    view = schedule_view(record, state, parse_instant(now))
    # then deliveryNotBefore is present, last and equal to the gate, exactly when gated
    if not_before is None:
        assert "deliveryNotBefore" not in view
    else:
        assert list(view)[-1] == "deliveryNotBefore"
        assert view["deliveryNotBefore"] == not_before
        assert view["state"] == "overdue"


def test_list_value_views_every_active_record_in_create_order() -> None:
    state = _state(EVERY, AFTER, AT)
    assert [v["id"] for v in list_value(state, BEFORE_ALL)] == [
        "schedule-3",
        "schedule-1",
        "schedule-2",
    ]
    assert list_value(FoldState(), BEFORE_ALL) == []


@pytest.mark.parametrize(
    ("deleted", "expected"),
    [
        pytest.param(True, '{"id":"schedule-1","deleted":true}', id="an actual delete"),
        pytest.param(
            False,
            '{"id":"schedule-1","deleted":false,"code":"schedule_not_found"}',
            id="an unknown or ended id",
        ),
    ],
)
def test_delete_value_renders_exactly(deleted: bool, expected: str) -> None:
    assert render(delete_value("schedule-1", deleted)) == expected


def test_render_is_compact_keeps_order_and_non_ascii() -> None:
    view = schedule_view(
        AtSchedule(id="schedule-9", prompt='té \u2603 "q"', scheduledAt=AT.scheduledAt),
        FoldState(),
        BEFORE_ALL,
    )
    assert render(view) == (
        '{"id":"schedule-9","kind":"at","prompt":"té \u2603 \\"q\\"",'
        '"scheduledAt":"2026-12-01T16:00:00.000Z","state":"scheduled",'
        '"deliveryMode":"session-local"}'
    )


def test_render_refuses_values_that_are_not_json() -> None:
    with pytest.raises(ValueError):
        render({"x": float("nan")})


def test_a_not_found_delete_is_an_ok_result() -> None:
    value = delete_value("schedule-7", False)
    assert ok_result(value) == ToolResult(content=render(value), is_error=False, value=value)


def test_error_result_carries_the_error_value_in_order() -> None:
    # given a persistence failure with its extras
    err = ToolError("persistence_uncertain", operation="create", id="schedule-4")
    # when it becomes a tool result
    result = error_result(err)
    # then it is an error whose content is the rendered canonical value
    assert result.is_error
    assert list(result.value) == ["code", "message", "operation", "id"]
    assert result.content == render(err.value())
    assert json.loads(result.content)["code"] == "persistence_uncertain"


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), min_size=1)
_INSTANT = st.integers(min_value=0, max_value=MAX_MS).map(format_instant)


@st.composite
def _records(draw: st.DrawFn) -> Schedule:
    kind = draw(st.sampled_from(["after", "at", "every"]))
    common: dict[str, Any] = {
        "id": draw(_TEXT),
        "prompt": draw(_TEXT),
        "scheduledAt": draw(_INSTANT),
    }
    if kind == "after":
        return AfterSchedule(**common, afterSeconds=draw(st.integers(1, 2**53 - 1)))
    if kind == "every":
        return EverySchedule(**common, everySeconds=draw(st.integers(300, 2**53 // 1000)))
    return AtSchedule(**common)


@given(record=_records(), now=st.integers(min_value=0, max_value=MAX_MS))
def test_rendered_views_decode_back_to_the_view(record: Schedule, now: int) -> None:
    view = schedule_view(record, _state(record), now)
    assert json.loads(render(view)) == view
    assert list(json.loads(render(view))) == list(view)
