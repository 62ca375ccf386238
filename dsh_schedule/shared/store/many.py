"""Many sessions at once: ``load``, ``append`` and ``flush`` for a batch
(docs/architecture.md#batched-due-transactions), one verb each for one session and many.

A batched due transaction or delivery makes many session files durable. A store that
can confirm many files at once (``FlushesMany``: the JSONL store, with one ``syncfs``)
does so. Otherwise each session is flushed on its own: ``fsync`` waits on the disk
without holding the interpreter, so the flushes of a batch run on a small pool of
threads, their waits overlap, and the file system can commit them together. Either way
each session gets its own answer.

A batch reads its sessions in one round trip where the store can (``LoadsMany``: the
PostgreSQL store, one query for every session's new rows).

A batch appends to its sessions in one statement where the store can (``AppendsMany``: the
PostgreSQL store, each session fenced at its own length).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final, Protocol, runtime_checkable

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import Event, NewEvent, Session
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.store.port import SessionStore

# Flushes in flight at once; a batch of one is flushed in the caller's thread.
FLUSH_THREADS: Final = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="dsh-flush")
        return _pool


@runtime_checkable
class FlushesMany(Protocol):
    """A store that confirms many sessions at once."""

    def flush_many(self, session_ids: Sequence[str]) -> dict[str, PersistenceError]:
        """``flush`` for every session (distinct ids); the failures, by session."""
        ...


@runtime_checkable
class LoadsMany(Protocol):
    """A store that reads many sessions in one round trip."""

    def load_many(self, session_ids: Sequence[str]
                  ) -> dict[str, tuple[Session, FoldState] | Exception]:
        """``load`` for every session; each one's log and fold, or what failed for it."""
        ...


@runtime_checkable
class AppendsMany(Protocol):
    """A store that appends to many sessions in one round trip."""

    def append_many(self, items: Sequence[tuple[str, Sequence[NewEvent], int]]
                    ) -> dict[str, tuple[Event, ...] | Exception]:
        """``append`` for every ``(session, events, expected_seq)`` (distinct sessions);
        each one's events appended, or what its append raised."""
        ...


def append(store: SessionStore, items: Sequence[tuple[str, Sequence[NewEvent], int]]
           ) -> dict[str, tuple[Event, ...] | Exception]:
    """``store.append`` for every ``(session, events, expected_seq)`` (distinct sessions), in
    one round trip when the store can (``AppendsMany``): each one's events appended, or the
    exception its append raised (``FenceConflict``, ``PersistenceError``, …)."""
    if len(items) > 1 and isinstance(store, AppendsMany):
        return store.append_many(items)
    appended: dict[str, tuple[Event, ...] | Exception] = {}
    for session_id, events, expected_seq in items:
        try:
            appended[session_id] = store.append(session_id, events, expected_seq=expected_seq)
        except Exception as exc:  # a store talks to no Redis: any failure is the append's
            appended[session_id] = exc
    return appended


def load(store: SessionStore, session_ids: Sequence[str]
         ) -> dict[str, tuple[Session, FoldState] | Exception]:
    """``store.load`` for every session, in one round trip when the store can
    (``LoadsMany``): each one's log and fold, or the exception its load raised."""
    ids = list(dict.fromkeys(session_ids))
    if len(ids) > 1 and isinstance(store, LoadsMany):
        return store.load_many(ids)
    loaded: dict[str, tuple[Session, FoldState] | Exception] = {}
    for session_id in ids:
        try:
            loaded[session_id] = store.load(session_id)
        except Exception as exc:  # a store talks to no Redis: any failure is the load's
            loaded[session_id] = exc
    return loaded


def flush(store: SessionStore, session_ids: Iterable[str]) -> dict[str, PersistenceError]:
    """``store.flush`` for every session, together; the failures, by session (an empty
    dict: every session is durable). Any other exception propagates."""
    ids = list(dict.fromkeys(session_ids))
    if len(ids) > 1 and isinstance(store, FlushesMany):
        return store.flush_many(ids)
    return flush_one_by_one(store, ids)


def flush_one_by_one(store: SessionStore, ids: Sequence[str]) -> dict[str, PersistenceError]:
    """``store.flush`` for each of ``ids`` (distinct), several at once on the pool."""

    def flush(session_id: str) -> PersistenceError | None:
        try:
            store.flush(session_id)
        except PersistenceError as exc:
            return exc
        return None

    if len(ids) <= 1:
        results = [flush(session_id) for session_id in ids]
    else:
        results = list(_executor().map(flush, ids))
    return {sid: exc for sid, exc in zip(ids, results, strict=True) if exc is not None}
