"""Confirming a batch of session files with one file system sync
(dsh_schedule.shared.store.syncfs, ``JsonlStore.flush_many``)."""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import NewEvent
from dsh_schedule.shared.settings import Settings, SettingsError
from dsh_schedule.shared.store import many, naming, syncfs
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.support import new_session

T0 = 1_764_579_600_000


class CountingStore(JsonlStore):
    """The JSONL store counting its syncs; ``fsync_fails`` names sessions whose fsync
    fails (by descriptor, noted when a flush opens them)."""

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.fsyncs = 0
        self.syncfs_calls = 0
        self.fsync_fails: set[int] = set()
        self.stats = 0

    def _stamp(self, session_id: str) -> tuple[int, ...]:
        self.stats += 1
        return super()._stamp(session_id)

    def _fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if os.fstat(fd).st_ino in self.fsync_fails:
            raise OSError(errno.EIO, "injected: fsync failed")
        super()._fsync(fd)

    def _syncfs(self) -> bool:
        self.syncfs_calls += 1
        return super()._syncfs()


def _append(store: JsonlStore, session_id: str) -> None:
    length = len(store.read(session_id).events)
    store.append(session_id, [NewEvent(type="user/message", time=T0,
                                       data={"content": []})], expected_seq=length)


def _sessions(store: CountingStore, n: int) -> list[str]:
    ids = [new_session(store, f"s{i}") for i in range(n)]
    for session_id in ids:
        _append(store, session_id)
    store.fsyncs = store.syncfs_calls = 0  # the creates' own
    return ids


class FailingLibc:
    """The C library with ``syncfs`` failing (``statfs`` is the real one)."""

    def __init__(self) -> None:
        real = ctypes.CDLL(None, use_errno=True)
        self.statfs = real.statfs
        self.calls = 0

    def syncfs(self, fd: int) -> int:
        self.calls += 1
        return -1


def test_here_syncfs_is_trusted() -> None:
    """The suite's temporary directories are on a file system syncfs serves; otherwise the
    tests below would test the fallback only."""
    assert syncfs.why_not(Path(tempfile.gettempdir()), syncfs._libc()) is None


def test_a_batch_of_changed_files_is_confirmed_by_one_syncfs(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    ids = _sessions(store, 5)

    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.fsyncs) == (1, 0)

    # Nothing changed since: neither a batch nor a single flush syncs again.
    assert many.flush(store, ids) == {}
    store.flush(ids[0])
    assert (store.syncfs_calls, store.fsyncs) == (1, 0)

    _append(store, ids[2])  # one changed file: the batch syncs for it alone
    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.fsyncs) == (2, 0)


def test_a_file_this_store_changed_is_confirmed_without_a_stat(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    ids = _sessions(store, 3)
    assert many.flush(store, ids) == {}
    for session_id in ids:
        _append(store, session_id)
    store.stats = 0

    # Its own appends left their stamps: one sync, and no stat.
    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.stats) == (2, 0)

    # Unchanged by this store since: whether another writer changed a file takes a stat.
    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.stats) == (2, 3)
    _append(JsonlStore(tmp_path), ids[1])
    assert many.flush(store, ids) == {}
    assert store.syncfs_calls == 3


def test_a_missing_session_fails_alone_and_the_others_are_confirmed(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    ids = _sessions(store, 3)

    failed = many.flush(store, [*ids, "gone"])

    assert list(failed) == ["gone"] and isinstance(failed["gone"], PersistenceError)
    assert store.syncfs_calls == 1
    assert many.flush(store, ids) == {} and store.syncfs_calls == 1  # confirmed


def test_a_failed_syncfs_falls_back_to_fsync_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libc = FailingLibc()
    monkeypatch.setattr(syncfs, "_libc", lambda: libc)
    store = CountingStore(tmp_path)
    ids = _sessions(store, 4)
    store.fsync_fails = {os.stat(store.path(ids[1])).st_ino}

    failed = many.flush(store, ids)

    # Each file answered for itself: the one whose fsync failed is told, the rest confirmed.
    assert list(failed) == [ids[1]]
    assert libc.calls == 1 and store.fsyncs == 4
    # From now on every batch flushes file by file, with no syncfs.
    store.fsync_fails = set()
    for session_id in ids:
        _append(store, session_id)
    assert many.flush(store, ids) == {}
    assert libc.calls == 1 and store.fsyncs == 8


def test_syncfs_off_flushes_each_file(tmp_path: Path) -> None:
    store = CountingStore(tmp_path, syncfs=False)
    ids = _sessions(store, 3)
    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.fsyncs) == (0, 3)


def test_a_store_from_settings_keeps_their_syncfs_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given settings that turn syncfs off, and the store the processes build from them
    env = {"DSH_SCHEDULE_SESSIONS": str(tmp_path), "DSH_SCHEDULE_SYNCFS": "off",
           "DSH_SCHEDULE_CACHE_MB": "3"}
    monkeypatch.setattr(naming, "JsonlStore", CountingStore)
    store = naming.store_from_settings(Settings.from_env(env))
    assert isinstance(store, CountingStore)
    ids = _sessions(store, 3)
    # then it flushes each file, and keeps its sessions within that budget
    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.fsyncs) == (0, 3)
    assert store.root == tmp_path
    assert store.cache_stats().budget_bytes == 3 * 1024 * 1024


def test_a_closed_store_flushes_each_file(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    ids = _sessions(store, 3)
    store.close()
    assert many.flush(store, ids) == {}
    assert store.fsyncs == 3


def test_an_untrusted_file_system_is_flushed_file_by_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(syncfs, "file_system_type", lambda path, libc: 0x6969)  # NFS
    assert syncfs.why_not(tmp_path, syncfs._libc()) == "file system type 0x6969"
    store = CountingStore(tmp_path)
    ids = _sessions(store, 3)
    assert many.flush(store, ids) == {}
    assert (store.syncfs_calls, store.fsyncs) == (0, 3)


@pytest.mark.parametrize(("release", "version"), [
    ("6.18.44-fc-v857", (6, 18)), ("5.8.0", (5, 8)), ("4.19.0-26-amd64", (4, 19)),
    ("5.10", (5, 10)), ("6", (6, 0)), ("garbage", (0, 0)), ("5.4rc2", (5, 4)),
])
def test_kernel_versions_are_read_from_the_release(release: str,
                                                   version: tuple[int, int]) -> None:
    assert syncfs.kernel_version(release) == version


def test_an_old_kernel_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.uname()
    fake = os.uname_result((real.sysname, real.nodename, "5.4.0-150-generic", real.version,
                            real.machine))
    monkeypatch.setattr(syncfs.os, "uname", lambda: fake)
    assert syncfs.why_not(tmp_path, syncfs._libc()) == "Linux 5.4.0-150-generic is older than 5.8"


def test_syncfs_is_a_setting() -> None:
    assert Settings.from_env({}).syncfs is True
    assert Settings.from_env({"DSH_SCHEDULE_SYNCFS": "off"}).syncfs is False
    assert Settings.from_env({"DSH_SCHEDULE_SYNCFS": "On"}).syncfs is True
    with pytest.raises(SettingsError, match="syncfs must be on or off"):
        Settings.from_env({"DSH_SCHEDULE_SYNCFS": "sometimes"})


def test_a_dropped_store_releases_its_descriptor(tmp_path: Path) -> None:
    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    JsonlStore(tmp_path)  # warm whatever the first store loads
    before = open_descriptors()
    gc.disable()  # the last reference is enough: a store is in no reference cycle
    try:
        for _ in range(50):
            store = JsonlStore(tmp_path)
            assert store.flush_many([]) == {}
            assert store.path("s1").name == "s1.jsonl"
            del store
        assert open_descriptors() <= before + 1
    finally:
        gc.enable()


def test_a_session_whose_fsync_failed_is_not_confirmed_by_a_batch_syncfs(
        tmp_path: Path) -> None:
    """Its unconfirmed lines are written again and fsynced on their own first: a syncfs
    after the failure could answer success without the pages the failure dropped."""
    # given a session whose fsync failed after an append, the append's bytes then lost
    store = CountingStore(tmp_path)
    ids = _sessions(store, 3)
    assert many.flush(store, ids) == {}
    path = store.path(ids[1])
    confirmed = path.stat().st_size
    _append(store, ids[1])
    written = path.read_bytes()
    store.fsync_fails.add(path.stat().st_ino)
    assert ids[1] in many.flush(store, [ids[1]])
    store.fsync_fails.clear()
    os.truncate(path, confirmed)  # the pages the failed fsync dropped
    store.fsyncs = store.syncfs_calls = 0
    # when the batch is flushed again
    assert many.flush(store, ids) == {}
    # then the session was written again and fsynced on its own
    assert store.fsyncs == 1
    assert path.read_bytes() == written
