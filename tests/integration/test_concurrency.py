"""Eight processes creating on one session at once (issue 3): every id exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.store.jsonl import JsonlStore, read_session_file
from tests.conftest import REAL_REDIS_URL

CREATOR = """
import json, sys, time
import redis
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.settings import Settings

root, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = Settings.from_env({}, sessions=root, redis_url=url, prefix="conc-test:")
tools = ScheduleTools(JsonlStore(root), Coordination(redis.Redis.from_url(url), settings), settings,
                      lambda: time.time_ns() // 1_000_000)
ids = []
for i in range(n):
    result = tools.call("shared", "schedule_create", {"prompt": f"p{i}", "after_seconds": 3600})
    if result.is_error:
        sys.exit("error: " + result.content)
    ids.append(json.loads(result.content)["id"])
print(json.dumps(ids))
"""


@pytest.mark.redis
@pytest.mark.slow
def test_eight_processes_times_fifty_creates_allocate_every_id_once(
    tmp_path: Path, real_redis: redis.Redis
) -> None:
    store = JsonlStore(tmp_path)
    store.create(SessionHeader(id="shared", createdAt=0))
    procs = [
        subprocess.Popen([sys.executable, "-c", CREATOR, str(tmp_path), REAL_REDIS_URL, "50"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    returned: list[str] = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        returned.extend(json.loads(out))
    expected = [f"schedule-{n}" for n in range(1, 401)]
    assert sorted(returned, key=lambda i: int(i.split("-")[1])) == expected
    session = read_session_file(store.path("shared"))
    state = fold(session.events)
    assert [r.id for r in state.active] == expected
    check = subprocess.run([sys.executable, "-m", "dsh_schedule", "check",
                            str(store.path("shared"))], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
