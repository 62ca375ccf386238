"""``dsh-schedule web`` as a process: embedded by default, a host of a real deployment
with ``--redis`` (worker and scheduler processes beside it, on the suite's real Redis)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.conftest import real_redis_client, real_redis_url
from tests.support import Processes, process_env, reminder_texts, wait_until
from tests.web.test_http import call

URL_LINE = re.compile(r"dsh-schedule web: (http://\S+) ")


class WebProcess:
    def __init__(self, proc: subprocess.Popen[str], url: str, banner: str) -> None:
        self.proc = proc
        self.url = url
        self.banner = banner  # the line it starts with

    def at(self, path: str) -> str:
        return self.url.rstrip("/") + path


def start_web(args: list[str], env: dict[str, str], log: Path) -> WebProcess:
    with log.open("w") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsh_schedule", "web", "--port", "0", *args],
            env=env, stdout=subprocess.PIPE, stderr=errors, text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = URL_LINE.match(line)
    assert match, f"no URL line: {line!r}\n{log.read_text()}"
    return WebProcess(proc, match[1], line)


def stop(web: WebProcess) -> int:
    web.proc.send_signal(signal.SIGTERM)
    try:
        return web.proc.wait(20)
    finally:
        end(web)


def end(web: WebProcess) -> None:
    if web.proc.poll() is None:
        web.proc.kill()
        web.proc.wait()
    if web.proc.stdout is not None:
        web.proc.stdout.close()


@pytest.fixture
def web(tmp_path: Path, embedded_env: dict[str, str]) -> Iterator[WebProcess]:
    process = start_web(["--sessions", str(tmp_path / "sessions")], embedded_env,
                        tmp_path / "web.log")
    try:
        yield process
    finally:
        end(process)


def test_the_command_serves_the_console_and_stops_on_sigterm_with_a_stream_open(
        web: WebProcess, tmp_path: Path) -> None:
    status, _, body = call(web.url)
    assert status == 200 and "New session" in body
    status, _, _ = call(web.at("/sessions"), {"id": "s", "timeZone": "Europe/Berlin"})
    assert status == 303
    status, _, _ = call(web.at("/prompt/s"), {"text": "remind me in 1 second to stretch",
                                              "clientTimeZone": "Europe/Berlin"})
    assert status == 303
    store = JsonlStore(tmp_path / "sessions")
    assert wait_until(lambda: reminder_texts(store, "s") != [], 20)

    stream = urllib.request.urlopen(web.at("/stream/session/s"), timeout=30)
    try:
        assert stream.readline().startswith(b"retry:")
        started = time.monotonic()
        assert stop(web) == 0
        assert time.monotonic() - started < 10  # the open stream did not hold it up
    finally:
        stream.close()


def test_without_a_sessions_directory_the_embedded_console_uses_a_scratch_one(
        tmp_path: Path, embedded_env: dict[str, str]) -> None:
    process = start_web([], embedded_env, tmp_path / "web.log")
    try:
        assert "embedded Redis" in process.banner
        scratch = Path(process.banner.rsplit("sessions in ", 1)[1].rstrip(")\n"))
        assert scratch.parent.name.startswith("dsh-web-")
        status, _, _ = call(process.at("/sessions"), {"id": "s", "timeZone": "UTC"})
        assert status == 303
        assert (scratch / "s.jsonl").exists()
    finally:
        assert stop(process) == 0
    assert not scratch.parent.exists()  # removed with the console


def test_a_port_in_use_is_one_line_and_exit_2(web: WebProcess,
                                              embedded_env: dict[str, str]) -> None:
    port = web.url.rstrip("/").rsplit(":", 1)[1]
    result = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "web", "--port", port],
        env=embedded_env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("dsh-schedule: web: cannot listen on 127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.redis
@pytest.mark.slow
def test_with_a_redis_url_the_console_is_a_host_of_the_deployment(tmp_path: Path) -> None:
    client = real_redis_client()
    client.flushdb()
    sessions = tmp_path / "sessions"
    env = process_env(real_redis_url(), sessions, PREFIX="webreal:", QUEUE="webreal",
                      LEASE_RENEW="1", MOVER_INTERVAL="0.05")
    processes = Processes(tmp_path, env)
    web = start_web([], env, tmp_path / "web.log")
    try:
        processes.spawn("worker", "worker")
        processes.spawn("scheduler", "scheduler")
        status, _, _ = call(web.at("/sessions"), {"id": "real", "timeZone": "Asia/Shanghai"})
        assert status == 303
        assert client.hget("webreal:agent-host", "real") is not None  # the console serves it
        status, _, _ = call(web.at("/prompt/real"), {"text": "remind me in 2 seconds to stretch",
                                                     "clientTimeZone": "Asia/Shanghai"})
        assert status == 303
        store = JsonlStore(sessions)
        delivered = wait_until(lambda: reminder_texts(store, "real") != [], 30)
        assert delivered, processes.describe() + (tmp_path / "web.log").read_text()
        assert 'reminder_prompt_json: "stretch"' in reminder_texts(store, "real")[0]
        status, _, page = call(web.at("/operations"))
        assert status == 200 and "health: ok" in page
    finally:
        code = stop(web)
        processes.close()
        client.flushdb()
        client.close()
    assert code == 0


def test_without_the_web_extra_the_command_says_what_is_missing(
        tmp_path: Path, embedded_env: dict[str, str]) -> None:
    probe = ("import sys\n"
             "sys.modules['fastapi'] = None  # as if the web extra were not installed\n"
             "from dsh_schedule.cli import main\n"
             "sys.exit(main(['web', '--port', '0', '--sessions', sys.argv[1]]))\n")
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "sessions")],
                            env=embedded_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ("dsh-schedule: web: needs the web extra (fastapi is missing): "
                             "pip install '.[web]' from a checkout (README.md#install)\n")
