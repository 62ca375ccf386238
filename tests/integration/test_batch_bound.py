"""310 recurring reminders of 32 KiB control-character prompts would be one delivery line
past the log's bound: the tools refuse the create that would pass it, so every batch they
accepted can be delivered (shared/core/batchbound.py)."""

from __future__ import annotations

import msgspec

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.batchbound import MAX_LINE_BYTES, worst_batch_line_bytes
from dsh_schedule.shared.settings import MAX_ACTIVE_CEILING, Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session, value


def test_recurring_creates_stop_at_the_delivery_bound(
    coordination: Coordination, settings: Settings
) -> None:
    # given a session, and prompts of 32 KiB of control characters (with the lifecycle
    # on, its cap per session set above the bound, so the bound is what stops the creates)
    settings = msgspec.structs.replace(settings, max_active=MAX_ACTIVE_CEILING)
    store = MemoryStore()
    tools = ScheduleTools(store, coordination, settings, FakeClock())
    session = new_session(store)
    prompt = "\x01" * settings.max_prompt_bytes
    # when 310 recurring reminders are asked for
    answers = [value(tools.call(session, "schedule_create",
                                {"prompt": prompt, "every_seconds": 300}).content)
               for _ in range(310)]
    # then the creates are accepted up to the bound and refused past it, with a clear code
    accepted = [a for a in answers if "code" not in a]
    refused = [a for a in answers if "code" in a]
    assert len(accepted) == 292  # (64 MiB - 4 KiB) / (7 x 32 KiB + an item's overhead)
    assert answers[: len(accepted)] == accepted
    assert {a["code"] for a in refused} == {"invalid_prompt"}
    assert f"at most {MAX_LINE_BYTES} bytes" in refused[0]["message"]
    active = store.load(session)[1].active
    assert len(active) == len(accepted)
    assert worst_batch_line_bytes(active) <= MAX_LINE_BYTES
    # and a one-shot is still accepted (delivered alone)
    one_shot = tools.call(session, "schedule_create", {"prompt": prompt, "after_seconds": 60})
    assert not one_shot.is_error
