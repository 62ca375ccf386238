"""Every process a test run starts ends when the run ends, however it is stopped.

A pytest plugin (``tests/conftest.py`` loads it): while it is active, every
``subprocess.Popen`` made in the test process — by a test, a fixture, a helper such as
``tests.support.Processes`` or ``tests.redis_server.RedisServer``, or the project's own
code under test — is noted here, and

- a SIGTERM to pytest interrupts the run as Ctrl-C does (``KeyboardInterrupt``), so the
  fixtures' teardowns run;
- when the run ends (``pytest_unconfigure``, and at exit as a fallback) every noted child
  still running is resumed, sent SIGTERM, and killed if it has not exited within
  ``END_WAIT_S``;
- on Linux a child started from the main thread also gets SIGTERM from the kernel when
  the test process dies (``PR_SET_PDEATHSIG``), so even a run killed with SIGKILL leaves
  none behind. A child started from another thread does not: that thread may end long
  before the child should.
"""

from __future__ import annotations

import atexit
import ctypes
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import pytest

END_WAIT_S: Final = 5.0
_PR_SET_PDEATHSIG: Final = 1


def parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a pre-exec hook that makes the child get SIGTERM when the thread that
    started it dies (``prctl(PR_SET_PDEATHSIG)``); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return hook


PRE_EXEC: Final = parent_death_signal()

_started: list[subprocess.Popen[Any]] = []  # those not yet seen to exit
_original_init: Any = None


def _noting_init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    if (PRE_EXEC is not None and kwargs.get("preexec_fn") is None
            and threading.current_thread() is threading.main_thread()):
        kwargs["preexec_fn"] = PRE_EXEC  # only prctl(2) between fork and exec
    _original_init(self, *args, **kwargs)
    _started[:] = [proc for proc in _started if proc.returncode is None]
    _started.append(self)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """Note every child from now on, and make SIGTERM interrupt the run."""
    global _original_init
    if _original_init is None:
        _original_init = subprocess.Popen.__init__
        subprocess.Popen.__init__ = _noting_init  # type: ignore[method-assign]
        atexit.register(end_all)
    keep_sigterm()


def keep_sigterm() -> None:
    """SIGTERM interrupts the run again, should a test have put its own handler there
    (the commands run in-process install theirs)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def running() -> list[subprocess.Popen[Any]]:
    """The noted children that have not exited."""
    return [proc for proc in list(_started) if proc.poll() is None]


def end_all() -> None:
    """Resume, SIGTERM, and if need be SIGKILL every noted child still running."""
    alive = running()
    for proc in alive:
        for sig in (signal.SIGCONT, signal.SIGTERM):  # a stopped child cannot act on TERM
            try:
                proc.send_signal(sig)
            except OSError:
                pass
    deadline = time.monotonic() + END_WAIT_S
    for proc in alive:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _started.clear()


def pytest_configure(config: pytest.Config) -> None:
    install()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    keep_sigterm()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    end_all()
