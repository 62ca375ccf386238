"""The complete example of docs/host-integration.md runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import REAL_REDIS_URL

DOC = Path(__file__).resolve().parents[2] / "docs" / "host-integration.md"


@pytest.mark.redis
@pytest.mark.slow
def test_host_integration_example_runs(tmp_path: Path, real_redis: redis.Redis) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the guide holds exactly one complete Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0], encoding="utf-8")
    env = dict(os.environ, DSH_SCHEDULE_REDIS_URL=REAL_REDIS_URL)
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tools: ['schedule_create', 'schedule_list', 'schedule_delete']" in result.stdout
    assert '"kind":"after","prompt":"drink water"' in result.stdout
    assert 'reminder_prompt_json: "drink water"' in result.stdout
