"""The clock every process shares: Redis's own (docs/decisions.md#one-clock-for-every-decision).

Every decision about time that more than one process takes part in — the target of a
relative reminder, the mover, the due decision, lease expiry, the times the log records —
reads ``SharedClock``: Redis's ``TIME``, measured here once and then carried forward on
this process's monotonic clock, measured again every ``REFRESH_S``. The reading is the
server's time at the moment the reply arrived, which is never later than the server's
true time: a wake decided on it is never early by Redis's clock, whatever this machine's
wall clock says. No reading ever goes back.

It fails closed: until a first measurement succeeds the clock raises the ``RedisError``
that stopped it, so nothing is decided due on a guess (every caller already treats a
Redis error as an outage). A later failed measurement keeps the last one (the monotonic
clock carries it; a suspended machine reads late, never early), and is tried again after
``RETRY_S``.

Each measurement also compares this process's wall clock with Redis's. A difference
beyond ``max_skew_ms`` is said once (a warning; again only once it came back within the
bound and left it again), set on the ``dsh_schedule_clock_skew_seconds`` gauge, and left
in the ``clock-skew`` hash for ``health`` (``skewed_processes``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import msgspec
import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.coordination.keys import Keys

log = logging.getLogger(__name__)

REFRESH_S: Final = 60.0  # how often a process measures Redis's clock again
RETRY_S: Final = 5.0  # after a failed measurement, the next try waits this long
# A skew report older than this names a process that stopped measuring (gone).
REPORT_FRESH_MS: Final = int(3 * REFRESH_S * 1000)
# A wake or a re-arm counts a lease expired only this long after its expiry: two
# processes' readings of the shared clock differ by up to a round trip, and one that
# finds an agent not live must be sure its host's next renewal finds the lease expired
# too, and installs (and wakes) the agent again.
LIVE_SLACK_MS: Final = 1000


class SkewReport(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A process whose wall clock is off, as the ``clock-skew`` hash holds it."""

    skew_ms: int  # its wall clock minus Redis's
    at: int  # when it measured, by Redis's clock (epoch ms)


def process_name() -> str:
    """This process, for the skew report: its host name and pid."""
    return f"{socket.gethostname()} pid {os.getpid()}"


class SharedClock:
    """Redis's clock, in epoch milliseconds, read as a ``Clock`` (``clock()``)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        max_skew_ms: int = 1000,
        wall: Clock = wall_clock_ms,
        monotonic: Callable[[], float] = time.monotonic,
        name: str | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._max_skew_ms = max_skew_ms
        self._wall = wall
        self._monotonic = monotonic
        self.name = name or process_name()
        self._lock = threading.Lock()
        self._base: tuple[int, float] | None = None  # (server ms, monotonic s) at a reply
        self._next_measure = 0.0  # monotonic s
        self._last = 0  # the highest reading handed out
        self.skew_ms: int | None = None  # the last measured wall-clock skew
        self._said = False  # the skew beyond the bound has been said

    def __call__(self) -> int:
        """Now, by Redis's clock; the ``RedisError`` of a failed first measurement."""
        with self._lock:
            if self._base is None or self._monotonic() >= self._next_measure:
                self._measure()
            server_ms, at = self._measured()
            now = server_ms + int((self._monotonic() - at) * 1000)
            self._last = max(self._last, now)
            return self._last

    def _measured(self) -> tuple[int, float]:
        if self._base is None:  # unreachable: a failed first measurement raised
            raise redis.ConnectionError("Redis's clock has not been read")
        return self._base

    def _measure(self) -> None:
        try:
            sent = self._monotonic()
            seconds, micros = self._client.time()
            received = self._monotonic()
            wall = self._wall()
        except redis.RedisError:
            self._next_measure = self._monotonic() + RETRY_S
            if self._base is None:
                raise  # never measured: no guess
            return
        server_ms = int(seconds) * 1000 + int(micros) // 1000
        self._base = (server_ms, received)
        self._next_measure = received + REFRESH_S
        # The server read its clock somewhere in the round trip: take its middle.
        half_ms = (received - sent) * 500
        self._note_skew(round(wall - half_ms - server_ms), server_ms)

    def _note_skew(self, skew_ms: int, server_ms: int) -> None:
        was, self.skew_ms = self.skew_ms, skew_ms
        metrics.get().clock_skew(skew_ms / 1000)
        beyond = abs(skew_ms) > self._max_skew_ms
        try:
            if beyond:
                report = msgspec.json.encode(SkewReport(skew_ms=skew_ms, at=server_ms))
                self._client.hset(self._keys.clock_skew(), self.name, report)
            elif was is not None and abs(was) > self._max_skew_ms:
                self._client.hdel(self._keys.clock_skew(), self.name)
        except redis.RedisError:
            pass  # the report only; the next measurement writes it again
        if beyond and not self._said:
            self._said = True
            log.warning("this machine's clock is %+.1f s off Redis's clock (more than "
                        "%g s): every decision about time reads Redis's clock, but fix "
                        "the machine's clock (NTP)", skew_ms / 1000, self._max_skew_ms / 1000)
        elif not beyond and self._said:
            self._said = False
            log.info("this machine's clock is within %g s of Redis's clock again",
                     self._max_skew_ms / 1000)


def skewed_processes(client: redis.Redis, keys: Keys, *, now_ms: int) -> dict[str, int]:
    """The processes whose last measurement (within ``REPORT_FRESH_MS`` of ``now_ms``,
    Redis's clock) found their wall clock off by more than their bound: name -> skew ms."""
    found: dict[Any, Any] = client.hgetall(keys.clock_skew())
    skewed: dict[str, int] = {}
    for name, raw in found.items():
        try:
            report = msgspec.json.decode(raw, type=SkewReport)
        except msgspec.DecodeError:
            continue
        if now_ms - report.at <= REPORT_FRESH_MS:
            skewed[name.decode() if isinstance(name, bytes) else str(name)] = report.skew_ms
    return dict(sorted(skewed.items()))


def skew_note(client: redis.Redis, keys: Keys, *, now_ms: int) -> str:
    """``health``'s words on skewed clocks ('' when no process reports one): a warning,
    never a reason to be unhealthy, since every decision reads Redis's clock."""
    skewed = skewed_processes(client, keys, now_ms=now_ms)
    if not skewed:
        return ""
    named = ", ".join(f"{name} {ms / 1000:+.1f} s" for name, ms in skewed.items())
    return f"; clock skew off Redis's clock (decisions unaffected; fix NTP): {named}"
