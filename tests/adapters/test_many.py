"""Flushing many sessions at once (dsh_schedule.shared.store.many)."""

from __future__ import annotations

import threading

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.store import many
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import new_session


class _Store(MemoryStore):
    def __init__(self, failing: set[str]) -> None:
        super().__init__()
        self.failing = failing
        self.threads: set[str] = set()

    def flush(self, session_id: str) -> None:
        self.threads.add(threading.current_thread().name)
        if session_id in self.failing:
            raise PersistenceError(f"flush of {session_id} failed")
        super().flush(session_id)


def test_every_session_is_flushed_and_each_failure_told_by_its_session() -> None:
    store = _Store({"s3", "s7"})
    ids = [new_session(store, f"s{i}") for i in range(10)]

    failed = many.flush(store, [*ids, "s1"])  # a session named twice is flushed once

    assert sorted(failed) == ["s3", "s7"]
    assert all(isinstance(exc, PersistenceError) for exc in failed.values())
    assert sorted(store.flush_calls) == sorted(i for i in ids if i not in {"s3", "s7"})
    assert any(name.startswith("dsh-flush") for name in store.threads)  # several at once


def test_one_session_is_flushed_in_the_callers_thread() -> None:
    store = _Store(set())
    new_session(store, "only")
    assert many.flush(store, ["only"]) == {} and store.flush_calls == ["only"]
    assert store.threads == {threading.current_thread().name}
    assert many.flush(store, []) == {}
