"""The JSONL store's index of next due moments, beyond the store contract: one entry file
per session under ``<root>/.due/`` that never changes a log's bytes, and entries that are
unreadable, copied-in logs and failed index writes are answered from the log."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.store.dueindex import (
    ENTRY_BYTES,
    Recorded,
    decode_recorded,
    encode_recorded,
)
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.port import DueEntry
from tests.adapters.test_store_contract import (
    EARLIER,
    WHEN,
    FaultyJsonlStore,
    at_create,
    header,
    message,
)


def test_the_index_never_changes_a_log_and_is_not_a_session(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    store.create(header("s1"))
    store.append("s1", [at_create("r1")], 0)
    before = store.path("s1").read_bytes()
    (tmp_path / ".due" / "s1.due").write_bytes(b"{torn")  # an unreadable entry
    # when
    assert store.due_index() == [DueEntry("s1", parse_instant(WHEN), 1)]
    # then: the log's bytes are as written; the index's directory is no session
    assert store.path("s1").read_bytes() == before
    assert store.sessions() == ["s1"]
    rewritten = (tmp_path / ".due" / "s1.due").read_bytes()
    assert b'"due":' + str(parse_instant(WHEN)).encode() in rewritten


def test_a_copied_in_log_is_folded_by_another_store(tmp_path: Path) -> None:
    # given: a log written elsewhere, copied in without its entry
    source = JsonlStore(tmp_path / "elsewhere")
    source.create(header("s1"))
    source.append("s1", [at_create("r1", when=EARLIER)], 0)
    target = JsonlStore(tmp_path / "here")
    target.create(header("s0"))
    shutil.copy(source.path("s1"), tmp_path / "here" / source.path("s1").name)
    # then
    assert JsonlStore(tmp_path / "here").due_index() == [
        DueEntry("s1", parse_instant(EARLIER), 1)]


def test_an_index_write_that_fails_leaves_the_append_and_the_answer_right(tmp_path: Path) -> None:
    # given: the index's directory cannot be made (a file holds its name)
    store = JsonlStore(tmp_path)
    (tmp_path / ".due").write_bytes(b"")
    store.create(header("s1"))
    # when: the append succeeds though its entry cannot be written
    store.append("s1", [at_create("r1"), message("hi")], 0)
    # then: the answer comes from the log
    assert store.due_index() == [DueEntry("s1", parse_instant(WHEN), 2)]
    assert len(store.read("s1").events) == 2


def test_a_session_made_after_a_kept_listing_is_found(tmp_path: Path) -> None:
    # given: a listing kept (the directory last changed long before it was taken)
    store = JsonlStore(tmp_path)
    store.create(header("s1"))
    store.append("s1", [at_create("r1")], 0)
    os.utime(tmp_path, ns=(0, 0))
    assert [e.session_id for e in store.due_index()] == ["s1"]
    # when: another session appears (the directory's modification time moves)
    store.create(header("s2"))
    store.append("s2", [at_create("r1")], 0)
    # then
    assert [e.session_id for e in store.due_index()] == ["s1", "s2"]


def test_a_fresh_store_answers_a_current_index_without_opening_a_log(tmp_path: Path) -> None:
    # given: the index written by one store (another process, before a restart)
    writer = JsonlStore(tmp_path)
    for i in range(20):
        writer.create(header(f"s{i}"))
        writer.append(f"s{i}", [at_create("r1")], 0)
    # when: a store that has read nothing pages through it
    reader = FaultyJsonlStore(tmp_path)
    entries = reader.due_index(limit=7) + reader.due_index(after="s7", limit=7)
    # then: no log was opened (escaped-id order: s0, s1, s10 ... s19, s2 ... s9)
    assert [e.session_id for e in entries] == ["s0", "s1", "s10", "s11", "s12", "s13", "s14",
                                               "s8", "s9"]
    assert reader.log_opens == 0


def test_a_scan_leaves_the_cache_as_it_found_it(tmp_path: Path) -> None:
    writer = JsonlStore(tmp_path)
    for i in range(5):
        writer.create(header(f"s{i}"))
        writer.append(f"s{i}", [at_create("r1")], 0)
    shutil.rmtree(tmp_path / ".due")
    reader = JsonlStore(tmp_path)
    # when: the scan folds every log
    assert len(reader.due_index()) == 5
    # then: it cached none of them
    assert reader.cache_stats().entries == 0


def test_an_entry_overwritten_halfway_is_folded_again(tmp_path: Path) -> None:
    # given: a current entry, and another entry for the same log (same stamp and length)
    # with a later due moment, written over its first half only (a write cut short, or
    # read while it was being made)
    store = JsonlStore(tmp_path)
    store.create(header("s1"))
    store.append("s1", [at_create("r1", when=EARLIER)], 0)
    path = tmp_path / ".due" / "s1.due"
    current = decode_recorded(path.read_bytes())
    assert current is not None and current.due_ms == parse_instant(EARLIER)
    later = encode_recorded(Recorded(parse_instant(WHEN), current.length, current.stamp))
    half = later.index(b'"stamp"')
    path.write_bytes(later[:half] + path.read_bytes()[half:])
    # then: the mix fails its check and the answer comes from the log, never later
    fresh = FaultyJsonlStore(tmp_path)
    assert fresh.due_index() == [DueEntry("s1", parse_instant(EARLIER), 1)]
    assert fresh.log_opens == 1


def test_an_entry_is_overwritten_in_place_at_one_size(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    store.create(header("s1"))
    store.append("s1", [at_create("r1")], 0)
    path = tmp_path / ".due" / "s1.due"
    inode = path.stat().st_ino
    store.append("s1", [at_create("r2", when=EARLIER)], 1)
    # then: the same file, at the fixed size, and nothing else in the directory
    assert path.stat().st_ino == inode
    assert path.stat().st_size == ENTRY_BYTES
    assert os.listdir(tmp_path / ".due") == ["s1.due"]
    recorded = decode_recorded(path.read_bytes())
    assert recorded is not None and recorded.due_ms == parse_instant(EARLIER)
