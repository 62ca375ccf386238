"""``dsh-schedule reminders``: the active reminders of every session, read from the logs
(docs/architecture.md#processes-and-cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsh_schedule.reminders import ActiveReminder, Unreadable, active_reminders
from dsh_schedule.shared.core.events import NewEvent, Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.memory import MemoryStore
from tests.integration.test_cli import cli, write_log


def create(number: int, prompt: str, at: str, kind: str = "after") -> dict[str, object]:
    schedule: dict[str, object] = {"id": f"schedule-{number}", "kind": kind, "prompt": prompt,
                                   "scheduledAt": at}
    if kind == "after":
        schedule["afterSeconds"] = 600
    else:
        schedule["everySeconds"] = 3600
    return {"version": 1, "operation": "create", "schedule": schedule}


def sessions_dir(tmp_path: Path) -> Path:
    """Three sessions: two with reminders (one deleted again), one without any."""
    root = tmp_path / "sessions"
    root.mkdir()
    write_log(root / "alpha.jsonl", [
        create(1, "stretch", "2098-01-01T08:00:00.000Z"),
        create(2, "gone", "2098-01-01T09:00:00.000Z"),
        {"version": 1, "operation": "delete", "id": "schedule-2"},
    ], session_id="alpha")
    write_log(root / "beta.jsonl", [
        create(1, "check\tCI", "2099-06-01T00:00:00.000Z", kind="every"),
    ], session_id="beta")
    write_log(root / "gamma.jsonl", [], session_id="gamma")
    return root


def test_the_text_table_lists_every_sessions_active_reminders(tmp_path: Path) -> None:
    root = sessions_dir(tmp_path)
    result = cli("reminders", "--sessions", str(root))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "session\tid\tkind\tnext target\tstate\tprompt",
        "alpha\tschedule-1\tafter\t2098-01-01T08:00:00.000Z\tscheduled\tstretch",
        "beta\tschedule-1\tevery\t2099-06-01T00:00:00.000Z\tscheduled\tcheck\\tCI",
    ]


def test_the_json_lines_carry_the_session_and_the_view(tmp_path: Path) -> None:
    root = sessions_dir(tmp_path)
    result = cli("reminders", "--json", env={"DSH_SCHEDULE_SESSIONS": str(root)})
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["session"], r["id"], r["kind"], r["prompt"], r["scheduledAt"], r["state"])
            for r in rows] == [
        ("alpha", "schedule-1", "after", "stretch", "2098-01-01T08:00:00.000Z", "scheduled"),
        ("beta", "schedule-1", "every", "check\tCI", "2099-06-01T00:00:00.000Z", "scheduled"),
    ]
    assert rows[1]["everySeconds"] == 3600


def test_due_before_keeps_the_reminders_whose_next_target_is_earlier(tmp_path: Path) -> None:
    root = sessions_dir(tmp_path)
    result = cli("reminders", "--sessions", str(root), "--json",
                 "--due-before", "2099-01-01T00:00:00Z")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["session"] for line in result.stdout.splitlines()] == ["alpha"]
    result = cli("reminders", "--sessions", str(root), "--due-before", "tonight")
    assert result.returncode == 2 and "tonight" in result.stderr


def test_a_session_that_cannot_be_read_is_said_and_the_others_still_listed(
        tmp_path: Path) -> None:
    root = sessions_dir(tmp_path)
    with (root / "alpha.jsonl").open("a", encoding="utf-8") as log:
        log.write("this is no event\n")
    result = cli("reminders", "--sessions", str(root), "--json")
    assert result.returncode == 1
    assert [json.loads(line)["session"] for line in result.stdout.splitlines()] == ["beta"]
    assert result.stderr.startswith("dsh-schedule: reminders: session alpha cannot be listed:")


def test_an_empty_or_missing_directory_lists_nothing(tmp_path: Path) -> None:
    result = cli("reminders", "--sessions", str(tmp_path / "none"), "--json")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


class CountingStore(MemoryStore):
    """A memory store that counts the sessions loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def load(self, session_id: str) -> tuple[Session, FoldState]:
        self.loads += 1
        return super().load(session_id)


def test_the_rows_stream_session_by_session() -> None:
    """The walk loads one session at a time, as its rows are asked for."""
    store = CountingStore()
    for name in ("a", "b", "c"):
        store.create(SessionHeader(id=name, createdAt=0))
        store.append(name, [NewEvent(type="schedule/change", time=0,
                                     data=create(1, name, "2098-01-01T00:00:00.000Z"))], 0)
    rows = active_reminders(store, now_ms=0)
    first: Any = next(rows)
    assert isinstance(first, ActiveReminder) and first.session == "a" and store.loads == 1
    assert [row.session for row in rows if not isinstance(row, Unreadable)] == ["b", "c"]
    assert store.loads == 3
