"""The index of next due moments (docs/architecture.md#the-index-of-next-due-moments).

Beside each session a store keeps the session's next due moment (``core.due``) and the
log it was derived from. The JSONL store keeps it in one small file per session under
``<root>/.due/`` (docs/decisions.md): written, never flushed, after every append of a
``schedule/change`` record while the log's flock is held, overwritten in place: one
``pwrite`` of a fixed size into the entry's own file (a rename over it cost ten to a
hundred times as much: the file system writes the new file's data back at a rename that
replaces one). The entry carries a check of its fields, so a reader that meets a write
half done, or a crash that left one, finds it unreadable and folds the log again. It
records the log's file stamp (identity, size, change times) as well as its length, so an
entry is known current from one ``stat`` of the log; any other entry is folded again from
the log. No log is ever written here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
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
# 2: written in place, padded to ENTRY_BYTES, with a check (1: replaced by a rename, no
# check; read as unreadable, so an older store's entries are folded again once).
_FORMAT: Final[int] = 2
ENTRY_BYTES: Final[int] = 256  # every entry's size: an overwrite leaves nothing behind
_WRITE_FLAGS: Final[int] = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC


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


def _check(due: int | None, length: int, stamp: list[int]) -> str:
    fields = json.dumps([_FORMAT, due, length, stamp], separators=(",", ":")).encode()
    return hashlib.blake2b(fields, digest_size=8).hexdigest()


def encode_recorded(recorded: Recorded) -> bytes:
    """The entry's bytes: its fields and their check, padded with spaces to
    ``ENTRY_BYTES``."""
    stamp = list(recorded.stamp)
    data = json.dumps({
        "format": _FORMAT, "due": recorded.due_ms, "length": recorded.length,
        "stamp": stamp, "check": _check(recorded.due_ms, recorded.length, stamp),
    }, separators=(",", ":")).encode()
    if len(data) > ENTRY_BYTES:
        raise ValueError(f"a due index entry of {len(data)} bytes")
    return data.ljust(ENTRY_BYTES)


def decode_recorded(data: bytes) -> Recorded | None:
    """The entry in ``data``; None for anything this store did not write whole (a torn or
    half-overwritten entry fails its check)."""
    try:
        raw = json.loads(data[:ENTRY_BYTES])
        due, length, stamp = raw["due"], raw["length"], raw["stamp"]
        if raw["format"] != _FORMAT or not isinstance(length, int) or not isinstance(stamp, list):
            return None
        if due is not None and not isinstance(due, int):
            return None
        if not all(isinstance(part, int) for part in stamp):
            return None
        if raw["check"] != _check(due, length, stamp):
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
    """Overwrite the entry ``name`` in ``directory`` in place (no flush: a lost or torn
    entry no longer matches its log, or fails its check, and is folded again). False,
    logged, when it could not be written: the old entry stays and no longer matches
    either."""
    path = os.path.join(directory, name)
    try:
        data = encode_recorded(recorded)
        try:
            fd = os.open(path, _WRITE_FLAGS, 0o666)
        except FileNotFoundError:
            directory.mkdir(exist_ok=True)
            fd = os.open(path, _WRITE_FLAGS, 0o666)
        try:
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError("short write")
        finally:
            os.close(fd)
    except (OSError, ValueError):
        logger.warning("could not write the due index entry %s", name, exc_info=True)
        return False
    return True


__all__ = [
    "DUE_DIRECTORY", "DUE_SUFFIX", "ENTRY_BYTES", "Recorded", "decode_recorded", "due_of",
    "due_page", "encode_recorded", "read_recorded", "write_recorded",
]
