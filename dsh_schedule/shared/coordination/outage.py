"""Riding out a Redis outage: capped exponential backoff, one line down, one line back.

Every long-running process (worker, scheduler, host bridge, reference host) keeps running
through an outage. It tells the operator once when Redis goes away and once when it is
back, never a traceback per retry (docs/architecture.md#outages). Every failed attempt
counts in ``dsh_schedule_redis_errors_total`` (docs/architecture.md#operations).

An outage is not only a lost connection: a Redis that answers but refuses the command for
an operational reason (out of memory under ``noeviction``, a replica after a failover,
too few replicas, loading its data, a busy script, a failed snapshot) is one too
(``is_outage``), and so is a blocking call Redis ended because it stopped being a master.

A disk under the session store that cannot take writes (full, read-only) is an outage of
the same shape for the processes that write session logs (``DiskOutage``).

A Redis that refuses our credentials (``is_auth_failure``) is retried the same way, since
the password may be corrected on either side, but it is a mistake to fix, not weather: the
process says "authentication failed" at ERROR once a minute while it lasts, and a bounded
wait gives up at once (``RedisAuthFailed``).
"""

from __future__ import annotations

import errno
import logging
import re
import time
from collections.abc import Callable
from typing import ClassVar, Final

import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.core.errors import ScheduleError, disk_outage_errno, outage_said

FIRST_DELAY_S: Final = 0.1
MAX_DELAY_S: Final = 5.0
# How often a process repeats that Redis refuses its credentials, while it does.
AUTH_REPEAT_S: Final = 60.0
AUTH_HINT: Final = "check the user and password in the Redis URL"

# The error replies a healthy deployment meets in an ordinary week: each says "not now",
# never "this command is wrong". redis-py strips the code from some of them (OOM,
# READONLY, LOADING, MASTERDOWN, TRYAGAIN get classes of their own) and keeps it at the
# start of the message for the others. UNBLOCKED is what a client blocked in BLPOP or XREAD
# gets when its Redis is turned into a replica (a failover).
OUTAGE_REPLY_CODES: Final = frozenset({
    "OOM", "READONLY", "NOREPLICAS", "LOADING", "MASTERDOWN", "BUSY", "MISCONF",
    "TRYAGAIN", "CLUSTERDOWN", "UNBLOCKED",
})
_OUTAGE_REPLY_CLASSES: Final = (
    redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
)
_REPLY_CODE: Final = re.compile(r"(?:^|[\s:-])([A-Z]{3,11}) ")


# The replies of a Redis that refuses our credentials; redis-py raises most of them as
# AuthenticationError, and a Redis before 6 answers AUTH with a user by an arity error.
_AUTH_REPLY: Final = re.compile(
    r"^(?:WRONGPASS|NOAUTH|(?:ERR )?invalid (?:password|username-password)"
    r"|ERR wrong number of arguments for 'auth')")


def is_auth_failure(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis refused our credentials (a wrong or missing password
    or user)."""
    if isinstance(exc, redis.exceptions.AuthenticationError | RedisAuthFailed):
        return True
    return isinstance(exc, redis.ResponseError) and _AUTH_REPLY.match(str(exc)) is not None


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis cannot serve us now (lost, slow, refusing for an
    operational reason, or refusing our credentials) rather than that the command itself
    is wrong. Catch ``redis.RedisError`` and re-raise what this says is not an outage."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | RedisUnavailable):
        return True  # BusyLoadingError (LOADING), MaxConnectionsError, AuthenticationError
    if is_auth_failure(exc):
        return True
    if isinstance(exc, _OUTAGE_REPLY_CLASSES):
        return True
    if isinstance(exc, redis.ResponseError):
        # An older Redis wraps the reply of a call inside a script in its own text.
        return any(code in OUTAGE_REPLY_CODES for code in _REPLY_CODE.findall(str(exc)))
    return False


class RedisUnavailable(ScheduleError, ConnectionError):
    """Redis did not answer within the wait a command allows."""

    def __init__(self, waited_s: float) -> None:
        self.waited_s = waited_s
        super().__init__(f"Redis did not answer within {waited_s:g} s")


class RedisAuthFailed(ScheduleError, ConnectionError):
    """Redis refused our credentials while a command waited for it to answer."""

    def __init__(self) -> None:
        super().__init__(f"Redis authentication failed ({AUTH_HINT})")


class Outage:
    """Tracks whether Redis is reachable for one loop and paces its retries."""

    resource: ClassVar[str] = "Redis"

    def __init__(self, logger: logging.Logger, what: str, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._clock = clock
        self._down_since: float | None = None
        self._delay = FIRST_DELAY_S
        self._auth_said: float | None = None
        self._quiet = False

    def failed(self, exc: BaseException) -> float:
        """Record a failed attempt; the delay before the next one (capped, doubling)."""
        self._count()
        refused = is_auth_failure(exc)
        if refused:
            self._refused()
        if self._down_since is None:
            self._down_since = self._clock()
            self._delay = FIRST_DELAY_S
            # An outage the session store said itself is not said twice.
            self._quiet = outage_said(exc)
            if not refused and not self._quiet:
                self._log.warning("%s: %s unavailable (%s); retrying", self._what,
                                  self.resource, self._cause(exc))
        else:
            self._delay = min(self._delay * 2, MAX_DELAY_S)
        return self._delay

    def _refused(self) -> None:
        """Say at ERROR, once a minute while it lasts, that Redis refused our credentials."""
        now = self._clock()
        if self._auth_said is not None and now - self._auth_said < AUTH_REPEAT_S:
            return
        self._auth_said = now
        self._log.error("%s: Redis authentication failed (%s); retrying", self._what,
                        AUTH_HINT)

    def succeeded(self) -> bool:
        """Record a successful attempt; True when this ends an outage."""
        if self._down_since is None:
            return False
        if not self._quiet:
            self._log.warning("%s: %s is back after %.1f s", self._what, self.resource,
                              self._clock() - self._down_since)
        self._down_since = None
        self._delay = FIRST_DELAY_S
        self._auth_said = None
        return True

    def _count(self) -> None:
        metrics.get().redis_error()

    def _cause(self, exc: BaseException) -> str:
        return type(exc).__name__


class DiskOutage(Outage):
    """``Outage`` for the disk under the session store: one line when writes start to
    fail for want of space or a writable disk (``disk_outage_errno``), one when a write
    succeeds again, the same backoff between tries."""

    resource: ClassVar[str] = "session store"

    def _count(self) -> None:
        pass  # not a Redis error

    def _cause(self, exc: BaseException) -> str:
        code = disk_outage_errno(exc)
        return errno.errorcode.get(code, type(exc).__name__) if code else type(exc).__name__


def wait_for_redis(
    client: redis.Redis,
    *,
    wait_s: float | None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once Redis answers PING; ``RedisUnavailable`` after ``wait_s`` seconds
    (None waits for ever, logging once that it waits). ``RedisAuthFailed`` at once when
    the wait is bounded and Redis refuses our credentials; an unbounded wait retries,
    saying so at ERROR once a minute."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    outage = Outage(logging.getLogger(__name__), "startup")
    while True:
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            if isinstance(exc, redis.RedisError) and not is_outage(exc):
                raise
            if deadline is not None and is_auth_failure(exc):
                raise RedisAuthFailed() from None
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
