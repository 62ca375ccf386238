"""Faults of the database are outages, never false answers (docs/architecture.md#outages):
a connection lost after an append's statement was sent, with the reply lost, through a
proxy on loopback the test cuts (tests/pg_proxy.py)."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator

import fakeredis
import psycopg
import pytest

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.errors import PersistenceError, disk_outage_errno
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import append_durably
from dsh_schedule.shared.store.postgres import EVENTS, SESSIONS, PostgresStore
from tests.adapters.test_store_contract import message
from tests.pg_proxy import PgProxy
from tests.support import FakeClock, new_session, value

pytestmark = pytest.mark.postgres

APPEND_MARKER = b"WITH fenced AS"


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[PgProxy]:
    proxy = PgProxy(postgres_url)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def store(proxy: PgProxy) -> Iterator[PostgresStore]:
    with PostgresStore(proxy.url, timeout_s=1) as store:
        yield store


def tools_on(store: PostgresStore, settings: Settings) -> ScheduleTools:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return ScheduleTools(store, Coordination(client, settings), settings, FakeClock())


def listed_when_back(tools: ScheduleTools) -> list[object]:
    """The ids ``schedule_list`` answers once the store answers again (the pool reconnects
    after its own backoff; until then every answer is ``persistence_uncertain``)."""
    for _ in range(100):
        result = tools.call("s1", "schedule_list", {})
        if not result.is_error:
            return [v["id"] for v in value(result.content)]
        assert value(result.content)["code"] == "persistence_uncertain"
        time.sleep(0.2)
    raise AssertionError("the store did not come back")


def creates(postgres_url: str) -> list[object]:
    with PostgresStore(postgres_url) as fresh:
        return [e.data["schedule"]["id"] for e in fresh.read("s1").events
                if e.type == SCHEDULE_CHANGE and e.data["operation"] == "create"]


def test_a_cut_after_commit_answers_persistence_uncertain_and_a_later_list_confirms_once(
    store: PostgresStore, proxy: PgProxy, settings: Settings, postgres_url: str
) -> None:
    # given
    tools = tools_on(store, settings)
    new_session(store)
    # when: the append's statement reaches the server and commits, its reply is lost, and
    # the server stays out of reach while the tool tries to confirm it
    proxy.cut_after(APPEND_MARKER)
    original = store._confirm

    def unreachable(*args: object) -> None:
        proxy.down()
        original(*args)  # type: ignore[arg-type]

    store._confirm = unreachable  # type: ignore[method-assign]
    result = tools.call("s1", "schedule_create", {"prompt": "stretch", "after_seconds": 600})
    store._confirm = original  # type: ignore[method-assign]
    # then the answer is uncertain, naming the id
    assert proxy.cuts == 1
    got = value(result.content)
    assert (got["code"], got["id"]) == ("persistence_uncertain", "schedule-1")
    # when the server is back, a later list confirms the reminder, once
    proxy.up()
    assert listed_when_back(tools) == ["schedule-1"]
    assert creates(postgres_url) == ["schedule-1"]


def test_a_cut_after_commit_that_the_barrier_can_check_answers_the_reminder(
    store: PostgresStore, proxy: PgProxy, settings: Settings, postgres_url: str
) -> None:
    tools = tools_on(store, settings)
    new_session(store)
    proxy.cut_after(APPEND_MARKER)
    result = tools.call("s1", "schedule_create", {"prompt": "stretch", "after_seconds": 600})
    assert proxy.cuts == 1
    assert not result.is_error and value(result.content)["id"] == "schedule-1"
    assert creates(postgres_url) == ["schedule-1"]


def test_a_statement_lost_before_the_server_is_committed_by_a_later_flush_once(
    store: PostgresStore, proxy: PgProxy, settings: Settings, postgres_url: str
) -> None:
    # given: the append's statement never reaches the server, which then is out of reach
    tools = tools_on(store, settings)
    new_session(store)
    proxy.drop_at(APPEND_MARKER)
    result = tools.call("s1", "schedule_create", {"prompt": "stretch", "after_seconds": 600})
    assert value(result.content)["code"] == "persistence_uncertain"
    assert creates(postgres_url) == []
    # when it is back, the next call's flush commits the kept append at the same fence
    proxy.up()
    assert listed_when_back(tools) == ["schedule-1"]
    assert creates(postgres_url) == ["schedule-1"]


def test_an_unreachable_database_is_an_outage_of_the_session_store(
    store: PostgresStore, proxy: PgProxy
) -> None:
    new_session(store)
    proxy.down()
    with pytest.raises(PersistenceError) as caught:
        store.read("s2")
    assert disk_outage_errno(caught.value) == errno.EIO


@pytest.mark.parametrize(("options", "code"), [
    ("-cdefault_transaction_read_only%3Don", errno.EROFS),
    ("-cstatement_timeout%3D200", errno.EIO),
], ids=["read-only replica", "statement timeout"])
def test_a_server_that_refuses_writes_is_an_outage_not_a_corrupt_session(
    postgres_url: str, options: str, code: int
) -> None:
    # given a server that takes no writes (a replica after failover), or one where the
    # append waits past statement_timeout (another transaction holds the session's row)
    with PostgresStore(postgres_url) as store:
        new_session(store)
    with psycopg.connect(postgres_url) as holder:  # its transaction stays open
        holder.execute(f"SELECT 1 FROM {SESSIONS} FOR UPDATE")  # type: ignore[arg-type]
        with PostgresStore(f"{postgres_url}?options={options}", migrate=False) as refusing:
            with pytest.raises(PersistenceError) as caught:
                refusing.append("s1", [message("x")], 0)
        holder.rollback()
    # then it is said as an outage of the session store, and nothing was appended
    assert disk_outage_errno(caught.value) == code
    with PostgresStore(postgres_url) as store:
        assert store.read("s1").events == ()


def test_appends_a_crashed_server_lost_are_appended_again_when_it_is_back(
    store: PostgresStore, proxy: PgProxy, postgres_url: str
) -> None:
    # given: an append not yet confirmed by a flush, then the server out of reach
    new_session(store)
    store.append("s1", [message("a"), message("b")], 0)
    proxy.down()
    with pytest.raises(PersistenceError):
        store.read("s2")
    # when it comes back having lost that commit (a crash before its log reached the disk)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DELETE FROM {EVENTS} WHERE session_id = 's1'")  # type: ignore[arg-type]
        conn.execute(f"UPDATE {SESSIONS} SET length = 0")  # type: ignore[arg-type]
    proxy.up()
    for _ in range(100):  # the pool reconnects after its own backoff
        try:
            store.exists("s2")
            break
        except PersistenceError:
            time.sleep(0.2)
    # then the first success finds it lost and appends it again at the same fence, durably,
    # though the process that made it never flushes that session again
    with PostgresStore(postgres_url) as fresh:
        assert [e.data["content"][0]["text"] for e in fresh.read("s1").events] == ["a", "b"]


def test_a_flush_after_a_create_or_an_append_made_durable_needs_no_query(
    store: PostgresStore, proxy: PgProxy
) -> None:
    # given: sessions this store created, one appended to durably, one not, one left
    new_session(store, "s1")
    new_session(store, "s2")
    new_session(store, "s3")
    assert append_durably(store, "s1", [message("a")], 0)[1] is None
    store.append("s2", [message("b")], 0)
    # when the server is out of reach
    proxy.down()
    # then the flushes with nothing to ask it succeed; the one with an append cannot
    store.flush("s1")
    store.flush("s3")
    with pytest.raises(PersistenceError):
        store.flush("s2")
