"""The log transaction engine (shared/transaction.py): the steps every writer of a session
log shares."""

from __future__ import annotations

import pytest

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ToolError
from dsh_schedule.shared.core.events import NewEvent
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.transaction import (
    Decision,
    LogTransactions,
    PersistenceUncertain,
    Read,
)
from tests.support import FakeClock, new_session

NOTE = "test/note"


def _note(now: int) -> tuple[NewEvent, ...]:
    return (NewEvent(type=NOTE, time=now, data={}),)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def tx(store: MemoryStore, coordination: Coordination) -> LogTransactions:
    return LogTransactions(store, coordination, FakeClock())


def test_a_preflight_keeps_each_agents_failure_and_reads_the_rest(
    store: MemoryStore, tx: LogTransactions
) -> None:
    # given two sessions and a third that does not exist
    new_session(store, "a")
    new_session(store, "b")
    # when they are preflighted together
    reads = tx.preflight(["a", "missing", "b"])
    # then each existing one is read and the missing one keeps its own failure
    assert isinstance(reads["a"], Read) and isinstance(reads["b"], Read)
    assert isinstance(reads["missing"], PersistenceError)


def test_a_transaction_decides_again_on_the_log_another_writer_extended(
    store: MemoryStore, tx: LogTransactions
) -> None:
    # given a session another writer appends to between the first read and its append
    session = new_session(store)
    seen: list[int] = []

    def decide(read: Read, now: int) -> Decision[int]:
        seen.append(read.length)
        if len(seen) == 1:
            store.append(session, list(_note(now)), expected_seq=read.length)
        return Decision(events=_note(now), then=lambda _after: read.length)

    # when the transaction runs, then it appended after the other writer's event
    assert tx.transact(session, decide, what="note", wait_s=1.0) == seen[0] + 1
    assert seen == [seen[0], seen[0] + 1]
    assert len(store.read(session).events) == seen[0] + 2


def test_a_failed_barrier_is_uncertain_about_its_subject_and_still_re_arms(
    store: MemoryStore, tx: LogTransactions, coordination: Coordination,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = new_session(store)
    rearmed: list[str] = []
    monkeypatch.setattr(coordination, "rearm",
                        lambda folds, *_a, **_k: rearmed.extend(a for a, _s in folds))

    def decide(read: Read, now: int) -> Decision[None]:
        return Decision(events=_note(now), then=lambda _after: None, subject="schedule-1")

    original_flush = store.flush
    flushes: list[str] = []

    def flush(session_id: str) -> None:
        flushes.append(session_id)
        if len(flushes) == 2:  # the barrier, after the preflight's
            raise PersistenceError("disk gone")
        original_flush(session_id)

    monkeypatch.setattr(store, "flush", flush)
    with pytest.raises(PersistenceUncertain) as raised:
        tx.transact(session, decide, what="note", wait_s=1.0)
    assert raised.value.subject == "schedule-1"
    assert rearmed == [session]


def test_a_decision_that_refuses_still_re_arms_from_the_preflight(
    store: MemoryStore, tx: LogTransactions, coordination: Coordination,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = new_session(store)
    rearmed: list[str] = []
    monkeypatch.setattr(coordination, "rearm",
                        lambda folds, *_a, **_k: rearmed.extend(a for a, _s in folds))

    def decide(read: Read, now: int) -> Decision[None]:
        raise ToolError("invalid_selector", "no")

    with pytest.raises(ToolError):
        tx.transact(session, decide, what="note", wait_s=1.0)
    assert rearmed == [session]
    assert tx.owed.owed() == []


def test_a_fence_conflict_is_not_a_failure_of_the_batch_step(
    store: MemoryStore, tx: LogTransactions
) -> None:
    session = new_session(store)
    stale = tx.load([session])[session]
    assert isinstance(stale, Read)
    store.append(session, list(_note(0)), expected_seq=stale.length)
    assert isinstance(tx.append([(session, stale, _note(1))])[session], FenceConflict)


def test_the_schedule_id_a_transaction_logs_with_ends_with_it(
    store: MemoryStore, tx: LogTransactions
) -> None:
    """A caller that opened no log block keeps no schedule id after the transaction."""
    from dsh_schedule.shared import logging_setup

    session = new_session(store)

    def decide(read: Read, now: int) -> Decision[int]:
        return Decision(events=_note(now), then=lambda _after: read.length, subject="schedule-9")

    tx.transact(session, decide, what="note", wait_s=1.0)
    assert "schedule_id" not in logging_setup._context.get()
