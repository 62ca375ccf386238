"""Riding out a Redis outage: capped exponential backoff, one line down, one line back.

Every long-running process (worker, scheduler, host bridge, reference host) keeps running
through an outage. It tells the operator once when Redis goes away and once when it is
back, never a traceback per retry (docs/architecture.md#outages). Every failed attempt
counts in ``dsh_schedule_redis_errors_total`` (docs/architecture.md#operations).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.core.errors import ScheduleError

FIRST_DELAY_S: Final = 0.1
MAX_DELAY_S: Final = 5.0


class RedisUnavailable(ScheduleError, ConnectionError):
    """Redis did not answer within the wait a command allows."""

    def __init__(self, waited_s: float) -> None:
        self.waited_s = waited_s
        super().__init__(f"Redis did not answer within {waited_s:g} s")


class Outage:
    """Tracks whether Redis is reachable for one loop and paces its retries."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self._what = what
        self._down_since: float | None = None
        self._delay = FIRST_DELAY_S

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException) -> float:
        """Record a failed attempt; the delay before the next one (capped, doubling)."""
        metrics.get().redis_error()
        if self._down_since is None:
            self._down_since = time.monotonic()
            self._delay = FIRST_DELAY_S
            self._log.warning("%s: Redis unavailable (%s); retrying", self._what,
                              type(exc).__name__)
        else:
            self._delay = min(self._delay * 2, MAX_DELAY_S)
        return self._delay

    def succeeded(self) -> bool:
        """Record a successful attempt; True when this ends an outage."""
        if self._down_since is None:
            return False
        self._log.warning("%s: Redis is back after %.1f s", self._what,
                          time.monotonic() - self._down_since)
        self._down_since = None
        self._delay = FIRST_DELAY_S
        return True


def wait_for_redis(
    client: redis.Redis,
    *,
    wait_s: float | None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once Redis answers PING; ``RedisUnavailable`` after ``wait_s`` seconds
    (None waits for ever, logging once that it waits)."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    outage = Outage(logging.getLogger(__name__), "startup")
    while True:
        try:
            client.ping()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            delay = outage.failed(exc)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RedisUnavailable(wait_s or 0.0) from None
                delay = min(delay, left)
            sleep(delay)
            continue
        outage.succeeded()
        return
