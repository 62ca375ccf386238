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
        coordination.wakes.arm("agent-1", wall_clock_ms() + 300, slow.queue)

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
