"""Who the web console answers (docs/web.md#access): the Host header must name an address
it serves, on every route; a non-loopback bind needs a token or --allow-remote; with a
token every request carries it."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from dsh_schedule.web.access import COOKIE, Access, AccessError, HostRule, cookie_value
from tests.web.conftest import TOKEN, Served
from tests.web.test_command import end, start_web
from tests.web.test_http import call

# Every route, as (method, path, form): GET pages, fragments, streams, the JSON, a static
# file, and the two forms.
ROUTES = [
    ("GET", "/", None),
    ("GET", "/session/s", None),
    ("GET", "/operations", None),
    ("GET", "/operations/figures", None),
    ("GET", "/api/status", None),
    ("GET", "/stream/sessions", None),
    ("GET", "/stream/session/s", None),
    ("GET", "/static/console.css", None),
    ("GET", "/no-such-page", None),
    ("POST", "/sessions", {"id": "made", "timeZone": "UTC"}),
    ("POST", "/prompt/s", {"text": "remind me in 1 hour to stretch"}),
]
ROUTE_IDS = [f"{method} {path}" for method, path, _ in ROUTES]


def port_of(served: Served) -> int:
    return served.server.port


@pytest.mark.parametrize(("method", "path", "form"), ROUTES, ids=ROUTE_IDS)
@pytest.mark.parametrize("forged", ["evil.example:{port}", "evil.example", "localhost:1",
                                    "127.0.0.1.evil.example:{port}", "", "a b"])
def test_a_forged_host_is_refused_on_every_route(
        served: Served, method: str, path: str, form: dict[str, str] | None,
        forged: str) -> None:
    # given a session, and a request whose Host and Origin agree on another name (what a
    # page whose name was rebound to the loopback address sends)
    served.console.create_session("s", "UTC")
    length = served.console.length("s")
    host = forged.format(port=port_of(served))
    headers = {"Host": host, "Origin": f"http://{host}"}

    # when it is sent
    status, _, body = call(served.at(path), form, headers)

    # then it is refused before any route runs, and nothing changed
    assert status == 421, (status, body[:200])
    assert body.startswith("refused: Host ")
    assert "--allowed-host" in body
    assert "s" in served.console.store.sessions() and not served.console.exists("made")
    assert served.console.length("s") == length


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LocalHost", "[::1]",
                                  "[0:0:0:0:0:0:0:1]", "localhost."])
def test_the_loopback_names_with_the_port_are_answered(served: Served, name: str) -> None:
    host = f"{name}:{port_of(served)}"
    status, _, _ = call(served.at("/api/status"), headers={"Host": host})
    assert status == 200
    status, headers, _ = call(served.at("/sessions"), {"id": "ok", "timeZone": "UTC"},
                              {"Host": host, "Origin": f"http://{host}"})
    assert status == 303 and headers["location"] == "/session/ok"
    served.console.store.root.joinpath("ok.jsonl").unlink()


# (bind, --allowed-host, Host header, answered?) with the console on port 8321.
HOST_RULES = [
    ("127.0.0.1", (), "127.0.0.1:8321", True),
    ("127.0.0.1", (), "localhost:8321", True),
    ("127.0.0.1", (), "[::1]:8321", True),
    ("127.0.0.1", (), "localhost", False),  # no port: port 80, not this one
    ("127.0.0.1", (), "localhost:8322", False),
    ("127.0.0.1", (), "evil.example:8321", False),
    ("127.0.0.1", (), "localhost.evil.example:8321", False),
    ("127.0.0.1", (), "127.0.0.1@evil.example:8321", False),
    ("127.0.0.1", (), "[::1", False),
    ("::1", (), "[::1]:8321", True),
    ("localhost", (), "127.0.0.1:8321", True),
    ("127.0.0.1", ("console.internal",), "console.internal", True),  # behind a proxy
    ("127.0.0.1", ("console.internal",), "Console.Internal:9000", True),
    ("127.0.0.1", ("console.internal:8321",), "console.internal:8321", True),
    ("127.0.0.1", ("console.internal:8321",), "console.internal:9000", False),
    ("127.0.0.1", ("console.internal:443",), "console.internal", True),
    ("0.0.0.0", (), "localhost:8321", True),
    ("0.0.0.0", (), "192.0.2.7:8321", False),
    ("0.0.0.0", ("192.0.2.7",), "192.0.2.7:8321", True),
    ("0.0.0.0", ("console.internal",), "evil.example:8321", False),
    ("192.0.2.7", (), "192.0.2.7:8321", True),  # the bound address itself
    ("192.0.2.7", (), "localhost:8321", False),  # not served on loopback
    ("2001:db8::7", (), "[2001:db8:0::7]:8321", True),
]


@pytest.mark.parametrize(("bind", "allowed", "host", "answered"), HOST_RULES)
def test_the_host_rule(bind: str, allowed: tuple[str, ...], host: str, answered: bool) -> None:
    access = Access(bind=bind, allowed_hosts=allowed, allow_remote=True)
    assert HostRule(access, 8321).allows(host) is answered


# (bind, token, --allow-remote, refused?)
START_RULES = [
    ("127.0.0.1", None, False, False),
    ("localhost", None, False, False),
    ("::1", None, False, False),
    ("0.0.0.0", None, False, True),
    ("::", None, False, True),
    ("192.0.2.7", None, False, True),
    ("0.0.0.0", TOKEN, False, False),
    ("0.0.0.0", None, True, False),
    ("127.0.0.1", "too-short", False, True),
]


@pytest.mark.parametrize(("bind", "token", "allow_remote", "refused"), START_RULES)
def test_a_non_loopback_bind_needs_a_token_or_allow_remote(
        bind: str, token: str | None, allow_remote: bool, refused: bool) -> None:
    access = Access(bind=bind, token=token, allow_remote=allow_remote)
    if refused:
        with pytest.raises(AccessError):
            access.check()
    else:
        access.check()


@pytest.mark.parametrize("argv", [
    ["--bind", "0.0.0.0"],
    ["--bind", "::"],
    ["--bind", "0.0.0.0", "--token", "short"],
    ["--allowed-host", "a/b"],
])
def test_the_command_refuses_an_open_console_in_one_line_and_exit_2(
        argv: list[str], embedded_env: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dsh_schedule", "web", "--port", "0", *argv],
        env=embedded_env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsh-schedule: web: "), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("method", "path", "form"), ROUTES, ids=ROUTE_IDS)
def test_with_a_token_a_request_without_it_is_refused(
        served_with_token: Served, method: str, path: str, form: dict[str, str] | None) -> None:
    served = served_with_token
    served.console.create_session("s", "UTC")
    length = served.console.length("s")
    own = {"Origin": served.url.rstrip("/")}
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"},
                    {"Authorization": f"Basic {TOKEN}"},
                    {"Cookie": f"{COOKIE}={TOKEN}"},  # the token itself is not the cookie
                    {"Cookie": f"{COOKIE}={cookie_value(TOKEN + 'x')}"}):
        status, answer, body = call(served.at(path), form, {**own, **headers})
        assert status == 401, (headers, status, body[:200])
        assert "token" in body
        assert answer.get("www-authenticate", answer.get("WWW-Authenticate", "")).startswith(
            "Bearer")
    assert not served.console.exists("made") and served.console.length("s") == length


def test_with_a_token_the_header_or_the_sign_in_cookie_is_answered(
        served_with_token: Served) -> None:
    served = served_with_token
    own = {"Origin": served.url.rstrip("/")}
    status, _, _ = call(served.at("/api/status"), headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    status, _, body = call(served.at("/"), headers={"Accept": "text/html"})
    assert status == 401 and 'action="/login"' in body  # a browser gets the sign-in form
    assert str(served.console.settings.sessions) not in body  # it shows nothing else
    status, _, body = call(served.at("/login"), {"token": "wrong-token-0123456789"}, own)
    assert status == 401 and "not the console" in body

    status, headers, _ = call(served.at("/login"), {"token": TOKEN}, own)
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"]
    assert f"{COOKIE}={cookie_value(TOKEN)}" in cookie and TOKEN not in cookie
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    jar = {"Cookie": f"{COOKIE}={cookie_value(TOKEN)}"}
    status, headers, _ = call(served.at("/sessions"), {"id": "signed-in", "timeZone": "UTC"},
                              {**own, **jar})
    assert status == 303 and served.console.exists("signed-in")
    status, _, _ = call(served.at("/static/console.css"), headers=jar)
    assert status == 200
    # A sign-in form of another site is refused like every other form.
    status, _, _ = call(served.at("/login"), {"token": TOKEN},
                        {"Origin": "http://elsewhere.example"})
    assert status == 403


def test_the_command_says_how_it_is_protected(tmp_path: Path,
                                              embedded_env: dict[str, str]) -> None:
    env = {**embedded_env, "DSH_SCHEDULE_WEB_TOKEN": TOKEN}
    web = start_web(["--sessions", str(tmp_path / "sessions"), "--allowed-host",
                     "console.internal"], env, tmp_path / "web.log")
    try:
        assert web.proc.stdout is not None
        protection = web.proc.stdout.readline()
        port = urllib.parse.urlsplit(web.url).port
        assert protection.startswith(f"dsh-schedule web: answers to Host localhost:{port}, "
                                     f"127.0.0.1:{port}, [::1]:{port}")
        assert "console.internal (any port)" in protection
        assert "every request needs the token" in protection
        assert TOKEN not in web.banner + protection
        status, _, _ = call(web.at("/api/status"))
        assert status == 401
        status, _, _ = call(web.at("/api/status"), headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        status, _, _ = call(web.at("/api/status"), headers={
            "Authorization": f"Bearer {TOKEN}", "Host": f"evil.example:{port}"})
        assert status == 421
    finally:
        end(web)
