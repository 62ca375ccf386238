"""The index of next due moments (docs/architecture.md#the-index-of-next-due-moments).

Beside each session a store keeps the session's next due moment (``core.due``) and the
log it was derived from. The JSONL store keeps it in one small file per session under
``<root>/.due/`` (docs/decisions.md): written, never flushed, after every append of a
``schedule/change`` record while the log's flock is held, replaced atomically. It records
the log's file stamp (identity, size, change times) as well as its length, so an entry
is known current from one ``stat`` of the log; any other entry is folded again from the
log. No log is ever written here.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from dsh_schedule.shared.core.due import next_due_moment_ms
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.store.foldcache import LogDigest
from dsh_schedule.shared.store.port import DueEntry

logger = logging.getLogger(__name__)

# The index's directory under a JSONL store's root: its name starts with '.', which no
# escaped session id does, so the store never lists it as a session.
DUE_DIRECTORY: Final[str] = ".due"
DUE_SUFFIX: Final[str] = ".due"
_FORMAT: Final[int] = 1
_STAGING_FLAGS: Final[int] = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def due_of(digest: LogDigest) -> int | None:
    """The next due moment of the log ``digest`` was fed; None when nothing is active or
    the log's own Schedule records do not fold (its owner is told when it loads it)."""
    try:
        return next_due_moment_ms(digest.fold())
    except ScheduleLogError:
        return None


def due_page(
    ids: Iterable[str],
    entry: Callable[[str], DueEntry | None],
    *,
    before_ms: int | None,
    limit: int,
) -> list[DueEntry]:
    """The first ``limit`` entries of ``ids`` (in order) that have a due moment before
    ``before_ms`` (any, when None)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit!r}")
    page: list[DueEntry] = []
    for session_id in ids:
        found = entry(session_id)
        if found is None or (before_ms is not None and found.due_ms >= before_ms):
            continue
        page.append(found)
        if len(page) == limit:
            break
    return page


class Recorded:
    """An index entry as a JSONL store wrote it."""

    __slots__ = ("due_ms", "length", "stamp")

    def __init__(self, due_ms: int | None, length: int, stamp: tuple[int, ...]) -> None:
        self.due_ms = due_ms
        self.length = length
        self.stamp = stamp


def encode_recorded(recorded: Recorded) -> bytes:
    return json.dumps({
        "format": _FORMAT, "due": recorded.due_ms, "length": recorded.length,
        "stamp": list(recorded.stamp),
    }, separators=(",", ":")).encode()


def decode_recorded(data: bytes) -> Recorded | None:
    """The entry in ``data``; None for anything this store did not write whole."""
    try:
        raw = json.loads(data)
        due, length, stamp = raw["due"], raw["length"], raw["stamp"]
        if raw["format"] != _FORMAT or not isinstance(length, int) or not isinstance(stamp, list):
            return None
        if due is not None and not isinstance(due, int):
            return None
        if not all(isinstance(part, int) for part in stamp):
            return None
        return Recorded(due, length, tuple(stamp))
    except (ValueError, TypeError, KeyError):
        return None


def read_recorded(path: str) -> Recorded | None:
    """The entry at ``path``; None when it is missing or unreadable (folded again)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return None
    return decode_recorded(data)


def write_recorded(directory: Path, name: str, recorded: Recorded) -> bool:
    """Replace the entry ``name`` in ``directory`` at once (no flush: a lost entry no
    longer matches its log and is folded again). False, logged, when it could not be
    written: the old entry stays and no longer matches either."""
    staging = os.path.join(directory, f".{uuid.uuid4().hex}.tmp")
    try:
        try:
            fd = os.open(staging, _STAGING_FLAGS, 0o666)
        except FileNotFoundError:
            directory.mkdir(exist_ok=True)
            fd = os.open(staging, _STAGING_FLAGS, 0o666)
        try:
            data = encode_recorded(recorded)
            if os.write(fd, data) != len(data):
                raise OSError("short write")
        finally:
            os.close(fd)
        os.replace(staging, os.path.join(directory, name))
    except OSError:
        logger.warning("could not write the due index entry %s", name, exc_info=True)
        try:
            os.unlink(staging)
        except OSError:
            pass
        return False
    return True


__all__ = [
    "DUE_DIRECTORY", "DUE_SUFFIX", "Recorded", "decode_recorded", "due_of", "due_page",
    "encode_recorded", "read_recorded", "write_recorded",
]
