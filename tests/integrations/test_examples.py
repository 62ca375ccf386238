"""Every runnable example and recipe of docs/integrations/ works end to end, on the
embedded runtime (its default: the worker and the scheduler in its own process) and with
``--redis`` (real ``worker`` and ``scheduler`` processes on the suite's real Redis): a
scripted model creates a reminder 2 s away through the framework, and the reminder is
delivered into the session exactly once and answered by the model, with every turn
recorded in the host event vocabulary (docs/architecture.md#host-event-vocabulary). The
examples are quiet: only what happens, none of rq's lines per job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.conftest import REAL_REDIS_URL
from tests.support import delivered_counts, dispatch_counts, reminder_messages

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "integrations"
TIMEOUT_S = 110
SESSION = "chat-42"

pytestmark = [pytest.mark.slow]
EXAMPLES_RUN = ["langgraph_example.py", "pydantic_ai_example.py", "openai_agents_recipe.py",
                "anthropic_recipe.py"]
# What an example prints: its tool list, the tool result, the answer, the delivered
# reminder (six lines) and the model's answer to it.
MOST_LINES = 12


def run_example(script: Path, env: dict[str, str],
                args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run an example in a process group of its own (its worker and scheduler go with it
    when it overruns), keeping its output either way."""
    process = subprocess.Popen(
        [sys.executable, "-W", "error", str(script), *args], env=env, cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{script.name} ran over {TIMEOUT_S} s\n{stdout}\n{stderr}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def kinds(events: list[Any]) -> list[str]:
    return [event.type for event in events]


@pytest.fixture(params=["embedded", pytest.param("redis", marks=pytest.mark.redis)])
def where(request: pytest.FixtureRequest) -> list[str]:
    """The example's arguments: none (the embedded runtime), or ``--redis`` and the
    suite's real Redis."""
    if request.param == "embedded":
        return []
    request.getfixturevalue("real_redis")
    return ["--redis", REAL_REDIS_URL]


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("example", EXAMPLES_RUN)
def test_the_example_delivers_the_reminder_once_and_the_model_answers_it(
        example: str, where: list[str], tmp_path: Path) -> None:
    # given the example and a session directory of the test's own
    sessions = tmp_path / "sessions"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env.update(DSH_SCHEDULE_SESSIONS=str(sessions))

    # when it runs to its end
    result = run_example(EXAMPLES / example, env, where)

    # then it succeeded and says what happened, and only that
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stderr == "", result.stderr[-4000:]
    assert len(result.stdout.splitlines()) <= MOST_LINES, result.stdout
    assert "Done: schedule-1 is set." in result.stdout
    assert 'reminder_prompt_json: "stretch"' in result.stdout
    assert "model answered: Reminder: time to stretch!" in result.stdout
    if example == "pydantic_ai_example.py":  # the reminder's run carried the history
        assert "messages in the thread's history: 6" in result.stdout

    # and the session log holds the reminder's dispatch and delivery exactly once
    store = JsonlStore(sessions)
    assert dispatch_counts(store, SESSION) == {"schedule-1": 1}
    assert delivered_counts(store, SESSION) == {"schedule-1": 1}
    events = list(store.read(SESSION).events)

    # the person's turn was recorded before its tool call ran, as the host contract asks
    first_turn = events[: kinds(events).index("turn/end") + 1]
    assert kinds(first_turn) == [
        "turn/start", "user/message", "user/message", "step/start", "assistant/message",
        "schedule/change", "tool/call", "tool/result", "step/end", "step/start",
        "assistant/message", "step/end", "turn/end",
    ]
    person, reading = first_turn[1].data, first_turn[2].data
    assert person["source"] == {"kind": "user", "rpcId": "rpc-1",
                                "clientTimeZone": "Europe/Berlin"}
    assert reading["source"]["plugin"] == "time-context"
    call, answer = first_turn[6].data, first_turn[7].data
    assert (call["name"], call["args"]) == ("schedule_create",
                                            {"prompt": "stretch", "after_seconds": 2})
    assert json.loads(answer["content"])["id"] == "schedule-1"
    assert answer["isError"] is False
    turn = first_turn[0].data["turn"]
    assert all(e.data["turn"] == turn for e in first_turn
               if e.type in ("step/start", "step/end", "turn/end"))

    # the reminder's turn: the delivery, then the model's answer to it, then its end
    (delivered,) = reminder_messages(store, SESSION)
    at = next(i for i, e in enumerate(events)
              if e.type == "user/message" and e.data == delivered)
    reminder_turn = events[at - 1:]
    assert kinds(reminder_turn) == [
        "turn/start", "user/message", "step/start", "assistant/message", "step/end",
        "turn/end",
    ]
    assert reminder_turn[3].data["content"][0]["text"] == "Reminder: time to stretch!"
    assert {e.data["turn"] for e in reminder_turn if e.type.startswith(("turn/", "step/"))} == {
        reminder_turn[0].data["turn"]}

    # and the whole log keeps the v1 invariant
    check = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "check", str(sessions / f"{SESSION}.jsonl")],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("recipe", EXAMPLES_RUN)
def test_with_the_lifecycle_on_an_example_offers_schedule_update_and_still_delivers(
        recipe: str, tmp_path: Path) -> None:
    # given an example on the embedded runtime with DSH_SCHEDULE_LIFECYCLE=on
    sessions = tmp_path / "sessions"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env.update(DSH_SCHEDULE_SESSIONS=str(sessions), DSH_SCHEDULE_LIFECYCLE="on")

    # when it runs to its end
    result = run_example(EXAMPLES / recipe, env, [])

    # then the model was offered the four tools, and the reminder came once as before
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stderr == "", result.stderr[-4000:]
    [offered] = [line for line in result.stdout.splitlines() if line.startswith("tools")]
    assert "schedule_update" in offered, offered
    assert "model answered: Reminder: time to stretch!" in result.stdout
    store = JsonlStore(sessions)
    assert delivered_counts(store, SESSION) == {"schedule-1": 1}


@pytest.mark.timeout(TIMEOUT_S + 30)
@pytest.mark.parametrize("example", ["langgraph_example.py", "pydantic_ai_example.py"])
def test_with_wake_unloaded_a_closed_thread_is_reopened_for_its_reminder(
        example: str, where: list[str], tmp_path: Path) -> None:
    # given an example with DSH_SCHEDULE_WAKE_UNLOADED=on: it closes the thread after the
    # person's turn, and its on_due_unloaded opens it again
    sessions = tmp_path / "sessions"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env.update(DSH_SCHEDULE_SESSIONS=str(sessions), DSH_SCHEDULE_WAKE_UNLOADED="on")

    # when it runs to its end
    result = run_example(EXAMPLES / example, env, where)

    # then the thread was closed, opened again by its reminder, and the reminder answered
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stderr == "", result.stderr[-4000:]
    lines = result.stdout.splitlines()
    closed, reopened = lines.index(f"closed {SESSION}"), lines.index(
        f"reopened {SESSION} for its reminder")
    assert closed < reopened < lines.index("model answered: Reminder: time to stretch!")
    store = JsonlStore(sessions)
    assert dispatch_counts(store, SESSION) == {"schedule-1": 1}
    assert delivered_counts(store, SESSION) == {"schedule-1": 1}
