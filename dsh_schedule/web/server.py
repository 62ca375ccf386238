"""Serving the web console: uvicorn on a socket bound before it starts (so ``--port 0``
names the port it got), in the main thread for ``dsh-schedule web`` or in a thread of
its own (tests, embedding).

Stopping — SIGINT/SIGTERM in the main thread, or ``stop()`` — ends the live streams
first, so the server's graceful shutdown does not wait for browsers to hang up; then the
console's host disposes of its agents (their logs keep every reminder).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Final

import uvicorn

from dsh_schedule.web.access import Access
from dsh_schedule.web.app import create_app
from dsh_schedule.web.console import Console

DEFAULT_PORT: Final = 8321
BACKLOG: Final = 128
GRACEFUL_S: Final = 3  # the longest a shutdown waits for requests in flight


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, console: Console) -> None:
        super().__init__(config)
        self._console = console

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._console.closing = True  # live streams end within a poll
        super().handle_exit(sig, frame)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)  # connections wait in the backlog until the server starts
    except OSError:
        sock.close()
        raise
    return sock


class WebServer:
    """The console's app on ``host:port`` (port 0: any free port), answering the Host
    names ``allowed_hosts`` adds to those of the address, and, with a ``token``, only to
    requests that carry it (docs/web.md#access). ``AccessError`` before anything is bound
    for a way of serving that would leave it open: a non-loopback ``host`` without a
    token or ``allow_remote``."""

    def __init__(self, console: Console, *, host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, allowed_hosts: Sequence[str] = (),
                 token: str | None = None, allow_remote: bool = False) -> None:
        self.console = console
        self.access = Access(bind=host, allowed_hosts=tuple(allowed_hosts), token=token,
                             allow_remote=allow_remote)
        self.access.check()
        self.socket = _bind(host, port)
        config = uvicorn.Config(
            create_app(console, access=self.access, port=self.port),
            log_config=None, access_log=False, lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_S, server_header=False,
        )
        self.server = _Server(config, console)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        port: int = self.socket.getsockname()[1]
        return port

    @property
    def protection(self) -> str:
        """One line on who may use the console (the start-up line prints it)."""
        return self.access.protection(self.port)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def serve(self) -> None:
        """Run until SIGINT or SIGTERM (in the main thread) or ``stop()``."""
        self.console.start()
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.console.stop()
            self.socket.close()

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Serve from a thread of its own; returns once the server accepts requests."""
        self._thread = threading.Thread(target=self.serve, name="web-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the web console did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.console.closing = True
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(GRACEFUL_S + 30)
