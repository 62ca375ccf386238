"""A Redis that refuses our password: one-shot commands say "authentication failed" and
exit 2 at once; the long-running processes keep retrying and say why at ERROR
(docs/architecture.md#outages). The Redis is a real redis-server of the test's own with
``requirepass`` set."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tests.integration.test_cli import cli, one_line_error
from tests.redis_server import RedisServer
from tests.support import Processes, process_env, wait_until

pytestmark = [pytest.mark.redis]

PASSWORD = "right-horse-battery"
WRONG = "hunter2"


@pytest.fixture
def guarded(redis_server: RedisServer) -> RedisServer:
    redis_server.client().config_set("requirepass", PASSWORD)
    return redis_server


def _url(server: RedisServer, password: str | None) -> str:
    auth = "" if password is None else f":{password}@"
    return f"redis://{auth}127.0.0.1:{server.port}/0"


@pytest.mark.parametrize("password", [WRONG, None], ids=["wrong", "missing"])
@pytest.mark.parametrize("command", [
    ["status"], ["health"], ["rebuild"], ["call", "s", "schedule_list"],
    ["worker", "--redis-wait", "30"], ["scheduler", "--redis-wait", "30"],
    ["host", "s", "--redis-wait", "30"], ["web", "--port", "0", "--redis-wait", "30"],
])
def test_a_one_shot_command_says_authentication_failed_and_exits_2(
    guarded: RedisServer, tmp_path: Path, command: list[str], password: str | None,
) -> None:
    """Not "did not answer within N s" after the whole wait: the refusal is named at once
    (a bounded wait gives up on it), and the password is never printed."""
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path / "sessions"),
           "DSH_SCHEDULE_REDIS_URL": _url(guarded, password)}
    assert cli("session", "create", "s", env=env).returncode == 0
    started = time.monotonic()
    line = one_line_error(cli(*command, env=env))
    assert f"Redis at 127.0.0.1:{guarded.port}/0: authentication failed" in line
    assert WRONG not in line and PASSWORD not in line
    assert time.monotonic() - started < 25  # well before the 30 s wait


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_processes_say_authentication_failed_at_error_and_recover_once_it_is_fixed(
    guarded: RedisServer, tmp_path: Path,
) -> None:
    """Worker, scheduler and host wait for ever by default: each says at ERROR why it
    cannot go on, keeps retrying, and starts serving once Redis takes its password."""
    sessions = tmp_path / "sessions"
    env = process_env(_url(guarded, WRONG), sessions, PREFIX="auth:", QUEUE="auth")
    procs = Processes(tmp_path, env)
    try:
        assert procs.run("session", "create", "s").returncode == 0
        procs.spawn("worker", "worker")
        procs.spawn("scheduler", "scheduler")
        procs.spawn("host", "host", "s")
        names = ("worker", "scheduler", "host")

        def said(name: str, text: str) -> bool:
            return text in procs.log_tail(name, 200)

        refused = "ERROR"
        wait_until(lambda: all(
            said(n, "Redis authentication failed (check the user and password in the "
                 "Redis URL); retrying") and refused in procs.log_tail(n, 200)
            for n in names), timeout=40)
        assert not procs.dead(), procs.describe()
        for name in names:
            assert WRONG not in procs.log_tail(name, 200)
        admin = redis.Redis.from_url(_url(guarded, PASSWORD))
        admin.config_set("requirepass", WRONG)  # the operator fixes Redis
        admin.close()
        wait_until(lambda: procs.run("health").returncode == 0, timeout=40)
        assert not procs.dead(), procs.describe()
    finally:
        procs.close()
