"""Who the web console answers (docs/web.md#access, docs/decisions.md#the-web-consoles-access).

- **The Host header** names an address the console serves: the loopback names
  (``localhost``, ``127.0.0.1``, ``[::1]``, with the port it listens on) when it listens
  on a loopback or a wildcard address, the address it is bound to, and the names
  ``--allowed-host`` adds. Anything else — a page of another site whose name was made to
  resolve to this machine (DNS rebinding) — is answered 421 on every path.
- **A non-loopback bind** needs a token or ``--allow-remote``: the console has no
  accounts, so whoever reaches it reads every transcript and drives every session.
- **With a token** every request carries it: ``Authorization: Bearer TOKEN`` (scripts), or
  the cookie ``POST /login`` sets from a form (browsers). The cookie holds a keyed digest
  of the token, not the token. Sign-in attempts are limited per client address
  (``LoginLimit``), so the token cannot be guessed at the speed of the network.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final

from dsh_schedule.terminal import terminal_text

TOKEN_ENV: Final = "DSH_SCHEDULE_WEB_TOKEN"
MIN_TOKEN_CHARS: Final = 16
COOKIE: Final = "dsh_schedule_web"
LOGIN_PATH: Final = "/login"
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS: Final = frozenset({"", "0.0.0.0", "::", "[::]"})
DEFAULT_PORTS: Final = frozenset({80, 443})  # what a Host without a port may stand for
SHOWN_HOST_CHARS: Final = 80
_NAME: Final = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
_COOKIE_CONTEXT: Final = b"dsh-schedule web console cookie v1"
LOGIN_BURST: Final = 10  # sign-in attempts one address may make at once
LOGIN_REFILL_S: Final = 6.0  # then one more every this many seconds (10 a minute)
LOGIN_ADDRESSES: Final = 10_000  # addresses remembered at most, the least recent forgotten

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class AccessError(ValueError):
    """A way of serving the console that would leave it open: one line, for exit 2."""


def is_loopback(address: str) -> bool:
    """True when ``address`` (an IP, ``localhost`` or a name) reaches only this machine."""
    text = address.strip().strip("[]").lower().rstrip(".")
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(text, None)
    except (OSError, UnicodeError):
        return False
    return bool(found) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in found)


def _split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header (or an ``--allowed-host``) as a lower-case name and a port (None:
    none given); None when it is neither a host name nor an IP literal."""
    text = value.strip().lower()
    port_text: str | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        rest = text[end + 1 :]
        try:
            name = f"[{ipaddress.IPv6Address(text[1:end]).compressed}]"
        except ValueError:
            return None
        if rest:
            if not rest.startswith(":"):
                return None
            port_text = rest[1:]
    else:
        name, colon, after = text.partition(":")
        port_text = after if colon else None
        name = name.rstrip(".")
        if not _NAME.fullmatch(name):
            return None
    if port_text is None:
        return name, None
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) <= 65535:
        return None
    return name, int(port_text)


def _literal(address: str) -> str:
    """The address as a Host header names it (an IPv6 literal in brackets)."""
    text = address.strip().strip("[]").lower().rstrip(".")
    try:
        return f"[{ipaddress.IPv6Address(text).compressed}]"
    except ValueError:
        return text


@dataclass(frozen=True)
class Access:
    """How the console is served: where it is bound, the names it answers to, its token."""

    bind: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None
    allow_remote: bool = False
    loopback: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loopback", is_loopback(self.bind))

    def check(self) -> None:
        """AccessError for a way of serving the console that would leave it open or that
        names what it cannot match."""
        for name in self.allowed_hosts:
            if _split_host(name) is None:
                raise AccessError(
                    f"--allowed-host '{terminal_text(name)}' is not a host name or address "
                    "(NAME or NAME:PORT, e.g. console.internal or console.internal:8321)"
                )
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise AccessError(
                f"the token is {len(self.token)} characters; use at least "
                f"{MIN_TOKEN_CHARS} (e.g. python3 -c 'import secrets; "
                "print(secrets.token_urlsafe(24))')"
            )
        if not self.loopback and self.token is None and not self.allow_remote:
            raise AccessError(
                f"--bind {terminal_text(self.bind)} is not a loopback address, and the console "
                f"has no accounts: set a token (--token or {TOKEN_ENV}) or pass "
                "--allow-remote to serve it to everyone who can reach it (docs/web.md#access)"
            )

    def hosts(self, port: int) -> list[tuple[str, int | None]]:
        """The (name, port) pairs a Host header may name; port None: any port."""
        found: list[tuple[str, int | None]] = []
        if self.loopback or self.bind.strip().lower() in WILDCARDS:
            found += [(name, port) for name in LOOPBACK_NAMES]
        if self.bind.strip().lower() not in WILDCARDS:
            found.append((_literal(self.bind), port))
        for name in self.allowed_hosts:
            split = _split_host(name)
            if split is not None:
                found.append(split)
        return list(dict.fromkeys(found))

    def protection(self, port: int) -> str:
        """What the start-up line says about who may use the console."""
        names = ", ".join(f"{name}:{p}" if p is not None else f"{name} (any port)"
                          for name, p in self.hosts(port))
        if self.token is not None:
            who = (f"every request needs the token (Authorization: Bearer, or sign in at "
                   f"{LOGIN_PATH})")
        elif self.loopback:
            who = "no token: every local user and program can use it"
        else:
            who = ("no token (--allow-remote): WARNING: everyone who can reach this address "
                   "reads every session and can drive it")
        return f"answers to Host {names}; {who}"


class HostRule:
    """The Host names of one served port."""

    def __init__(self, access: Access, port: int) -> None:
        self.pairs = access.hosts(port)
        self.port = port

    def allows(self, header: str | None) -> bool:
        if header is None:
            return False
        split = _split_host(header)
        if split is None:
            return False
        name, port = split
        for allowed, allowed_port in self.pairs:
            if name != allowed:
                continue
            if allowed_port is None or port == allowed_port:
                return True
            if port is None and allowed_port in DEFAULT_PORTS:
                return True
        return False


def cookie_value(token: str) -> str:
    """What the sign-in cookie holds: a keyed digest of the token (a changed token
    signs every browser out)."""
    return hmac.new(token.encode("utf-8"), _COOKIE_CONTEXT, hashlib.sha256).hexdigest()


def token_matches(token: str, offered: str) -> bool:
    return hmac.compare_digest(token.encode("utf-8"), offered.encode("utf-8", "replace"))


class AccessGuard:
    """ASGI middleware in front of every route (static files included): the Host check,
    then the token."""

    def __init__(self, app: Asgi, *, access: Access, port: int,
                 unauthorized: Callable[[Scope], Asgi]) -> None:
        self.app = app
        self.rule = HostRule(access, port)
        self.token = access.token
        self.cookie = None if access.token is None else cookie_value(access.token)
        self.unauthorized = unauthorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        host = headers.get("host")
        if not self.rule.allows(host):
            await _plain(421, _misdirected(host, self.rule))(scope, receive, send)
            return
        if self.token is not None and scope["path"] != LOGIN_PATH and not self._carries(headers):
            await self.unauthorized(scope)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _carries(self, headers: dict[str, str]) -> bool:
        assert self.token is not None and self.cookie is not None
        scheme, _, offered = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_matches(self.token, offered.strip()):
            return True
        return any(hmac.compare_digest(value.encode(), self.cookie.encode())
                   for value in _cookies(headers.get("cookie", ""), COOKIE))


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the last of a repeated one; a repeated
    Host is refused by the server before it gets here)."""
    return {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
            for k, v in scope.get("headers", [])}


def _cookies(header: str, name: str) -> list[str]:
    found = []
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            found.append(value.strip().strip('"'))
    return found


def _misdirected(host: str | None, rule: HostRule) -> str:
    if host is None:
        shown = "no Host header"
    else:
        cut = host[:SHOWN_HOST_CHARS]
        shown = f"Host '{terminal_text(cut)}'{'…' if len(host) > len(cut) else ''}"
    return (f"refused: {shown} is not a name this console answers to (it listens on port "
            f"{rule.port}; --allowed-host NAME adds a name, docs/web.md#access)\n")


def _plain(status: int, text: str, headers: dict[str, str] | None = None) -> Asgi:
    body = text.encode("utf-8")

    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                 for k, v in (headers or {}).items()]
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
            *extra,
        ]})
        await send({"type": "http.response.body", "body": body})

    return respond


def refused_without_token() -> Asgi:
    """The answer to a request without the token that is no page a browser shows."""
    return _plain(401, "refused: this console needs its token (Authorization: Bearer TOKEN, "
                  f"or sign in at {LOGIN_PATH}; docs/web.md#access)\n",
                  {"WWW-Authenticate": 'Bearer realm="dsh-schedule web"'})


class LoginLimit:
    """A token bucket per client address for ``POST /login``: ``burst`` attempts at once,
    then one every ``refill_s`` seconds. At most ``remembered`` addresses are kept (the
    least recently seen forgotten first, which only ever lets an address try sooner).
    Used from the server's event loop only."""

    def __init__(self, *, burst: int = LOGIN_BURST, refill_s: float = LOGIN_REFILL_S,
                 remembered: int = LOGIN_ADDRESSES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self._remembered = remembered
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, address: str) -> float:
        """0.0 when ``address`` may try now (the try is counted); else how many seconds
        until it may."""
        now = self._clock()
        tokens, at = self._buckets.pop(address, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) / self.refill_s)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) * self.refill_s
        self._buckets[address] = (tokens, now)
        while len(self._buckets) > self._remembered:
            self._buckets.popitem(last=False)
        return wait
