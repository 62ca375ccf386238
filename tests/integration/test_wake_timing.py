"""Exact wake timing on an injected clock (docs/architecture.md#wake-projection): the mover
hands a wake on at its millisecond, so the worker has nothing to sleep out; a wake that a
skewed clock makes early is slept out or re-armed, and never dispatches early.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.due import WakeOutcome
from tests.support import FakeClock, new_session, value


class RecordingSleep:
    """The worker's sleep: notes each call and advances the fake clock by it."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sleep(clock: FakeClock) -> RecordingSleep:
    return RecordingSleep(clock)


@pytest.fixture
def system(
    redis_client: redis.Redis, settings: Settings, clock: FakeClock, sleep: RecordingSleep
) -> EmbeddedSystem:
    return EmbeddedSystem(
        MemoryStore(), settings, clock=clock, sleep=sleep, client=redis_client,
        injected_clock=True,
    )


def _open_with_reminder(system: EmbeddedSystem, clock: FakeClock) -> tuple[str, int]:
    """A live session with one reminder due 2.3 s after a whole second; its target."""
    session = new_session(system.store, "s1")
    system.host.open_root(session)
    system.step()  # the new lease's immediate wake finds nothing due
    clock.advance(0.3)
    _definition, handler = system.host.agents[session].tools["schedule_create"]
    result = handler({"prompt": "x", "after_seconds": 2})
    assert not result.is_error, result.content
    created: dict[str, Any] = value(result.content)
    target = clock() + 2_000
    assert created["scheduledAt"].endswith(".300Z")
    return session, target


def test_a_wake_reaches_the_worker_at_its_millisecond_with_nothing_to_sleep_out(
    system: EmbeddedSystem, clock: FakeClock, sleep: RecordingSleep
) -> None:
    # given a reminder due 300 ms into a second
    session, target = _open_with_reminder(system, clock)
    # when the system steps in 100 ms ticks up to a millisecond before the target
    while clock() < target - 100:
        clock.advance(0.1)
        system.step()
    clock.advance(0.099)
    system.step()
    # then nothing was dispatched, and no worker slept waiting for the target
    assert dispatched_at(system.store, session) == []
    assert sleep.calls == []
    assert clock() == target - 1
    # and at the target itself the wake is handed on and dispatches, without any sleep
    clock.advance(0.001)
    system.step()
    assert dispatched_at(system.store, session) == [target]
    assert sleep.calls == []


@pytest.mark.parametrize("early_s", [0.4, 1.9])
def test_a_wake_early_by_a_skewed_clock_sleeps_it_out_and_never_dispatches_early(
    system: EmbeddedSystem, clock: FakeClock, sleep: RecordingSleep, early_s: float
) -> None:
    # given a reminder, and a wake for it arriving while this worker's clock is behind
    session, target = _open_with_reminder(system, clock)
    clock.now_ms = target - int(early_s * 1000)
    # when the worker runs the wake
    assert system.owner.wake([(session, target)])[session] is WakeOutcome.SETTLED
    # then it slept out the difference first and dispatched at the target, not before
    assert sleep.calls == [early_s]
    assert dispatched_at(system.store, session) == [target]


def test_a_wake_early_by_more_than_the_allowance_re_arms_its_target(
    system: EmbeddedSystem, clock: FakeClock, sleep: RecordingSleep, settings: Settings
) -> None:
    # given a reminder, and a wake for it arriving further ahead than early_sleep_s
    session, target = _open_with_reminder(system, clock)
    clock.now_ms = target - int(settings.early_sleep_s * 1000) - 1
    # when the worker runs the wake
    assert system.owner.wake([(session, target)])[session] is WakeOutcome.SETTLED
    # then it neither slept nor dispatched, and the target is armed again, exactly
    assert sleep.calls == []
    assert dispatched_at(system.store, session) == []
    wakes = system.coordination.wakes
    current = wakes.projections([session])[0].wake
    assert current is not None
    assert system.client.zscore(wakes.scheduler.scheduled_jobs_key, current) == target / 1000


def dispatched_at(store: SessionStore, session: str) -> list[int]:
    """When each dispatch record was written (its event time)."""
    return [
        e.time for e in store.read(session).events
        if e.type == SCHEDULE_CHANGE and e.data["operation"] == "dispatch"
    ]
