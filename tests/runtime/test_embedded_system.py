"""The one in-process assembly (docs/architecture.md#processes-and-cli): the scheduler's own
pass on an injected clock, and a worker that leaves the program's signals alone."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def system(redis_client: redis.Redis, settings: Settings, clock: FakeClock) -> EmbeddedSystem:
    return EmbeddedSystem(MemoryStore(), settings, clock=clock, sleep=clock.advance,
                          client=redis_client, injected_clock=True)


@pytest.fixture
def own_handler() -> Iterator[object]:
    def handler(signum: int, frame: FrameType | None) -> None:
        pass

    before = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, before)


def _open_with_reminder(system: EmbeddedSystem, after_seconds: int) -> None:
    new_session(system.store, "s1")
    agent = system.host.open_root("s1")
    system.worker_pass()  # the new lease's wake finds nothing due
    _definition, create = agent.tools["schedule_create"]
    result = create({"prompt": "Stretch", "after_seconds": after_seconds})
    assert not result.is_error, result.content


def test_the_scheduler_pass_moves_a_wake_when_the_injected_clock_reaches_it(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    # given a reminder due in 60 s of the injected clock, and the first pass (a rebuild) run
    _open_with_reminder(system, 60)
    system.scheduler_pass()
    system.worker_pass()
    # when the scheduler's pass runs before and after the injected clock reaches it
    clock.advance(30)
    system.scheduler_pass()
    early = system.queue.count
    clock.advance(31)
    system.scheduler_pass()
    # then the wake is on the queue only after
    assert (early, system.queue.count) == (0, 1)


def test_stepping_in_the_main_thread_leaves_the_programs_signal_handlers(
    system: EmbeddedSystem, clock: FakeClock, own_handler: object
) -> None:
    # given a wake on the queue
    _open_with_reminder(system, 1)
    clock.advance(2)
    system.move_due()
    assert system.queue.count == 1
    # when a step runs it in this (the main) thread
    deliveries = system.step()
    # then it was delivered, and SIGTERM is still the program's
    assert [d.pairs[0].scheduleId for _, d in deliveries] != []
    assert signal.getsignal(signal.SIGTERM) is own_handler
