"""One way to name a session store (docs/architecture.md#session-logs): a directory is the
JSONL store, a ``postgresql://`` URL the PostgreSQL store. ``psycopg`` is imported only
when a URL is opened (the ``postgres`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dsh_schedule.shared.store.jsonl import DEFAULT_CACHE_MB, JsonlStore
from dsh_schedule.shared.store.port import SessionStore

if TYPE_CHECKING:
    from dsh_schedule.shared.settings import Settings

URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(name: str) -> bool:
    """Whether a store name is a PostgreSQL URL (else it is a JSONL directory)."""
    return name.startswith(URL_SCHEMES)


def open_store(name: str | Path, *, cache_mb: float = DEFAULT_CACHE_MB,
               syncfs: bool = True) -> SessionStore:
    """The store ``name`` names. A PostgreSQL store holds a pool: ``close_store`` it."""
    if isinstance(name, str) and is_database_url(name):
        try:
            from dsh_schedule.shared.store.postgres import PostgresStore
        except ImportError as exc:  # the extra is missing
            raise RuntimeError("a postgresql:// store needs the 'postgres' extra: "
                               "pip install 'dsh-tool-schedule[postgres]'") from exc
        return PostgresStore(name, cache_mb=cache_mb)
    return JsonlStore(name, cache_mb=cache_mb, syncfs=syncfs)


def store_from_settings(settings: Settings) -> SessionStore:
    """The store a deployment's settings name (``store``, else the ``sessions`` directory)."""
    return open_store(settings.store_name, cache_mb=settings.cache_mb, syncfs=settings.syncfs)


def close_store(store: SessionStore) -> None:
    """Release what a store holds open (a pool, a descriptor), when it holds anything."""
    close = getattr(store, "close", None)
    if callable(close):
        close()
