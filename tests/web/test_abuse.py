"""The web console against abuse (docs/web.md#access): a browser's form post carrying the
sign-in cookie must say it comes from the console's own pages, sign-in attempts are
limited per client address, and a client that never finishes its request does not keep
its connection."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsh_schedule.web.access import COOKIE, LoginLimit, cookie_value
from dsh_schedule.web.console import Console
from dsh_schedule.web.server import WebServer
from tests.web.conftest import TOKEN, Served, running, web_settings
from tests.web.test_http import call

CLOSED_WITHIN_S = 20.0  # a generous bound on a 1 s read limit: only a held connection fails


def test_a_post_with_the_cookie_must_name_its_own_origin_or_referer(
        served_with_token: Served) -> None:
    served = served_with_token
    jar = {"Cookie": f"{COOKIE}={cookie_value(TOKEN)}"}
    own = served.url.rstrip("/")
    for headers in ({}, {"Referer": "http://elsewhere.example/page"},
                    {"Referer": "http://elsewhere.example/page", "Origin": own + "x"},
                    {"Referer": f"{own}/", "Origin": "null"}):
        status, _, body = call(served.at("/sessions"), {"id": "x", "timeZone": "UTC"},
                               {**jar, **headers})
        assert (status, body) == (403, "refused: a form of another site"), headers
    assert not served.console.exists("x")
    # Its own pages: the Referer alone (a browser that sends no Origin), or the Origin.
    status, _, _ = call(served.at("/sessions"), {"id": "by-referer", "timeZone": "UTC"},
                        {**jar, "Referer": f"{own}/session/s"})
    assert status == 303 and served.console.exists("by-referer")
    status, _, _ = call(served.at("/sessions"), {"id": "by-origin", "timeZone": "UTC"},
                        {**jar, "Origin": own})
    assert status == 303 and served.console.exists("by-origin")
    # A script with the token and neither header is no browser: answered.
    status, _, _ = call(served.at("/sessions"), {"id": "by-script", "timeZone": "UTC"},
                        {"Authorization": f"Bearer {TOKEN}"})
    assert status == 303 and served.console.exists("by-script")
    # The sign-in form itself follows the same rule (a Referer of another site).
    status, _, _ = call(served.at("/login"), {"token": TOKEN},
                        {"Referer": "http://elsewhere.example/"})
    assert status == 403


def test_a_post_without_the_cookie_from_another_sites_referer_is_refused(
        served: Served) -> None:
    served.console.create_session("s", "UTC")
    length = served.console.length("s")
    status, _, _ = call(served.at("/prompt/s"), {"text": "list"},
                        {"Referer": "http://elsewhere.example/"})
    assert status == 403 and served.console.length("s") == length


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Served]:
    """A console with a token whose sign-in allows 3 attempts, then one an hour."""
    console = Console(web_settings(tmp_path))
    server = WebServer(console, port=0, token=TOKEN,
                       login_limit=LoginLimit(burst=3, refill_s=3600))
    with running(server):
        yield Served(console, server)


def test_sign_in_attempts_past_the_limit_are_answered_429(limited: Served) -> None:
    own = {"Origin": limited.url.rstrip("/")}
    for _ in range(3):
        status, _, _ = call(limited.at("/login"), {"token": "wrong-token-0123456789"}, own)
        assert status == 401
    for token in ("wrong-token-0123456789", TOKEN):  # even the right one, until it refills
        status, headers, body = call(limited.at("/login"), {"token": token}, own)
        assert status == 429, body
        assert body.startswith("refused: too many sign-in attempts from this address")
        assert 3000 < int(headers["retry-after"]) <= 3600
        assert "set-cookie" not in {k.lower() for k in headers}
    # The other routes are not limited: a script with the token is answered.
    status, _, _ = call(limited.at("/api/status"), headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200


def test_the_sign_in_limit_is_a_token_bucket_per_address() -> None:
    now = [0.0]
    limit = LoginLimit(burst=2, refill_s=10.0, remembered=2, clock=lambda: now[0])
    assert [limit.take("a"), limit.take("a")] == [0.0, 0.0]
    assert limit.take("a") == pytest.approx(10.0)
    assert limit.take("b") == 0.0  # another address has its own bucket
    now[0] = 5.0
    assert limit.take("a") == pytest.approx(5.0)  # a refused try does not reset the refill
    now[0] = 10.0
    assert limit.take("a") == 0.0 and limit.take("a") == pytest.approx(10.0)
    limit.take("c")  # a third address: the least recent ("b") is forgotten
    assert limit.take("b") == 0.0 and limit.take("b") == 0.0


def _closed(sock: socket.socket, trickle: bytes | None) -> bool:
    """Whether the server closed ``sock`` within CLOSED_WITHIN_S while the client sent
    ``trickle`` (a header line) every 0.2 s."""
    deadline = time.monotonic() + CLOSED_WITHIN_S
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if trickle is not None:
                sock.sendall(trickle)
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:  # reset, or a broken pipe on the next send
            return True
    return False


def test_a_slow_or_idle_client_does_not_keep_its_connection(tmp_path: Path) -> None:
    """Slowloris: a request whose headers trickle in, a connection that sends nothing, and
    one left idle after a response are each closed; the console still answers."""
    console = Console(web_settings(tmp_path))
    server = WebServer(console, port=0, request_read_s=1.0)
    with running(server):
        host = f"127.0.0.1:{server.port}"
        slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        silent = socket.create_connection(("127.0.0.1", server.port))
        idle = socket.create_connection(("127.0.0.1", server.port))
        try:
            for sock in slow:
                sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n".encode())
            idle.sendall(f"GET /favicon.ico HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert idle.recv(65536).startswith(b"HTTP/1.1 200")
            assert all(_closed(sock, b"X-Slow: 1\r\n") for sock in slow)
            assert _closed(silent, None)
            assert _closed(idle, None)
        finally:
            for sock in [*slow, silent, idle]:
                sock.close()
        status, _, _ = call(server.url.rstrip("/") + "/api/status")
        assert status == 200
