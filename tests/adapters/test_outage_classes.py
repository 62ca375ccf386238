"""Which Redis failures are an outage to ride out, and which are a bug to raise
(docs/architecture.md#outages)."""

from __future__ import annotations

import errno
import logging
import os

import pytest
import redis
from redis._parsers.base import BaseParser

from dsh_schedule.shared.coordination.outage import (
    MAX_DELAY_S,
    Outage,
    RedisAuthFailed,
    RedisUnavailable,
    is_auth_failure,
    is_outage,
)
from dsh_schedule.shared.core.errors import PersistenceError, disk_outage_errno


@pytest.mark.parametrize(
    "reply",
    [
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write against a read only replica.",
        "NOREPLICAS Not enough good replicas to write.",
        "LOADING Redis is loading the dataset in memory",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "UNBLOCKED force unblock from blocking operation, instance state changed "
        "(master -> replica?)",
        "ERR Error running script (call to f_0): @user_script:1: -OOM command not allowed",
    ],
)
def test_an_error_reply_that_says_not_now_is_an_outage(reply: str) -> None:
    assert is_outage(BaseParser.parse_error(reply))


@pytest.mark.parametrize(
    "reply",
    [
        "ERR wrong number of arguments for 'set' command",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "BUSYKEY Target key name already exists.",
        "NOSCRIPT No matching script. Please use EVAL.",
        "ERR Error running script (call to f_0): @user_script:3: attempt to index a nil value",
    ],
)
def test_an_error_reply_that_says_the_command_is_wrong_is_not(reply: str) -> None:
    assert not is_outage(BaseParser.parse_error(reply))


def test_lost_and_slow_connections_are_outages_and_other_errors_are_not() -> None:
    assert is_outage(redis.ConnectionError("gone"))
    assert is_outage(redis.TimeoutError("slow"))
    assert is_outage(RedisUnavailable(5))
    assert not is_outage(ValueError("bad"))
    assert not is_outage(redis.DataError("bad argument"))


@pytest.mark.parametrize(
    ("code", "outage"),
    [(errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EROFS, True), (errno.EIO, True),
     (errno.ENOENT, False), (errno.EACCES, False)],
)
def test_a_full_or_read_only_disk_is_an_outage_and_a_missing_file_is_not(
    code: int, outage: bool
) -> None:
    try:
        try:
            raise OSError(code, os.strerror(code))
        except OSError as exc:
            raise PersistenceError("append to session 's1' failed") from exc
    except PersistenceError as wrapped:
        assert (disk_outage_errno(wrapped) == code) is outage
    assert disk_outage_errno(PersistenceError("session 's1' does not exist")) is None


@pytest.mark.parametrize(
    "reply",
    [
        "WRONGPASS invalid username-password pair or user is disabled.",
        "NOAUTH Authentication required.",
        "ERR invalid password",
    ],
)
def test_a_refused_password_is_an_authentication_failure_retried_as_an_outage(
    reply: str,
) -> None:
    refused = BaseParser.parse_error(reply)
    assert is_auth_failure(refused) and is_outage(refused)
    assert is_auth_failure(redis.ResponseError(reply))  # however a client version wraps it
    assert is_auth_failure(RedisAuthFailed())
    assert not is_auth_failure(redis.ConnectionError("gone"))
    assert not is_auth_failure(BaseParser.parse_error("NOPERM no permissions"))


def test_a_process_says_authentication_failed_at_error_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While Redis refuses the password the loop retries, saying why at ERROR once a
    minute; a refusal after Redis was back is said again at once."""
    now = [0.0]
    outage = Outage(logging.getLogger("test.auth"), "worker", clock=lambda: now[0])
    refused = BaseParser.parse_error("WRONGPASS invalid username-password pair")
    caplog.set_level(logging.INFO, logger="test.auth")
    for second in (0, 5, 30, 59.9, 60, 100, 119.9, 120.5):
        now[0] = second
        assert outage.failed(refused) <= MAX_DELAY_S
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3  # at 0, 60 and 120.5 s
    assert all(r.getMessage() == "worker: Redis authentication failed (check the user and "
               "password in the Redis URL); retrying" for r in errors)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert outage.succeeded()
    now[0] = 121.0
    outage.failed(refused)
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 4
