"""An idle scheduler sleeps until its next known due time, and arming a wake wakes it
(docs/architecture.md#wake-projection)."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest
import redis
from rq import Queue

from dsh_schedule.scheduler.process import SchedulerLoop
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.wake import ArmRequest
from dsh_schedule.shared.settings import Settings

pytestmark = pytest.mark.redis


def test_a_wake_armed_while_the_scheduler_sleeps_is_moved_before_the_interval_ends(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # given a scheduler whose mover interval is far longer than the test waits
    slow = msgspec.structs.replace(settings, mover_interval_s=30.0, reconcile_interval_s=600.0)
    coordination = Coordination(real_redis, slow)
    loop = SchedulerLoop(coordination, slow)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)  # the first pass has run; the loop now blocks for the interval

        # when a wake is armed for 300 ms from now
        coordination.wakes.arm([ArmRequest("agent-1", wall_clock_ms() + 300, slow.queue)])

        # then it is handed on long before the 30 s interval would have ended
        queue = Queue(slow.queue, connection=real_redis)
        deadline = time.monotonic() + 10
        while queue.count == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queue.count == 1
        assert real_redis.llen(coordination.keys.mover_nudge()) == 0  # the nudge was taken
    finally:
        loop.stop.set()
        real_redis.lpush(coordination.keys.mover_nudge(), "1")  # end the blocking wait now
        thread.join(timeout=40)


class _Recording:
    """A Redis client stand-in that notes the calls of the scheduler's wait."""

    def __init__(self, nudge_after_polls: int | None = None) -> None:
        self.calls: list[tuple[str, float | None]] = []
        self._nudge_after = nudge_after_polls

    def blpop(self, keys: list[str], timeout: float) -> None:
        self.calls.append(("blpop", round(timeout, 3)))
        time.sleep(timeout)  # no nudge comes: the whole timeout

    def lpop(self, key: str) -> bytes | None:
        self.calls.append(("lpop", None))
        polls = sum(1 for name, _t in self.calls if name == "lpop")
        return b"1" if self._nudge_after is not None and polls >= self._nudge_after else None


def _loop_with(client: _Recording, settings: Settings, real_redis: redis.Redis) -> SchedulerLoop:
    coordination = Coordination(real_redis, settings)
    coordination.client = client  # type: ignore[assignment]
    return SchedulerLoop(coordination, settings)


def test_a_pause_that_ends_at_a_due_time_stops_blocking_early_and_sleeps_out_the_rest(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # Redis ends a blocking pop's timeout only on its clock tick (up to 100 ms late), so
    # the block must end BLOCK_SLACK_S early and the rest be slept out here.
    from dsh_schedule.scheduler.process import BLOCK_SLACK_S, NUDGE_POLL_S

    client = _Recording()
    loop = _loop_with(client, settings, real_redis)
    started = time.monotonic()
    loop._wait(0.3, exact=True)
    assert time.monotonic() - started >= 0.3  # never a pass before the due time
    assert client.calls[0] == ("blpop", round(0.3 - BLOCK_SLACK_S, 3))
    polls = [c for c in client.calls[1:] if c[0] == "lpop"]
    assert len(polls) == len(client.calls) - 1
    assert 1 <= len(polls) <= round(BLOCK_SLACK_S / NUDGE_POLL_S) + 1


def test_a_short_exact_pause_does_not_block_in_redis_at_all(
    real_redis: redis.Redis, settings: Settings
) -> None:
    client = _Recording(nudge_after_polls=2)  # and a nudge meanwhile ends it at once
    _loop_with(client, settings, real_redis)._wait(0.05, exact=True)
    assert client.calls == [("lpop", None), ("lpop", None)]


def test_a_pause_for_the_interval_is_one_blocking_pop(
    real_redis: redis.Redis, settings: Settings
) -> None:
    client = _Recording()
    _loop_with(client, settings, real_redis)._wait(0.2, exact=False)
    assert client.calls == [("blpop", 0.2)]
