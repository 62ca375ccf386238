"""The web console under test: an embedded console served on a free port from a thread,
Debian's Chromium for Playwright, and where screenshots go.

Playwright's own browser builds are never downloaded: the browser is the system's
``chromium`` (``DSH_SCHEDULE_CHROMIUM`` names another), which ``.ci/run`` installs with
apt when it is missing. A browser test fails, never skips, without it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.settings import Settings
from dsh_schedule.web.console import Console
from dsh_schedule.web.server import GRACEFUL_S, WebServer

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("DSH_SCHEDULE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
# Screenshots of the pages, kept after the run (git ignores the folder).
ARTIFACTS = Path(os.environ.get("DSH_SCHEDULE_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "web"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the browser tests need Debian's Chromium at {CHROMIUM} "
            "(apt-get install -y chromium; .ci/run installs it)", pytrace=False,
        )
    return {**browser_type_launch_args, "executable_path": str(CHROMIUM),
            "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@dataclass
class Served:
    """A console and the URL it answers at."""

    console: Console
    server: WebServer

    @property
    def url(self) -> str:
        return self.server.url

    def at(self, path: str) -> str:
        return self.server.url.rstrip("/") + path


def web_settings(root: Path, **overrides: Any) -> Settings:
    tag = uuid.uuid4().hex[:8]
    values: dict[str, Any] = {"sessions": root / "sessions", "prefix": f"web{tag}:",
                              "queue": f"web{tag}", **overrides}
    return Settings.from_env({}, **values)


@pytest.fixture
def embedded_env() -> dict[str, str]:
    """The environment of a command that names no Redis, sessions or token of its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """An embedded console (in-process Redis, worker and mover) on a free port."""
    yield from _served(web_settings(tmp_path))


@pytest.fixture
def served_off(tmp_path: Path) -> Iterator[Served]:
    """``served`` with the lifecycle off whatever the run's settings say
    (tests/switched.py)."""
    yield from _served(web_settings(tmp_path, lifecycle=False))


@contextmanager
def running(server: WebServer) -> Iterator[WebServer]:
    """``server.serve()`` in a thread of its own, back once it accepts requests, and ended
    at the block's end as SIGTERM ends the CLI's (``handle_exit``)."""
    thread = threading.Thread(target=server.serve, name="web-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the web console did not start")
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.server.handle_exit(signal.SIGTERM, None)
        thread.join(GRACEFUL_S + 30)


def _served(settings: Settings) -> Iterator[Served]:
    console = Console(settings)
    server = WebServer(console, port=0)
    with running(server):
        yield Served(console, server)


@pytest.fixture
def served_lifecycle(tmp_path: Path) -> Iterator[Served]:
    """An embedded console with the lifecycle on (``schedule_update`` offered)."""
    console = Console(web_settings(tmp_path, lifecycle=True))
    server = WebServer(console, port=0)
    with running(server):
        yield Served(console, server)


TOKEN = "test-token-0123456789abcdef"


@pytest.fixture
def served_with_token(tmp_path: Path) -> Iterator[Served]:
    """An embedded console on a free port that requires ``TOKEN`` on every request."""
    console = Console(web_settings(tmp_path))
    server = WebServer(console, port=0, token=TOKEN)
    with running(server):
        yield Served(console, server)
