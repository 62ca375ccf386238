"""The README's main job: ``dsh-schedule demo`` in a fresh clone while no Redis answers,
showing the time-zone confirmation and a fixed-rate batch among the rest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXPECTED_IN_ORDER = [
    "dsh-schedule demo on embedded Redis",
    "Schedule installed: ['schedule_create', 'schedule_delete', 'schedule_list']",
    'model calls schedule_create {"prompt": "Stand up and stretch", "after_seconds": 3}',
    '"kind":"after"',
    '"kind":"at"',
    '"kind":"every"',
    "anchor-aligned targets",
    # a local time without a zone: refused, then confirmed by the turn's time context
    '"code":"timezone_confirmation_required"',
    "time-context reading confirms Europe/Berlin",
    '"kind":"at","prompt":"Water the plants"',
    "model calls schedule_list {}",
    '"deleted":true',
    "[SCHEDULE REMINDER]",
    'reminder_prompt_json: "Stand up and stretch"',
    '"label":"session-local"',
    'reminder_prompt_json: "Call the team"',
    "simulating a restart: every Redis key dropped",
    "rebuild woke ['demo-session']",
    'reminder_prompt_json: "Still here after the restart"',
    # two fixed-rate reminders due together: one batch message (an injected clock)
    "embedded demo: injected clock advanced by 300 s",
    "[SCHEDULE REMINDER BATCH]",
    '"reminder_prompt":"Check the build"},{"schedule_id":"schedule-7"',
    "arrived as one batch message (injected clock, embedded demo)",
    "session log valid",
    "demo finished",
]


@pytest.mark.slow
def test_demo_runs_in_a_fresh_clone_without_any_redis(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare is needed to cut the demo off from every Redis"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env["PYTHONPATH"] = str(clone)
    # A fresh network namespace: loopback is down, so no Redis can answer.
    result = subprocess.run(
        [unshare, "--net", sys.executable, "-m", "dsh_schedule", "demo"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    position = 0
    for expected in EXPECTED_IN_ORDER:
        found = result.stdout.find(expected, position)
        assert found >= 0, f"missing or out of order: {expected!r}\n{result.stdout}"
        position = found


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [[], ["-v"]])
def test_demo_with_json_logs_writes_only_json_lines(tmp_path: Path, verbose: list[str]) -> None:
    # given the demo asked for JSON logs, quiet or at debug level
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}

    # when it runs to its end
    result = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "demo", "--log-format", "json", *verbose,
         "--sessions", str(tmp_path / "sessions")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=90,
    )

    # then every line it wrote, on either stream, is one JSON object, and the timeline
    # says what the text one does
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [json.loads(line) for line in (result.stdout + result.stderr).splitlines()]
    assert all(isinstance(line, dict) for line in lines)
    shown = [line.get("message") or line.get("block") for line in lines if "elapsed_s" in line]
    assert shown[0] == "dsh-schedule demo on embedded Redis (in-process)"
    assert any('reminder_prompt_json: "Stand up and stretch"' in text for text in shown)
    assert shown[-1] == "demo finished"
    if verbose:
        assert any(line.get("level") == "DEBUG" for line in lines)


LIFECYCLE_IN_ORDER = [
    "Schedule installed: ['schedule_create', 'schedule_delete', 'schedule_list', "
    "'schedule_update']",
    "arrived as one batch message (injected clock, embedded demo)",
    # an edit keeps the id and re-arms: the reminder comes at its new time, as edited
    'model calls schedule_create {"prompt": "Stand up", "after_seconds": 3600}',
    'model calls schedule_update {"id": "schedule-8", "prompt": "Stand up and walk", '
    '"after_seconds": 2}',
    'reminder_prompt_json: "Stand up and walk"',
    # a count: 3 rule, paused across one period: the batch leaves it out
    '"count":3,"deliveredCount":0',
    'schedule_update {"id": "schedule-9", "paused": true}',
    '"state":"paused"',
    "paused schedule-9: injected clock advanced by 300 s",
    "[SCHEDULE REMINDER BATCH]",
    'schedule_update {"id": "schedule-9", "paused": false}',
    "occurrence 1 of 3",
    '"reminder_prompt":"Take the bread out"',
    "occurrence 2 of 3",
    '"reminder_prompt":"Take the bread out"',
    "occurrence 3 of 3",
    '"reminder_prompt":"Take the bread out"',
    "schedule-9 delivered three times and ended: it leaves the list",
    "session log valid",
    "demo finished",
]


@pytest.mark.slow
def test_with_the_lifecycle_on_the_demo_edits_pauses_and_runs_a_count_out(
        tmp_path: Path) -> None:
    # given the demo with DSH_SCHEDULE_LIFECYCLE=on on the embedded Redis
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env["DSH_SCHEDULE_LIFECYCLE"] = "on"

    # when it runs to its end
    result = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "demo", "--sessions", str(tmp_path / "s")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=90,
    )

    # then its timeline shows the edit, the pause and resume, and the count running out
    assert result.returncode == 0, result.stdout + result.stderr
    position = 0
    for expected in LIFECYCLE_IN_ORDER:
        found = result.stdout.find(expected, position)
        assert found >= 0, f"missing or out of order: {expected!r}\n{result.stdout}"
        position = found
    # the paused period's batch carried the other recurring reminders, not schedule-9
    paused_at = result.stdout.index("paused schedule-9: injected clock")
    resumed_at = result.stdout.index('"paused": false}')
    assert '"schedule_id":"schedule-9"' not in result.stdout[paused_at:resumed_at]
    # and the final list no longer holds it
    assert '"id":"schedule-9"' not in result.stdout[result.stdout.index("session log valid"):]
