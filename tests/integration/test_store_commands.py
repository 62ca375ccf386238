"""One way to name a store, and sessions moved between stores: ``--store`` /
``DSH_SCHEDULE_STORE``, ``dsh-schedule store copy`` (resumable, verified line by line),
``dsh-schedule export`` and ``dsh-schedule store migrate``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dsh_schedule.cli import main
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, NewEvent
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.naming import close_store, store_from_settings
from dsh_schedule.shared.store.postgres import PostgresStore
from tests.adapters.test_store_contract import T0, at_create, header, message
from tests.redis_server import free_port

pytestmark = pytest.mark.postgres


def filled_jsonl(root: Path) -> JsonlStore:
    """Sessions of every kind: zoned, headerless, forked, hostile ids, odd text."""
    store = JsonlStore(root)
    store.create(header("parent"))
    odd = {"content": [{"type": "text", "text": "cut \ud83d é \u2603"}],
           "source": {"kind": "user"}}
    store.append("parent", [message("hi"), at_create("schedule-1"),
                            NewEvent(type=USER_MESSAGE, time=T0, data=odd)], 0)
    store.fork("parent", "child", created_at_ms=T0 + 1)
    store.append("child", [at_create("schedule-2")], 3)
    store.create(header("../odd id", None))
    store.create(header("empty"))
    return store


def files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob("*.jsonl"))}


def test_copy_jsonl_to_postgres_and_back_gives_byte_identical_files(
    tmp_path: Path, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given
    first, second = tmp_path / "a", tmp_path / "b"
    filled_jsonl(first)
    # when: JSONL -> PostgreSQL -> JSONL
    assert main(["store", "copy", str(first), postgres_url]) == 0
    assert main(["store", "copy", postgres_url, str(second)]) == 0
    # then
    assert files(second) == files(first)
    assert len(files(first)) == 4
    # and a copy run again verifies and copies nothing (it resumes where it was)
    capsys.readouterr()
    assert main(["store", "copy", str(first), postgres_url]) == 0
    assert "copied 0, already there 4" in capsys.readouterr().out


def test_a_resumed_copy_extends_a_session_that_grew_and_refuses_one_that_differs(
    tmp_path: Path, postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source = filled_jsonl(tmp_path / "a")
    assert main(["store", "copy", str(tmp_path / "a"), postgres_url]) == 0
    # when the source grows, and the target's copy of another session is changed
    source.append("empty", [message("later")], 0)
    with PostgresStore(postgres_url) as target:
        target.append("parent", [message("only in the target")], 3)
    capsys.readouterr()
    code = main(["store", "copy", str(tmp_path / "a"), postgres_url])
    # then
    out = capsys.readouterr()
    assert code == 1
    assert "extended 1, conflicting 1" in out.out and "parent" in out.err
    with PostgresStore(postgres_url) as target:
        assert [e.data for e in target.read("empty").events] == [message("later").data]


def test_export_prints_a_postgres_held_session_as_its_jsonl_file(
    tmp_path: Path, postgres_url: str, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    filled_jsonl(tmp_path / "a")
    assert main(["store", "copy", str(tmp_path / "a"), postgres_url]) == 0
    capsysbinary.readouterr()
    assert main(["export", "child", "--store", postgres_url]) == 0
    assert capsysbinary.readouterr().out == (tmp_path / "a" / "child.jsonl").read_bytes()


def test_session_create_and_call_name_a_postgres_store(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSH_SCHEDULE_STORE", postgres_url)
    assert main(["session", "create", "s1", "--time-zone", "UTC"]) == 0
    assert main(["call", "s1", "schedule_create",
                 json.dumps({"prompt": "stretch", "after_seconds": 600})]) == 0
    with PostgresStore(postgres_url) as store:
        (event,) = store.read("s1").events
    assert event.type == SCHEDULE_CHANGE


def test_call_with_the_store_not_answering_exits_2_and_makes_no_call(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a PostgreSQL store no server answers (as while the database restarts)
    monkeypatch.setenv("DSH_SCHEDULE_STORE",
                       f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    # when a call is made, then it says the store did not answer, as a Redis that does not
    # answer is said: exit 2, one line, no call made (exit 1 is a crash's or a corrupt log's)
    assert main(["call", "s1", "schedule_list"]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith("dsh-schedule: call: the session store postgresql://postgres@"), said
    assert "did not answer (" in said and said.endswith("PoolTimeout); no call made"), said


def test_a_directory_store_is_the_sessions_directory(tmp_path: Path) -> None:
    settings = Settings.from_env({"DSH_SCHEDULE_STORE": str(tmp_path / "x")})
    assert settings.sessions == tmp_path / "x"
    store = store_from_settings(settings)
    assert isinstance(store, JsonlStore) and store.root == tmp_path / "x"
    close_store(store)
    url = Settings.from_env({"DSH_SCHEDULE_STORE": "postgresql://u:secret@h/db"})
    assert url.store_shown == "postgresql://u@h/db"


@pytest.fixture
def schema_url(postgres_url: str) -> Iterator[str]:
    schema = f"t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    try:
        yield f"{postgres_url}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


def test_store_migrate_creates_the_schema_once(
    schema_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["store", "migrate", "--store", schema_url]) == 0
    assert main(["store", "migrate", "--store", schema_url]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "session schema: version 0 -> 1", "session schema: version 1 -> 1"]


def test_reminders_lists_the_sessions_of_a_postgres_store(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DSH_SCHEDULE_STORE", postgres_url)
    assert main(["session", "create", "s1", "--time-zone", "UTC"]) == 0
    assert main(["call", "s1", "schedule_create",
                 json.dumps({"prompt": "stretch", "after_seconds": 600})]) == 0
    capsys.readouterr()
    assert main(["reminders"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 and rows[1].startswith("s1\tschedule-1\t")
