"""One file system sync for a batch of session files (docs/architecture.md#session-logs).

A batched due transaction or delivery confirms many session files at once. ``fsync`` on
each costs a journal commit's worth of kernel work per file; one ``syncfs`` makes every
file of the file system durable for about the cost of one. It is used only where its
answer can be trusted:

- Linux 5.8 or later, where ``syncfs`` reports a write-back error of any file of the file
  system since the descriptor's last call (earlier kernels answer success regardless);
- a local file system known to implement it (ext4, xfs, btrfs, tmpfs);
- on a descriptor this process keeps open on the session directory from before its
  first write, so every error since then is reported to it once, whoever else saw it.

After a failure the store flushes file by file for good: the failure may concern any
file written before it, and only ``fsync`` on each file tells which (the per-file error
stays unseen by ``syncfs``). Write-back errors are rare and serious enough for that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import sys
import threading
import weakref
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

# statfs(2) f_type values of the file systems whose syncfs reports write-back errors.
TRUSTED_FILE_SYSTEMS: Final = {
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
}
MIN_KERNEL: Final = (5, 8)
_STATFS_BYTES: Final = 256  # larger than struct statfs on every Linux ABI


def kernel_version(release: str) -> tuple[int, int]:
    """Major and minor of a Linux release string ("6.1.0-18-amd64" -> (6, 1)); (0, 0) when
    it does not start with a number."""
    found = re.match(r"(\d+)(?:\.(\d+))?", release)
    if found is None:
        return (0, 0)
    return (int(found[1]), int(found[2] or 0))


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None


def file_system_type(path: Path, libc: ctypes.CDLL) -> int | None:
    """The statfs(2) ``f_type`` of the file system holding ``path`` (None: unknown).
    ``f_type`` is the first field of ``struct statfs``, a native word, on every ABI."""
    if not hasattr(libc, "statfs"):
        return None
    buffer = ctypes.create_string_buffer(_STATFS_BYTES)
    if libc.statfs(os.fsencode(path), buffer) != 0:
        return None
    return int(ctypes.c_long.from_buffer(buffer).value) & 0xFFFFFFFF


def why_not(path: Path, libc: ctypes.CDLL | None) -> str | None:
    """Why ``syncfs`` (of ``libc``, the C library) cannot confirm the files under ``path``
    here; None when it can."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if kernel_version(os.uname().release) < MIN_KERNEL:
        return f"Linux {os.uname().release} is older than 5.8"
    if libc is None or not hasattr(libc, "syncfs"):
        return "the C library has no syncfs"
    kind = file_system_type(path, libc)
    if kind not in TRUSTED_FILE_SYSTEMS:
        return "an unknown file system" if kind is None else f"file system type {kind:#x}"
    return None


class FileSystemSync:
    """``syncfs`` on a descriptor held open on a directory, for one store of a process.

    ``open()`` before the store's first write; ``sync()`` then makes every file of the file
    system durable at once, or says that the caller must ``fsync`` each of its files.
    Thread-safe: calls are made one at a time.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], FileSystemSync] | None = None  # if dropped
        self._libc: ctypes.CDLL | None = None
        self._unusable: str | None = None

    def open(self) -> bool:
        """Open the descriptor if ``syncfs`` can be trusted here (the first call decides;
        later calls only answer)."""
        with self._lock:
            if self._fd is not None:
                return True
            if self._unusable is not None:
                return False
            try:
                libc = _libc()
                reason = why_not(self._root, libc)
                if reason is None:
                    self._libc = libc
                    self._fd = os.open(self._root,
                                       os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                    self._closer = weakref.finalize(self, os.close, self._fd)
            except OSError as exc:
                reason = f"the directory cannot be opened ({exc.strerror})"
            if reason is not None:
                self._give_up(reason, logging.INFO)
                return False
            return True

    def sync(self) -> bool:
        """One ``syncfs``: True when every file written so far is durable; False when the
        caller must ``fsync`` each file to know (and every later call says False)."""
        with self._lock:
            if self._fd is None or self._libc is None:
                return False
            if self._libc.syncfs(self._fd) == 0:
                return True
            code = ctypes.get_errno()
            self._give_up(f"syncfs failed ({os.strerror(code)})", logging.WARNING)
            return False

    def _give_up(self, reason: str, level: int) -> None:
        self._unusable = reason
        self._release()
        log.log(level, "flushing session files one by one from now on: %s", reason)

    def _release(self) -> None:
        if self._closer is not None:
            self._closer()  # closes the descriptor, once
            self._closer = None
        self._fd = None

    def close(self) -> None:
        """Release the descriptor; every later call says False (a descriptor opened
        after writes would miss their errors)."""
        with self._lock:
            if self._unusable is None:
                self._unusable = "the store was closed"
            self._release()
