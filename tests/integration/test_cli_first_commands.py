"""What a newcomer's first commands do with their output and their files
(docs/architecture.md#processes-and-cli): a reader that goes away, a session file that
cannot be read, a sessions directory that is not there yet, and a tool's content printed
to a script or to a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.conftest import real_redis_url
from tests.integration.test_cli import EVENTS, cli, cli_env, write_log
from tests.support import Processes, process_env, reminder_texts

# -- a reader that went away ------------------------------------------------------------


def closed_reader_run(*args: str) -> subprocess.CompletedProcess[str]:
    """``dsh-schedule ARGS`` writing into a pipe whose reader has already gone, as behind
    ``| head -1`` once head has its line: every write to it fails (EPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dsh_schedule", *args], env=cli_env(),
                                stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    _, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)


OUTPUT_COMMANDS = ["help", "version", "catalog openai", "catalog", "check", "fold",
                   "session create", "call", "reminders", "status", "status json", "health"]


def output_command(tmp_path: Path, name: str) -> list[str]:
    log = write_log(tmp_path / "s.jsonl", EVENTS)
    return {
        "help": ["--help"],
        "version": ["--version"],
        "catalog openai": ["catalog", "--format", "openai"],
        "catalog": ["catalog"],
        "check": ["check", str(log)],
        "fold": ["fold", str(log), "--now", "2026-12-01T09:00:00Z"],
        "session create": ["session", "create", "new", "--sessions", str(tmp_path)],
        "call": ["call", "s", "schedule_list", "{}", "--sessions", str(tmp_path)],
        "reminders": ["reminders", "--sessions", str(tmp_path)],
        "status": ["status", "--redis", real_redis_url()],
        "status json": ["status", "--json", "--redis", real_redis_url()],
        "health": ["health", "--redis", real_redis_url()],
    }[name]


@pytest.mark.redis
@pytest.mark.parametrize("name", OUTPUT_COMMANDS)
def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path: Path, name: str) -> None:
    # Given a command whose standard output is a pipe nobody reads any more
    args = output_command(tmp_path, name)
    # When it writes there
    done = closed_reader_run(*args)
    # Then it ends at once, with no traceback: as a command SIGPIPE ended, or (argparse's
    # --help, which drops what it cannot write) with 0
    assert done.returncode == (0 if name == "help" else 141), done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_a_real_head_takes_its_line_and_the_commands_end_quietly() -> None:
    # The second command starts writing once head has its line and has gone.
    command = f'"{sys.executable}" -m dsh_schedule catalog --format openai'
    shell = subprocess.run(["sh", "-c", f"({command}; {command}) | head -1"],
                           capture_output=True, text=True, env=cli_env(), timeout=120)
    assert (shell.stdout, shell.stderr) == ("[\n", "")


# -- session files -------------------------------------------------------------------------


def test_check_says_why_a_session_file_cannot_be_read(tmp_path: Path) -> None:
    locked = write_log(tmp_path / "locked.jsonl", EVENTS)
    locked.chmod(0)
    readable_anyway = os.access(locked, os.R_OK)  # root reads it all the same
    done = cli("check", "/nonexistent/x.jsonl", str(tmp_path))
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "/nonexistent/x.jsonl: cannot read session file 'x.jsonl': "
        "No such file or directory",
        f"{tmp_path}: cannot read session file '{tmp_path.name}': Is a directory",
    ]
    if not readable_anyway:
        assert cli("check", str(locked)).stdout == (
            f"{locked}: cannot read session file 'locked.jsonl': Permission denied\n")


def test_session_create_says_it_created_the_sessions_directory(tmp_path: Path) -> None:
    sessions = tmp_path / "a" / "b"
    done = cli("session", "create", "s1", "--sessions", str(sessions))
    assert (done.returncode, done.stdout) == (0, "s1\n"), done.stderr
    assert done.stderr == f"dsh-schedule: created the sessions directory '{sessions}'\n"
    assert (sessions / "s1.jsonl").exists()
    # the next one says nothing more
    again = cli("session", "create", "s2", "--sessions", str(sessions))
    assert (again.returncode, again.stdout, again.stderr) == (0, "s2\n", "")


# -- a tool's content, to a script and to a terminal ---------------------------------------

PROMPT = "tea\u00a0time\u0085now \u00e9"  # NBSP and NEL: JSON leaves both raw


def create_with_prompt(tmp_path: Path) -> Path:
    sessions = tmp_path / "sessions"
    assert cli("session", "create", "s1", "--sessions", str(sessions)).returncode == 0
    return sessions


def on_a_terminal(*args: str) -> str:
    """What ``dsh-schedule ARGS`` prints when its standard output is a terminal."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "dsh_schedule", *args], env=cli_env(),
                                stdout=follower, stderr=subprocess.DEVNULL)
    finally:
        os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(60) == 0
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_call_prints_the_exact_rendering_to_a_script_and_escapes_for_a_terminal(
    tmp_path: Path,
) -> None:
    sessions = create_with_prompt(tmp_path)
    args = json.dumps({"prompt": PROMPT, "after_seconds": 600})
    # to a pipe: the tool's compact rendering byte for byte, the characters kept raw
    made = cli("call", "s1", "schedule_create", args, "--sessions", str(sessions))
    assert made.returncode == 0, made.stderr
    view = json.loads(made.stdout)
    assert made.stdout == json.dumps(view, ensure_ascii=False, separators=(",", ":")) + "\n"
    assert PROMPT in made.stdout
    # to a terminal: the same JSON value, with what a terminal would act on escaped
    shown = on_a_terminal("call", "s1", "schedule_list", "{}", "--sessions", str(sessions))
    assert "\\u00a0" in shown and "\\u0085" in shown and "\u00e9" in shown
    assert "\u00a0" not in shown and "\u0085" not in shown
    assert [entry["prompt"] for entry in json.loads(shown)] == [PROMPT] == [view["prompt"]]
    # and fold, printing the same value from the log, escapes for a terminal too
    log = str(sessions / "s1.jsonl")
    folded = on_a_terminal("fold", log)
    assert "\\u0085" in folded and json.loads(folded) == json.loads(shown)
    assert PROMPT in cli("fold", log).stdout
    # and reminders --json prints the same view with its session
    listed = cli("reminders", "--json", "--sessions", str(sessions))
    assert PROMPT in listed.stdout and json.loads(listed.stdout)["prompt"] == PROMPT
    assert "\\u0085" in on_a_terminal("reminders", "--json", "--sessions", str(sessions))


@pytest.mark.redis
@pytest.mark.slow
def test_a_host_whose_reader_went_away_stops_quietly_after_the_delivery(
    tmp_path: Path, real_redis: object,
) -> None:
    # Given a host whose standard output nobody reads any more, a worker and a scheduler
    processes = Processes(tmp_path, process_env(
        real_redis_url(), tmp_path / "sessions", prefix="pipe:", queue="pipe",
        lease_renew="1", mover_interval="0.1"))
    assert processes.run("session", "create", "s1").returncode == 0
    read_end, write_end = os.pipe()
    os.close(read_end)
    with (tmp_path / "host.log").open("w") as log:
        host = subprocess.Popen([sys.executable, "-m", "dsh_schedule", "host", "s1"],
                                env=processes.env, stdout=write_end, stderr=log)
    os.close(write_end)
    try:
        processes.spawn("worker", "worker")
        processes.spawn("scheduler", "scheduler")
        # When a reminder is delivered and the host prints that it was
        made = processes.run("call", "s1", "schedule_create",
                             json.dumps({"prompt": "stretch", "after_seconds": 1}))
        assert made.returncode == 0, made.stderr
        # Then the host stops, as SIGPIPE would have stopped it, with no traceback
        assert host.wait(60) == 141, (tmp_path / "host.log").read_text()
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        processes.close()
    assert "Traceback" not in (tmp_path / "host.log").read_text()
    store = JsonlStore(tmp_path / "sessions")
    assert reminder_texts(store, "s1") != []
    assert processes.check(tmp_path / "sessions").returncode == 0
