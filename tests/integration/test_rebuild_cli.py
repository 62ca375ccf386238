"""What ``dsh-schedule rebuild`` tells an operator (docs/decisions.md#delivery, "What
rebuild is for"): right after Redis lost its keys no lease is back yet, so it wakes nothing
and says that the hosts, finding the generation marker gone, restore everything; with
leases it wakes them."""

from __future__ import annotations

import json
import time

import pytest
import redis

import tests.conftest
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from tests.integration.test_cli import cli

pytestmark = pytest.mark.redis

PREFIX = "rebuild-cli:"


def _env() -> dict[str, str]:
    return {"DSH_SCHEDULE_REDIS_URL": tests.conftest.REAL_REDIS_URL,
            "DSH_SCHEDULE_PREFIX": PREFIX, "DSH_SCHEDULE_QUEUE": "rebuild-cli"}


def test_rebuild_after_a_flush_says_the_hosts_renewals_restore_everything(
    real_redis: redis.Redis,
) -> None:
    result = cli("rebuild", env=_env())
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"woken": [], "retired": []}
    note = result.stderr.strip()
    assert note.startswith("rebuild: no agent holds a lease"), result.stderr
    assert "generation marker gone within 1 s" in note
    assert "What rebuild is for" in note


def test_rebuild_with_leases_wakes_them_and_adds_no_note(real_redis: redis.Redis) -> None:
    settings = Settings(redis_url=tests.conftest.REAL_REDIS_URL, prefix=PREFIX,
                        queue="rebuild-cli")
    coord = Coordination(real_redis, settings)
    coord.leases.grant("a1", "rebuild-cli", now_ms=time.time_ns() // 1_000_000, ttl_s=60)
    result = cli("rebuild", env=_env())
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"woken": ["a1"], "retired": []}
    assert "no agent holds a lease" not in result.stderr


def test_rebuild_help_says_when_it_is_needed() -> None:
    text = " ".join(cli("rebuild", "--help").stdout.split())
    assert "After Redis lost its keys" in text
    assert "generation marker" in text
    assert "kept the leases but lost wakes" in text
