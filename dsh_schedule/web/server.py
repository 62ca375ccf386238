"""Serving the web console: uvicorn on a socket bound before it starts (so ``--port 0``
names the port it got), in the main thread for ``dsh-schedule web`` or in a thread of
its own (tests, embedding).

Stopping — SIGINT/SIGTERM in the main thread, or ``stop()`` — ends the live streams
first, so the server's graceful shutdown does not wait for browsers to hang up; then the
console's host disposes of its agents (their logs keep every reminder).

A connection is not held for a client that does not finish its request: uvicorn closes
one idle after a response within ``KEEP_ALIVE_S``, and ``_BoundedH11`` closes one that has
not sent a whole request (headers and body) within ``REQUEST_READ_S`` of opening or of
its previous response, however slowly it trickles bytes (uvicorn has no such bound).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from types import FrameType
from typing import Final

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from dsh_schedule.web.access import Access, LoginLimit
from dsh_schedule.web.app import create_app
from dsh_schedule.web.console import Console

DEFAULT_PORT: Final = 8321
BACKLOG: Final = 128
GRACEFUL_S: Final = 3  # the longest a shutdown waits for requests in flight
KEEP_ALIVE_S: Final = 5  # an idle connection after a response is closed after this
REQUEST_READ_S: Final = 10.0  # a request not wholly received after this closes its connection


class _BoundedH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose client has not sent a whole
    request within ``request_read_s`` (a class attribute, set per server) of the
    connection opening or of the previous response completing."""

    request_read_s: float = REQUEST_READ_S
    _read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_read_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._cancel_read_deadline()  # the whole request is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_read_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_deadline()
        super().connection_lost(exc)

    def _arm_read_deadline(self) -> None:
        self._cancel_read_deadline()
        self._read_deadline = self.loop.call_later(self.request_read_s, self._read_too_slow)

    def _cancel_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_too_slow(self) -> None:
        self._read_deadline = None
        if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            return
        if not self.transport.is_closing():
            self.transport.close()


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
                 token: str | None = None, allow_remote: bool = False,
                 login_limit: LoginLimit | None = None,
                 request_read_s: float = REQUEST_READ_S) -> None:
        self.console = console
        self.access = Access(bind=host, allowed_hosts=tuple(allowed_hosts), token=token,
                             allow_remote=allow_remote)
        self.access.check()
        self.socket = _bind(host, port)
        protocol = type("BoundedH11", (_BoundedH11,), {"request_read_s": request_read_s})
        config = uvicorn.Config(
            create_app(console, access=self.access, port=self.port, login_limit=login_limit),
            log_config=None, access_log=False, lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_S, server_header=False,
            http=protocol, timeout_keep_alive=KEEP_ALIVE_S,
        )
        self.server = _Server(config, console)

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
        """Run until SIGINT or SIGTERM (``handle_exit``: in the main thread, uvicorn's
        signal handlers call it)."""
        self.console.start()
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.console.stop()
            self.socket.close()
