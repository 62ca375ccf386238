"""Flushing many sessions at once (docs/architecture.md#batched-due-transactions).

A batched due transaction or delivery makes many session files durable. ``fsync`` waits
on the disk without holding the interpreter, so the flushes of a batch run on a small
pool of threads: their waits overlap, and the file system can commit them together. Each
session still gets its own flush and its own answer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from dsh_schedule.shared.core.errors import PersistenceError
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


def flush_each(store: SessionStore, session_ids: Iterable[str]) -> dict[str, PersistenceError]:
    """``store.flush`` for every session, several at once; the failures, by session (an
    empty dict: every session is durable). Any other exception propagates."""
    ids = list(dict.fromkeys(session_ids))

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
