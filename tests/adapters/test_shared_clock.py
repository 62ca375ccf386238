"""The clock every process shares (docs/decisions.md#one-clock-for-every-decision): Redis's
``TIME``, carried on the monotonic clock, never ahead of Redis and never going back; it
fails closed until first read; a skewed wall clock is said once, in the log, the gauge and
``health``, and changes no reading."""

from __future__ import annotations

import logging

import pytest
import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.clock import (
    REFRESH_S,
    RETRY_S,
    SharedClock,
    skew_note,
    skewed_processes,
)
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.settings import Settings


class Monotonic:
    """An injected monotonic clock that moves only when advanced."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _clock(client: redis.Redis, *, skew_ms: int = 0, name: str = "p1",
           monotonic: Monotonic | None = None) -> SharedClock:
    wall = lambda: _server_ms(client) + skew_ms  # noqa: E731
    return SharedClock(client, Keys("c:"), wall=wall, monotonic=monotonic or Monotonic(),
                       name=name)


def test_a_reading_is_redis_time_carried_on_the_monotonic_clock(
    redis_client: redis.Redis
) -> None:
    # given a clock on an injected monotonic clock, read once
    monotonic = Monotonic()
    clock = _clock(redis_client, monotonic=monotonic)
    before = _server_ms(redis_client)
    first = clock()
    after = _server_ms(redis_client)
    # then it read Redis's clock, never ahead of it
    assert before <= first <= after
    # when the monotonic clock moves on 2.5 s (no further round trip before REFRESH_S)
    monotonic.now += 2.5
    # then the reading moves with it
    assert clock() == first + 2500


def test_a_reading_never_goes_back_and_is_measured_again_after_refresh_s(
    redis_client: redis.Redis
) -> None:
    # given a clock read once, whose monotonic clock then runs 30 s fast
    monotonic = Monotonic()
    clock = _clock(redis_client, monotonic=monotonic)
    first = clock()
    monotonic.now += 30
    fast = clock()
    assert fast == first + 30_000
    # when REFRESH_S has passed on it, and the clock measures Redis's again
    monotonic.now += REFRESH_S
    again = clock()
    # then the new measurement is Redis's time, yet no reading goes below one handed out
    assert clock._base is not None and clock._base[0] < first + 30_000
    assert again >= fast


def test_it_fails_closed_until_redis_has_answered_once() -> None:
    # given a Redis that is not there
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    clock = SharedClock(gone, Keys("c:"), monotonic=Monotonic())
    # then no reading is made up from the wall clock
    with pytest.raises(redis.ConnectionError):
        clock()
    with pytest.raises(redis.ConnectionError):
        clock()  # and every reading fails while it was never measured


def test_a_failed_later_measurement_keeps_the_last_one(redis_client: redis.Redis) -> None:
    # given a clock measured once
    monotonic = Monotonic()
    clock = _clock(redis_client, monotonic=monotonic)
    first = clock()
    # when Redis cannot be reached at the next measurement
    clock._client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monotonic.now += REFRESH_S
    # then the reading carries the last measurement on, and it tries again only later
    assert clock() == first + int(REFRESH_S * 1000)
    monotonic.now += RETRY_S / 2
    assert clock() == first + int((REFRESH_S + RETRY_S / 2) * 1000)


def test_a_skewed_wall_clock_is_said_once_and_changes_no_reading(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = metrics.enable()
    try:
        # given a process whose wall clock is 30 s ahead of Redis's
        monotonic = Monotonic()
        clock = _clock(redis_client, skew_ms=30_000, monotonic=monotonic)
        # when it reads the clock, and measures again twice
        with caplog.at_level(logging.WARNING):
            before = _server_ms(redis_client)
            reading = clock()
            for _ in range(2):
                monotonic.now += REFRESH_S
                clock()
        # then the reading is Redis's, the skew said once in the log and set on the gauge
        assert before <= reading <= _server_ms(redis_client)
        warnings = [r for r in caplog.records if "off Redis's clock" in r.getMessage()]
        assert len(warnings) == 1, caplog.text
        gauge = recorder.registry.get_sample_value("dsh_schedule_clock_skew_seconds")
        assert gauge is not None and 29 < gauge < 31
        # and health can name it
        skewed = skewed_processes(redis_client, Keys("c:"), now_ms=_server_ms(redis_client))
        assert list(skewed) == ["p1"] and 29_000 < skewed["p1"] < 31_000
        assert "p1 +30" in skew_note(redis_client, Keys("c:"),
                                     now_ms=_server_ms(redis_client))
    finally:
        metrics.disable()


def test_a_clock_back_within_the_bound_leaves_the_report(redis_client: redis.Redis) -> None:
    # given a process that reported a skew of 5 s
    monotonic = Monotonic()
    skew = [5_000]
    wall = lambda: _server_ms(redis_client) + skew[0]  # noqa: E731
    clock = SharedClock(redis_client, Keys("c:"), wall=wall, monotonic=monotonic, name="p2")
    clock()
    assert list(skewed_processes(redis_client, Keys("c:"), now_ms=clock())) == ["p2"]
    # when its clock is fixed and it measures again
    skew[0] = 0
    monotonic.now += REFRESH_S
    clock()
    # then no process is reported skewed, and health says nothing of clocks
    assert skewed_processes(redis_client, Keys("c:"), now_ms=clock()) == {}
    assert skew_note(redis_client, Keys("c:"), now_ms=clock()) == ""


def test_a_report_of_a_process_gone_long_ago_is_not_named(redis_client: redis.Redis) -> None:
    clock = _clock(redis_client, skew_ms=-90_000, name="gone")
    clock()
    later = _server_ms(redis_client) + int(3 * REFRESH_S * 1000) + 1000
    assert skewed_processes(redis_client, Keys("c:"), now_ms=later) == {}


def test_the_bound_is_a_setting() -> None:
    settings = Settings.from_env({"DSH_SCHEDULE_MAX_CLOCK_SKEW": "2.5"})
    assert settings.max_clock_skew_s == 2.5
    coordination = Coordination(redis.Redis(host="127.0.0.1", port=1), settings)
    assert coordination.clock._max_skew_ms == 2500
