"""``honcho start -f deploy/Procfile`` against a real Redis delivers a reminder that
``dsh-schedule call`` created into the session log through ``dsh-schedule host``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import REAL_REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _delivered(log: Path) -> list[dict[str, object]]:
    found = []
    for line in log.read_text(encoding="utf-8").splitlines()[1:]:
        event = json.loads(line)
        source = event["data"].get("source", {}) if isinstance(event["data"], dict) else {}
        if event["type"] == "user/message" and source.get("plugin") == "tool-schedule":
            found.append(event)
    return found


@pytest.mark.redis
@pytest.mark.slow
def test_procfile_runs_worker_scheduler_and_host(tmp_path: Path, real_redis: redis.Redis) -> None:
    sessions = tmp_path / "sessions"
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        DSH_SCHEDULE_REDIS_URL=REAL_REDIS_URL,
        DSH_SCHEDULE_SESSIONS=str(sessions),
        DSH_SCHEDULE_PREFIX="honcho-test:",
        DSH_SCHEDULE_QUEUE="honcho-test",
        DSH_SCHEDULE_HOST_SESSIONS="deploy-s1",
    )
    cli = [sys.executable, "-m", "dsh_schedule"]
    subprocess.run([*cli, "session", "create", "deploy-s1"], env=env, check=True)
    honcho = subprocess.Popen(
        [str(BIN / "honcho"), "start", "-f", str(ROOT / "deploy" / "Procfile"),
         "-d", str(ROOT)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not real_redis.zscore("honcho-test:live", "deploy-s1"):
            assert time.monotonic() < deadline, "the host never took its lease"
            time.sleep(0.1)
        created = subprocess.run(
            [*cli, "call", "deploy-s1", "schedule_create",
             '{"prompt":"deployed","after_seconds":2}'],
            env=env, capture_output=True, text=True, check=True,
        )
        assert json.loads(created.stdout)["id"] == "schedule-1"
        log = next(sessions.glob("*.jsonl"))
        deadline = time.monotonic() + 30
        while not _delivered(log):
            assert time.monotonic() < deadline, "the reminder was not delivered"
            time.sleep(0.2)
        time.sleep(1.0)
        delivered = _delivered(log)
        assert len(delivered) == 1
        assert 'reminder_prompt_json: "deployed"' in delivered[0]["data"]["content"][0]["text"]
    finally:
        os.killpg(honcho.pid, signal.SIGTERM)
        try:
            honcho.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
            honcho.wait()
        assert honcho.stdout is not None
        honcho.stdout.close()
