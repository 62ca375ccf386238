"""The read-only and session CLI commands (docs/architecture.md#processes-and-cli)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tests.conftest
from dsh_schedule import cli as cli_module
from dsh_schedule.shared.core import catalog
from tests import switched

EVENTS = [
    {"version": 1, "operation": "create", "schedule": {
        "id": "schedule-1", "kind": "after", "prompt": "stretch", "afterSeconds": 600,
        "scheduledAt": "2026-12-01T09:10:00.000Z"}},
    {"version": 1, "operation": "create", "schedule": {
        "id": "schedule-2", "kind": "every", "prompt": "check CI", "everySeconds": 300,
        "scheduledAt": "2026-12-01T09:05:00.000Z"}},
    {"version": 1, "operation": "dispatch", "id": "schedule-2",
     "acceptedAt": "2026-12-01T09:07:00.000Z"},
]


def write_log(path: Path, datas: list[dict[str, object]], extra: dict[str, object] | None = None,
              session_id: str = "s") -> Path:
    lines = [{"type": "session", "version": 0, "id": session_id, "createdAt": 0, **(extra or {})}]
    lines += [{"type": "schedule/change", "seq": i, "time": 0, "data": d}
              for i, d in enumerate(datas)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without its settings, then ``env``; a run with the
    lifecycle on (tests/switched.py) keeps its switch unless ``env`` names it."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    if switched.lifecycle_suite():
        full[switched.SWITCH] = "on"
    full.update(env or {})
    return full


def cli(*args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh_schedule", *args], capture_output=True,
                          text=True, env=cli_env(env), cwd=cwd, timeout=60)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a rejected command (exit 2, no traceback)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("dsh-schedule: ")
    return lines[0]


def closed_port() -> int:
    """A port nothing listens on (bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_check_exits_0_on_valid_logs_and_1_naming_each_corrupt_file(tmp_path: Path) -> None:
    good = write_log(tmp_path / "good.jsonl", EVENTS)
    bad = write_log(tmp_path / "bad.jsonl", [
        *EVENTS, {"version": 1, "operation": "delete", "id": "schedule-9"}])
    worse = write_log(tmp_path / "worse.jsonl", [{"version": 2, "operation": "delete", "id": "x"}])
    assert cli("check", str(good)).returncode == 0
    result = cli("check", str(good), str(bad), str(worse))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{good}: ok"
    assert lines[1].startswith(f"{bad}: ") and "inactive" in lines[1]
    assert lines[2].startswith(f"{worse}: ") and "version" in lines[2]


def test_check_says_what_it_ignored_of_a_torn_tail(tmp_path: Path) -> None:
    """A torn final line is no committed event: the log is valid, and check says it
    ignored the line rather than a bare "ok"."""
    log = write_log(tmp_path / "torn.jsonl", EVENTS)
    with log.open("a", encoding="utf-8") as file:
        file.write('{"type": "schedule/change", "seq": 3, "ti')
    result = cli("check", str(log))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (f"{log}: ok (ignored a torn final line of 41 bytes after 3 "
                             "events: a write cut short, never committed)\n")


def test_fold_prints_the_exact_list_value(tmp_path: Path) -> None:
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    result = cli("fold", str(log), "--now", "2026-12-01T09:11:00.000Z")
    assert result.returncode == 0
    assert result.stdout == (
        '[{"id":"schedule-1","kind":"after","prompt":"stretch","afterSeconds":600,'
        '"scheduledAt":"2026-12-01T09:10:00.000Z","state":"overdue",'
        '"deliveryMode":"session-local"},'
        '{"id":"schedule-2","kind":"every","prompt":"check CI","everySeconds":300,'
        '"scheduledAt":"2026-12-01T09:10:00.000Z","state":"overdue",'
        '"deliveryMode":"session-local","deliveryNotBefore":"2026-12-01T09:12:00.000Z"}]\n'
    )


def test_present_prints_the_receipt_or_null(tmp_path: Path) -> None:
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    assert cli("present", str(log), "2").stdout == (
        '{"scheduleId":"schedule-2","prompt":"check CI",'
        '"occurrenceAt":"2026-12-01T09:05:00.000Z","label":"session-local"}\n'
    )
    assert cli("present", str(log), "0").stdout == "null\n"


def test_catalog_exports_the_three_tools() -> None:
    for fmt, name_of in [
        ("catalog", lambda t: t["name"]),
        ("openai", lambda t: t["function"]["name"]),
        ("anthropic", lambda t: t["name"]),
    ]:
        tools = json.loads(cli("catalog", "--format", fmt).stdout)
        assert [name_of(t) for t in tools] == [
            "schedule_create", "schedule_list", "schedule_delete",
            *(["schedule_update"] if switched.lifecycle_suite() else [])]


def test_session_create_fork_and_call_without_redis(tmp_path: Path) -> None:
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path)}
    assert cli("session", "create", "parent", "--time-zone", "Europe/Berlin",
               env=env).returncode == 0
    created = cli("call", "parent", "schedule_create", '{"prompt":"x","after_seconds":60}',
                  env=env)
    assert created.returncode == 0
    assert json.loads(created.stdout)["id"] == "schedule-1"
    assert "no wake is armed" in created.stderr
    assert cli("session", "fork", "parent", "child", env=env).returncode == 0
    listed = cli("call", "child", "schedule_list", env=env)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    error = cli("call", "child", "schedule_create", '{"prompt":"x","every_seconds":60}', env=env)
    assert error.returncode == 3
    assert json.loads(error.stdout)["code"] == "frequency_too_high"


@pytest.mark.parametrize("command", ["worker", "scheduler", "host", "rebuild"])
def test_multi_process_commands_refuse_to_start_without_a_redis_url(command: str) -> None:
    args = [command, "s1"] if command == "host" else [command]
    assert "Redis URL is required" in one_line_error(cli(*args))


def test_bad_settings_are_a_clear_error(tmp_path: Path) -> None:
    result = cli("call", "s", "schedule_list",
                 env={"DSH_SCHEDULE_SESSIONS": str(tmp_path), "DSH_SCHEDULE_LOCK_TTL": "soon"})
    assert result.returncode == 2
    assert "DSH_SCHEDULE" in result.stderr or "lock_ttl_s" in result.stderr
    assert "Traceback" not in result.stderr


def test_rebuild_reports_what_it_woke(real_redis: object) -> None:
    result = cli("rebuild", env={"DSH_SCHEDULE_REDIS_URL": tests.conftest.REAL_REDIS_URL,
                                 "DSH_SCHEDULE_PREFIX": "cli-test:"})
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"woken": [], "retired": []}


def test_session_directory_is_honoured_before_or_after_the_subcommand(tmp_path: Path) -> None:
    before, after = tmp_path / "before", tmp_path / "after"
    assert cli("session", "--sessions", str(before), "create", "a").returncode == 0
    assert cli("session", "create", "b", "--sessions", str(after)).returncode == 0
    assert [p.name for p in before.iterdir()] == ["a.jsonl"]
    assert [p.name for p in after.iterdir()] == ["b.jsonl"]


def test_bad_input_to_the_cli_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    corrupt = write_log(tmp_path / "bad.jsonl", [{"version": 9}])
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path)}
    cases = [
        (cli("fold", str(corrupt)), 1),
        (cli("present", str(corrupt), "0"), 1),
        (cli("session", "create", "z", "--time-zone", "Mars/Olympus", env=env), 2),
        (cli("call", "bad", "schedule_create", "{not json", env=env), 2),
    ]
    for result, code in cases:
        assert result.returncode == code, result.stderr
        assert result.stderr.startswith("dsh-schedule: ")
        assert "Traceback" not in result.stderr


# -- --now, present, call ---------------------------------------------------------------


@pytest.mark.parametrize(("now", "state"), [
    ("2026-12-01T09:09:59.999Z", "scheduled"),
    ("2026-12-01T09:10:00Z", "overdue"),
    ("2026-12-01T09:10:00.000Z", "overdue"),
    ("2026-12-01T11:09:59.9999999+02:00", "scheduled"),  # digits past the ms are dropped
    ("2026-12-01T11:10:00+02:00", "overdue"),
    ("2026-12-01T04:09:59.9-05:00", "scheduled"),
    ("2026-12-01T04:10:00.0-05:00", "overdue"),
    ("2026-12-01t09:09:59z", "scheduled"),
])
def test_fold_takes_any_rfc3339_instant_with_an_offset(tmp_path: Path, now: str,
                                                       state: str) -> None:
    log = write_log(tmp_path / "s.jsonl", EVENTS[:1])  # schedule-1 is due at 09:10:00.000Z
    result = cli("fold", str(log), "--now", now)
    assert result.returncode == 0, result.stderr
    assert [view["state"] for view in json.loads(result.stdout)] == [state]


def test_fold_now_far_in_the_future(tmp_path: Path) -> None:
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    result = cli("fold", str(log), "--now", "2030-01-01T00:00:00Z")
    assert result.returncode == 0, result.stderr
    assert [view["state"] for view in json.loads(result.stdout)] == ["overdue", "overdue"]


@pytest.mark.parametrize(("now", "problem"), [
    ("2030-01-01T00:00:00", "not an RFC 3339 instant with an offset"),
    ("2030-01-01 00:00:00Z", "not an RFC 3339 instant with an offset"),
    ("tomorrow", "not an RFC 3339 instant with an offset"),
    ("2030-02-30T00:00:00Z", "no real date and time"),
    ("2030-01-01T24:00:00Z", "no real date and time"),
    ("2030-01-01T00:00:00+24:00", "offset"),
    ("0001-01-01T00:00:00+01:00", "outside the years 0001-9999"),
])
def test_a_bad_now_is_one_line(tmp_path: Path, now: str, problem: str) -> None:
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    line = one_line_error(cli("fold", str(log), "--now", now))
    assert "--now" in line and problem in line and repr(now) in line


def test_present_prints_null_for_every_event_that_is_no_dispatch(tmp_path: Path) -> None:
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    for seq in ("0", "1"):
        result = cli("present", str(log), seq)
        assert (result.returncode, result.stdout, result.stderr) == (0, "null\n", "")


@pytest.fixture
def session_dir(tmp_path: Path) -> dict[str, str]:
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path / "sessions")}
    assert cli("session", "create", "s", env=env).returncode == 0
    return env


@pytest.mark.parametrize(("args_json", "problem"), [
    ("[" * 2000 + "]" * 2000, "nested too deeply"),
    ('{"prompt": "x", "after_seconds": ' + "9" * 5000 + "}", "too many digits"),
    ('{"prompt": ', "not valid JSON"),
])
def test_unreadable_args_json_is_one_line(session_dir: dict[str, str], args_json: str,
                                          problem: str) -> None:
    line = one_line_error(cli("call", "s", "schedule_create", args_json, env=session_dir))
    assert "ARGS_JSON" in line and problem in line


def test_call_on_a_missing_session_says_so(session_dir: dict[str, str]) -> None:
    line = one_line_error(cli("call", "nobody", "schedule_list", env=session_dir))
    assert "session 'nobody' does not exist" in line
    assert not (Path(session_dir["DSH_SCHEDULE_SESSIONS"]) / "nobody.jsonl").exists()


def test_a_host_for_a_missing_session_says_so_before_it_waits_for_redis(
    session_dir: dict[str, str],
) -> None:
    # Nothing answers on the URL: the sessions are checked first, without Redis.
    env = {**session_dir, "DSH_SCHEDULE_REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}
    line = one_line_error(cli("host", "s", "nobody", "ghost", env=env))
    assert "2 session(s) do not exist" in line and "'nobody', 'ghost'" in line
    assert "'s'" not in line  # the one that exists is not named
    line = one_line_error(cli("host", "x" * 300, env=env))  # too long for a file name
    assert "is not a session id: a session id is" in line


def test_a_host_takes_its_sessions_from_a_file_one_id_a_line(
    session_dir: dict[str, str], tmp_path: Path,
) -> None:
    env = {**session_dir, "DSH_SCHEDULE_REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}
    listed = tmp_path / "sessions.txt"
    listed.write_text("s\nnobody\n\nghost\n", encoding="utf-8")
    line = one_line_error(cli("host", "--sessions-file", str(listed), env=env))
    assert "2 session(s) do not exist" in line and "'nobody', 'ghost'" in line
    assert "name a SESSION, a --sessions-file or --all-sessions" in one_line_error(
        cli("host", env=env))


def test_call_runs_every_catalog_tool(session_dir: dict[str, str]) -> None:
    args = {"schedule_create": '{"prompt": "x", "after_seconds": 600}',
            "schedule_list": "{}", "schedule_delete": '{"id": "schedule-1"}'}
    for tool in catalog.tool_definitions():
        result = cli("call", "s", tool.name, args[tool.name], env=session_dir)
        assert result.returncode == 0, result.stdout + result.stderr
    assert "unknown tool 'schedule_nap'" in one_line_error(
        cli("call", "s", "schedule_nap", env=session_dir))


def test_call_takes_its_tool_names_from_the_catalog(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = catalog.tool_definitions
    monkeypatch.setattr(catalog, "tool_definitions",
                        lambda *a: [t for t in real(*a) if t.name != "schedule_delete"])
    assert cli_module.main(["call", "s", "schedule_delete", '{"id": "schedule-1"}']) == 2
    named = ", ".join(["schedule_create", "schedule_list",
                       *(["schedule_update"] if switched.lifecycle_suite() else [])])
    assert capsys.readouterr().err == (
        f"dsh-schedule: call: unknown tool 'schedule_delete' (one of {named})\n")


# -- flags, --version -------------------------------------------------------------------


def test_argument_errors_are_one_line() -> None:
    assert "invalid choice: 'nap'" in one_line_error(cli("nap"))
    assert "SESSION" in one_line_error(cli("call"))
    assert "--redis-wait" in one_line_error(cli("worker", "--redis-wait", "-1"))


def test_version_runs_the_package_not_modules_in_the_working_directory(tmp_path: Path) -> None:
    for name in ("scheduler.py", "worker.py", "shared.py"):
        (tmp_path / name).write_text('raise SystemExit("wrong module imported")\n')
    result = cli("--version", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"dsh-schedule {importlib.metadata.version('dsh-tool-schedule')}\n"
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    assert cli("check", str(log), cwd=tmp_path).stdout == f"{log}: ok\n"


# -- waiting for Redis ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["worker", "scheduler", "host", "rebuild", "call"])
def test_a_redis_that_never_answers_is_one_line(session_dir: dict[str, str],
                                                command: str) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    extra = {"host": ["s"], "call": ["s", "schedule_list"]}.get(command, [])
    started = time.monotonic()
    result = cli(command, *extra, "--redis", url, "--redis-wait", "0.5", env=session_dir)
    line = one_line_error(result)
    assert time.monotonic() - started < 30
    assert f"127.0.0.1:{url.split(':')[-1]} did not answer within 0.5 s" in line


def test_the_worker_gives_up_after_redis_wait() -> None:
    result = cli("worker", "--redis", f"redis://127.0.0.1:{closed_port()}/0",
                 "--redis-wait", "1")
    assert "did not answer within 1 s (--redis-wait)" in one_line_error(result)


def test_the_redis_wait_message_never_shows_the_password() -> None:
    url = f"redis://user:hunter2@127.0.0.1:{closed_port()}/3"
    line = one_line_error(cli("rebuild", "--redis", url, "--redis-wait", "0"))
    assert "hunter2" not in line and "/3 did not answer" in line


def test_an_unusable_redis_url_is_one_line() -> None:
    assert "Redis URL is not usable" in one_line_error(
        cli("rebuild", "--redis", "http://127.0.0.1/0"))


@pytest.mark.parametrize("flags", [["-v", "rebuild"], ["rebuild", "-v"],
                                   ["rebuild", "--verbose"]])
def test_verbose_works_before_or_after_the_subcommand(flags: list[str]) -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    quiet = cli("rebuild", "--redis", url, "--redis-wait", "0")
    loud = cli(*flags, "--redis", url, "--redis-wait", "0")
    # Verbose shows the start-up wait's retry line before the one-line verdict.
    assert len(quiet.stderr.splitlines()) == 1
    assert loud.returncode == 2
    assert "Redis unavailable" in loud.stderr.splitlines()[0]
    assert loud.stderr.splitlines()[-1] == quiet.stderr.splitlines()[0]


@pytest.mark.redis
def test_rebuild_started_before_redis_waits_for_it(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server must be on PATH for this test"
    port = closed_port()
    command = [sys.executable, "-m", "dsh_schedule", "rebuild",
               "--redis", f"redis://127.0.0.1:{port}/0", "--redis-wait", "30"]
    waiting = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=cli_env())
    server = None
    try:
        time.sleep(1.0)
        assert waiting.poll() is None, "rebuild gave up before its --redis-wait"
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stdout, stderr = waiting.communicate(timeout=40)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
    assert waiting.returncode == 0, stderr
    assert json.loads(stdout) == {"woken": [], "retired": []}
