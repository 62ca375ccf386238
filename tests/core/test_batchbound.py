"""Nothing the tools accept makes a delivery message past the log's line bound
(shared/core/batchbound.py): the worst case is measured against the real frame and line
encoders, and a recurring create past it is refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_schedule.shared.core.batchbound import (
    MAX_LINE_BYTES,
    fits_one_batch,
    worst_batch_line_bytes,
)
from dsh_schedule.shared.core.dispatch import plan_dispatch
from dsh_schedule.shared.core.due import DispatchBatch
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import USER_MESSAGE, Event
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.ledger import reminder_source
from dsh_schedule.shared.core.records import EverySchedule
from dsh_schedule.shared.core.requests import build_create, parse_create_args
from dsh_schedule.shared.store import codec
from tests.support import T0

# Every character the frame or the line escapes, and plain ones.
HOSTILE = st.text(alphabet=st.sampled_from(
    [chr(c) for c in range(0x20)] + ['"', "\\", "\x7f", "\x85", "\u2028", "\u2029", "a",
                                     "é", "\U0001f600"]), min_size=1, max_size=40)


def delivery_line(records: list[EverySchedule]) -> bytes:
    """The ``user/message`` line that delivers ``records`` as one batch, as the delivery
    gate writes it."""
    plan = plan_dispatch(DispatchBatch(records=tuple(records), accepted_ms=T0 + 10**9))
    data: dict[str, Any] = {"content": [{"type": "text", "text": plan.text}],
                            "source": reminder_source(plan.pairs)}
    return codec.encode_event(Event(type=USER_MESSAGE, seq=2**53 - 1, time=2**53 - 1,
                                    data=data))


def every(schedule_id: str, prompt: str) -> EverySchedule:
    return EverySchedule(id=schedule_id, prompt=prompt, everySeconds=300,
                         scheduledAt=format_instant(T0))


def test_the_core_bound_is_the_logs() -> None:
    assert codec.MAX_LINE_BYTES == MAX_LINE_BYTES


@given(st.lists(st.tuples(HOSTILE, HOSTILE), min_size=1, max_size=8))
def test_no_batch_line_is_longer_than_its_worst_case(items: list[tuple[str, str]]) -> None:
    records = [every(f"{n}{schedule_id}", prompt) for n, (schedule_id, prompt)
               in enumerate(items)]
    assert len(delivery_line(records)) - 1 <= worst_batch_line_bytes(records)


def test_a_batch_of_control_characters_reaches_its_worst_case() -> None:
    """The measure is tight: control characters cost seven bytes each, as counted."""
    records = [every(f"schedule-{n}", "\x01" * 1000) for n in range(10)]
    actual = len(delivery_line(records)) - 1
    assert 7 * 1000 * 10 < actual <= worst_batch_line_bytes(records)


def state_with(n: int, prompt: str) -> FoldState:
    active = tuple(every(f"schedule-{k + 1}", prompt) for k in range(n))
    return FoldState(active=active, created=frozenset(r.id for r in active),
                     last_batch_ms=None)


@pytest.mark.parametrize("kind", ["every_seconds", "after_seconds"])
def test_a_recurring_create_past_the_bound_is_refused(kind: str) -> None:
    # given a session whose recurring prompts of control characters fill a small bound
    prompt = "\x01" * 1000
    bound = worst_batch_line_bytes([every("schedule-1", prompt)] * 3)
    state = state_with(2, prompt)
    request = parse_create_args({"prompt": prompt, kind: 300})
    # when one more recurring reminder would fit, it is accepted
    assert build_create(request, state, T0, lambda: "UTC", line_bytes=bound)
    state = state_with(3, prompt)
    if kind == "after_seconds":
        # then a one-shot is delivered alone: never refused by the batch bound
        assert build_create(request, state, T0, lambda: "UTC", line_bytes=bound)
        return
    # then one past the bound is refused with invalid_prompt, and a clear message
    with pytest.raises(ToolError) as refused:
        build_create(request, state, T0, lambda: "UTC", line_bytes=bound)
    assert refused.value.code == "invalid_prompt"
    assert "recurring reminders are delivered together" in refused.value.message
    assert not fits_one_batch(state.active, every("schedule-4", prompt), bound)
