"""The events of a session file at one length, held only in part
(docs/architecture.md#session-logs).

A store that caches a log keeps its last few events and, for everything before them,
the file offset of every ``MARK_EVERY``-th event. ``FileEvents`` is the ``Session.events``
such a store hands out: its length is the log's, the recent events come from memory and
an older one is read back from the file, ``MARK_EVERY`` lines at a time. The bytes of a
committed event never change while the file keeps its identity (appends only add, a
rollback or a torn-line cut only removes bytes after the last committed line), so the
reads need no lock; a file replaced since is refused, never read as this log.
"""

from __future__ import annotations

import itertools
import os
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import Event, EventSequence
from dsh_schedule.shared.store.codec import decode_event_line

MARK_EVERY: Final[int] = 64


def read_range(fd: int, start: int, stop: int) -> bytes:
    """Bytes ``start:stop`` of the file on ``fd`` (fewer at its end); OSError on failure."""
    parts: list[bytes] = []
    while start < stop:
        part = os.pread(fd, stop - start, start)
        if not part:
            break
        parts.append(part)
        start += len(part)
    return b"".join(parts)


class FileEvents(EventSequence):
    """The first ``length`` events of one session file, at most a few held in memory.

    ``marks[k]`` is the offset of event ``k * MARK_EVERY``, ``end`` the offset after event
    ``length - 1``; ``recent`` holds events ``recent_start`` up to ``length`` (the list
    may grow past ``length`` later: a view never looks beyond its own length). Item
    access outside ``recent`` reads the file: ``PersistenceError`` when it is gone or
    was replaced, ``ScheduleLogError`` when its bytes no longer hold this log.
    Thread-safe; the one chunk last read is kept for the walks the callers make.
    """

    __slots__ = (
        "_chunk",
        "_end",
        "_identity",
        "_length",
        "_marks",
        "_path",
        "_recent",
        "_recent_start",
        "_session_id",
    )

    def __init__(
        self,
        *,
        path: Path,
        session_id: str,
        identity: tuple[int, int] | None,
        length: int,
        end: int,
        marks: array[int],
        recent: list[Event],
        recent_start: int,
    ) -> None:
        self._path = path
        self._session_id = session_id
        self._identity = identity
        self._length = length
        self._end = end
        self._marks = marks
        self._recent = recent
        self._recent_start = min(recent_start, length)
        self._chunk: tuple[int, list[Event]] | None = None

    def __iter__(self) -> Iterator[Event]:
        index = 0
        while index < self._recent_start:
            number = index // MARK_EVERY
            chunk = self._read_chunk(number)  # not kept: a whole pass reads each chunk once
            stop = min(len(chunk), self._recent_start - number * MARK_EVERY)
            yield from itertools.islice(chunk, index - number * MARK_EVERY, stop)
            index = number * MARK_EVERY + stop
        yield from itertools.islice(
            self._recent, index - self._recent_start, self._length - self._recent_start
        )

    def __repr__(self) -> str:
        return f"FileEvents(length={self._length}, in_memory={self.in_memory})"

    @property
    def in_memory(self) -> int:
        """How many of the events are held in memory (the recent ones)."""
        return self._length - self._recent_start

    def _event(self, index: int) -> Event:
        if index >= self._recent_start:
            return self._recent[index - self._recent_start]
        number = index // MARK_EVERY
        cached = self._chunk  # one read of one attribute: another thread may replace it
        if cached is None or cached[0] != number:
            cached = (number, self._read_chunk(number))
            self._chunk = cached
        return cached[1][index - number * MARK_EVERY]

    def _read_chunk(self, number: int) -> list[Event]:
        """Events ``number * MARK_EVERY`` up to the next mark (or ``length``), from the file."""
        first = number * MARK_EVERY
        last = min(first + MARK_EVERY, self._length)
        start = self._marks[number]
        stop = self._marks[number + 1] if last < self._length else self._end
        data = self._read(start, stop)
        lines = data.split(b"\n")
        if len(lines) != last - first + 1 or lines[-1] != b"":
            raise PersistenceError(f"session {self._session_id!r} changed under a reader")
        return [decode_event_line(line, first + i) for i, line in enumerate(lines[:-1])]

    def _read(self, start: int, stop: int) -> bytes:
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise PersistenceError(f"session {self._session_id!r} is gone") from None
        except OSError as exc:
            raise PersistenceError(f"cannot read session {self._session_id!r}") from exc
        try:
            st = os.fstat(fd)
            current = (st.st_dev, st.st_ino) == self._identity and st.st_size >= stop
            data = read_range(fd, start, stop) if current else b""
        except OSError as exc:
            raise PersistenceError(f"cannot read session {self._session_id!r}") from exc
        finally:
            os.close(fd)
        if not current:
            raise PersistenceError(f"session {self._session_id!r} was replaced since it was read")
        return data
