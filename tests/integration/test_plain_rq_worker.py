"""A stock ``rq worker`` on our queue, with the ``DSH_SCHEDULE_*`` settings in its
environment, runs our wake jobs (docs/architecture.md#wake-projection)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from dsh_schedule.host.bridge import HostBridge
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.support import dispatch_records, new_session

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_a_stock_rq_worker_dispatches_a_due_reminder(
    real_redis: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    # given a live agent whose reminder is due, and its wake waiting on our queue
    assert settings.redis_url is not None
    store = JsonlStore(settings.sessions)
    session = new_session(store, "plain-rq")
    coordination = Coordination(real_redis, settings)
    tools = ScheduleTools(store, coordination, settings, wall_clock_ms)
    created = tools.call(session, "schedule_create", {"prompt": "stretch", "after_seconds": 1})
    assert not created.is_error
    HostBridge(store, coordination, settings, clock=wall_clock_ms).install(session)
    time.sleep(1.2)
    coordination.trigger([session])

    # when rq's own worker command serves the queue once
    env = dict(
        os.environ,
        DSH_SCHEDULE_REDIS_URL=settings.redis_url,
        DSH_SCHEDULE_SESSIONS=str(settings.sessions),
        DSH_SCHEDULE_PREFIX=settings.prefix,
        DSH_SCHEDULE_QUEUE=settings.queue,
    )
    rq = Path(sys.executable).parent / "rq"
    done = subprocess.run(
        [str(rq), "worker", "--burst", "--url", settings.redis_url, settings.queue],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90,
    )

    # then the reminder was dispatched and its followup waits for the host
    assert done.returncode == 0, done.stderr
    assert dispatch_records(store, session) == [
        {"version": 1, "operation": "dispatch", "id": "schedule-1"}
    ]
    assert coordination.followups.waiting(session) == 1
