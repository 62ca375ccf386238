"""The read-only and session CLI commands (docs/architecture.md#processes-and-cli)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REAL_REDIS_URL

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


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "dsh_schedule", *args], capture_output=True,
                          text=True, env=full, timeout=60)


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
            "schedule_create", "schedule_list", "schedule_delete"]


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
    result = cli(*args)
    assert result.returncode != 0
    assert "Redis URL is required" in result.stderr


def test_bad_settings_are_a_clear_error(tmp_path: Path) -> None:
    result = cli("call", "s", "schedule_list",
                 env={"DSH_SCHEDULE_SESSIONS": str(tmp_path), "DSH_SCHEDULE_LOCK_TTL": "soon"})
    assert result.returncode == 2
    assert "DSH_SCHEDULE" in result.stderr or "lock_ttl_s" in result.stderr
    assert "Traceback" not in result.stderr


def test_rebuild_reports_what_it_woke(real_redis: object) -> None:
    result = cli("rebuild", env={"DSH_SCHEDULE_REDIS_URL": REAL_REDIS_URL,
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
