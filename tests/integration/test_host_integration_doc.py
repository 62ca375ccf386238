"""The complete example of docs/host-integration.md runs as written."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import REAL_REDIS_URL

DOC = Path(__file__).resolve().parents[2] / "docs" / "host-integration.md"
TIMEOUT_S = 110  # the example waits up to 60 s for its reminder and 30 s for its processes


def run_example(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the example in a session of its own, so that whatever it started (its worker and
    scheduler) goes with it when it overruns, and its output is kept either way."""
    process = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"the example ran over {TIMEOUT_S} s\n{stdout}\n{stderr}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # anything it left running
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 30)
def test_host_integration_example_runs(tmp_path: Path, real_redis: redis.Redis) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the guide holds exactly one complete Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    env = dict(os.environ, DSH_SCHEDULE_REDIS_URL=REAL_REDIS_URL)
    result = run_example(script, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tools: ['schedule_create', 'schedule_list', 'schedule_delete']" in result.stdout
    # a local time without a zone was accepted: the turn confirmed the session's zone
    assert '"kind":"at","prompt":"call the office"' in result.stdout
    assert "timezone_confirmation_required" not in result.stdout
    assert '"kind":"after","prompt":"drink water"' in result.stdout
    assert 'reminder_prompt_json: "drink water"' in result.stdout
