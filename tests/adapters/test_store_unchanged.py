"""The JSONL store does not open a session file that has not changed since it last read
or flushed it (one ``stat`` tells), and never misses a change that way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dsh_schedule.shared.core.events import NewEvent
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.support import new_session

T0 = 1_764_579_600_000


class CountingStore(JsonlStore):
    """The JSONL store counting how often it opens and locks a session file."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.opened = 0
        self.fsyncs = 0

    def _open_locked(self, session_id: str, flags: int, operation: int) -> Any:
        self.opened += 1
        return super()._open_locked(session_id, flags, operation)

    def _fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super()._fsync(fd)


def _note(i: int) -> NewEvent:
    return NewEvent(type="tool/result", time=T0 + i, data={"i": i})


def _texts(store: JsonlStore, session_id: str) -> list[Any]:
    return [event.data["i"] for event in store.read(session_id).events]


def test_an_unchanged_file_is_read_from_the_cache(tmp_path: Path) -> None:
    writer = JsonlStore(tmp_path)
    new_session(writer, "s1")
    writer.append("s1", [_note(0), _note(1)], expected_seq=0)
    reader = CountingStore(tmp_path)

    assert _texts(reader, "s1") == [0, 1] and reader.opened == 1
    _session, state = reader.load("s1")
    assert _texts(reader, "s1") == [0, 1] and reader.opened == 1
    assert state.active == ()

    # another store appends: the next read opens the file and sees it
    writer.append("s1", [_note(2)], expected_seq=2)
    assert _texts(reader, "s1") == [0, 1, 2] and reader.opened == 2
    assert _texts(reader, "s1") == [0, 1, 2] and reader.opened == 2


def test_after_its_own_append_the_store_reads_without_opening(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    new_session(store, "s1")
    store.append("s1", [_note(0)], expected_seq=0)
    opened = store.opened
    assert _texts(store, "s1") == [0] and store.opened == opened


def test_a_file_replaced_by_one_of_the_same_size_is_read_again(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    new_session(store, "s1")
    store.append("s1", [_note(1)], expected_seq=0)
    assert _texts(store, "s1") == [1]
    path = store.path("s1")
    copy = tmp_path / "copy"
    copy.write_bytes(path.read_bytes().replace(b'"i":1', b'"i":7'))
    os.replace(copy, path)  # same size and, possibly, the same times: another inode

    assert _texts(store, "s1") == [7]


def test_an_unchanged_file_is_not_flushed_or_opened_again(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    new_session(store, "s1")
    store.append("s1", [_note(0)], expected_seq=0)
    store.flush("s1")
    fsyncs = store.fsyncs
    store.flush("s1")
    assert store.fsyncs == fsyncs
    store.append("s1", [_note(1)], expected_seq=1)
    store.flush("s1")
    assert store.fsyncs == fsyncs + 1
