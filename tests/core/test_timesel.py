"""Absolute ``at`` targets and zone names (docs/architecture.md#time)."""

from __future__ import annotations

import importlib.resources
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.instant import (
    MAX_MS,
    MIN_MS,
    format_instant,
    parse_instant,
    to_datetime,
)
from dsh_schedule.shared.core.timesel import is_valid_zone, load_zone, resolve_at

NOW = parse_instant("2026-12-01T09:00:00.000Z")


def no_implicit_zone() -> str:
    raise AssertionError("the implicit zone must not be consulted")


def resolve(selector: Any, now_ms: int = NOW) -> str:
    return format_instant(resolve_at(selector, now_ms=now_ms, implicit_zone=no_implicit_zone))


def error_code(selector: Any, now_ms: int = NOW) -> str:
    with pytest.raises(ToolError) as caught:
        resolve_at(selector, now_ms=now_ms, implicit_zone=no_implicit_zone)
    return caught.value.code


def local(date: str, time: str, zone: str | None = None) -> dict[str, str]:
    selector = {"date": date, "time": time}
    if zone is not None:
        selector["time_zone"] = zone
    return selector


# ---------------------------------------------------------------- offset strings


@pytest.mark.parametrize(
    ("at", "expected"),
    [
        ("2027-03-28T09:30:00Z", "2027-03-28T09:30:00.000Z"),
        ("2027-03-28T09:30:00.5Z", "2027-03-28T09:30:00.500Z"),  # .S is tenths
        ("2027-03-28T09:30:00.05Z", "2027-03-28T09:30:00.050Z"),  # .SS is hundredths
        ("2027-03-28T09:30:00.123Z", "2027-03-28T09:30:00.123Z"),  # .SSS is milliseconds
        ("2027-03-28T09:30:00+05:30", "2027-03-28T04:00:00.000Z"),
        ("2027-03-28T09:30:00.7-05:30", "2027-03-28T15:00:00.700Z"),
        ("2027-03-28T09:30:00+00:00", "2027-03-28T09:30:00.000Z"),
        ("2027-03-28T09:30:00+23:59", "2027-03-27T09:31:00.000Z"),
        ("2027-03-28T09:30:00-23:59", "2027-03-29T09:29:00.000Z"),
        ("2028-02-29T12:00:00+01:00", "2028-02-29T11:00:00.000Z"),  # a leap day
        ("9999-12-31T23:59:59.999Z", "9999-12-31T23:59:59.999Z"),  # the last instant
        ("9999-12-31T23:59:59+01:00", "9999-12-31T22:59:59.000Z"),
    ],
)
def test_offset_string_identifies_one_instant(at: str, expected: str) -> None:
    # given a strict offset string / when it is resolved / then it names that UTC instant
    assert resolve(at) == expected


@pytest.mark.parametrize(
    "at",
    [
        "2027-03-28T09:30:00-00:00",  # -00:00 is rejected
        "0000-01-01T00:00:00Z",  # year 0000
        "2027-02-30T09:30:00Z",  # an impossible date
        "2027-02-29T09:30:00Z",  # not a leap year
        "2027-13-01T09:30:00Z",
        "2027-03-00T09:30:00Z",
        "2027-03-28T24:00:00Z",  # hour 24
        "2027-03-28T09:60:00Z",
        "2027-03-28T09:30:60Z",  # second 60
        "2027-03-28t09:30:00Z",  # lowercase t
        "2027-03-28T09:30:00z",  # lowercase z
        "2027-03-28 09:30:00Z",  # a space instead of T
        " 2027-03-28T09:30:00Z",
        "2027-03-28T09:30:00Z ",
        "2027-03-28T09:30:00Z\n",
        "2027-03-28T09:30:00 +01:00",
        "2027-03-28T09:30:00",  # no offset
        "2027-03-28T09:30Z",  # no seconds
        "2027-03-28T09:30:00.Z",
        "2027-03-28T09:30:00.1234Z",  # more than three fraction digits
        "2027-03-28T09:30:00,5Z",
        "2027-03-28T09:30:00+24:00",  # offset hour above 23
        "2027-03-28T09:30:00+05:60",  # offset minute above 59
        "2027-03-28T09:30:00+0530",
        "2027-03-28T09:30:00+05",
        "2027-3-28T09:30:00Z",
        "+2027-03-28T09:30:00Z",
        "２０２７-03-28T09:30:00Z",  # non-ASCII digits
        "2027-03-28",
        "",
    ],
)
def test_malformed_offset_string_is_invalid_rule(at: str) -> None:
    assert error_code(at) == "invalid_rule"


# ---------------------------------------------------------------- local objects


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (local("2027-03-28", "09:30:00", "UTC"), "2027-03-28T09:30:00.000Z"),
        (local("2027-01-15", "09:30:00", "Europe/Berlin"), "2027-01-15T08:30:00.000Z"),
        (local("2027-07-15", "09:30:00", "Europe/Berlin"), "2027-07-15T07:30:00.000Z"),
        (local("2027-07-15", "09:30:00.5", "Europe/Berlin"), "2027-07-15T07:30:00.500Z"),
        (local("2027-07-15", "09:30:00.25", "Europe/Berlin"), "2027-07-15T07:30:00.250Z"),
        (local("2027-07-15", "09:30:00.125", "Europe/Berlin"), "2027-07-15T07:30:00.125Z"),
        (
            local("2027-07-15", "09:30:00", "America/Argentina/Buenos_Aires"),
            "2027-07-15T12:30:00.000Z",
        ),
        (local("2027-07-15", "09:30:00", "Asia/Kolkata"), "2027-07-15T04:00:00.000Z"),
        # An overlap takes its first, earlier instant.
        (local("2027-11-07", "01:30:00", "America/New_York"), "2027-11-07T05:30:00.000Z"),
        (local("2027-10-31", "02:30:00", "Europe/Berlin"), "2027-10-31T00:30:00.000Z"),
        # Just before and just after a gap.
        (local("2027-03-28", "01:59:59.999", "Europe/Berlin"), "2027-03-28T00:59:59.999Z"),
        (local("2027-03-28", "03:00:00", "Europe/Berlin"), "2027-03-28T01:00:00.000Z"),
    ],
)
def test_local_time_in_an_explicit_zone(selector: dict[str, str], expected: str) -> None:
    assert resolve(selector) == expected


@pytest.mark.parametrize(
    ("selector", "now"),
    [
        (local("2027-03-28", "02:30:00", "Europe/Berlin"), NOW),
        (local("2027-03-28", "02:00:00", "Europe/Berlin"), NOW),
        (local("2027-03-14", "02:30:00", "America/New_York"), NOW),
        # A whole calendar day skipped by a date-line change.
        (
            local("2011-12-30", "12:00:00", "Pacific/Apia"),
            parse_instant("2011-01-01T00:00:00.000Z"),
        ),
    ],
)
def test_local_time_in_a_gap_is_invalid_rule(selector: dict[str, str], now: int) -> None:
    assert error_code(selector, now) == "invalid_rule"


@pytest.mark.parametrize(
    "selector",
    [
        {"date": "2027-03-28", "time": "09:30:00", "time_zone": "UTC", "offset": "+01:00"},
        {"date": "2027-03-28"},
        {"time": "09:30:00", "time_zone": "UTC"},
        {},
        {"date": 20270328, "time": "09:30:00", "time_zone": "UTC"},
        {"date": "2027-03-28", "time": None, "time_zone": "UTC"},
        {"date": "2027-03-28", "time": "09:30:00", "time_zone": None},
        {"date": "2027-03-28", "time": "09:30:00", "time_zone": 1},
        local("2027-02-30", "09:30:00", "UTC"),
        local("0000-01-01", "09:30:00", "UTC"),
        local("2027-3-28", "09:30:00", "UTC"),
        local("2027-03-28T", "09:30:00", "UTC"),
        local("2027-03-28", "24:00:00", "UTC"),
        local("2027-03-28", "09:30:60", "UTC"),
        local("2027-03-28", "09:30", "UTC"),
        local("2027-03-28", "09:30:00Z", "UTC"),
        local("2027-03-28", "09:30:00+01:00", "UTC"),
        local("2027-03-28", "09:30:00.1234", "UTC"),
        local("2027-03-28", " 09:30:00", "UTC"),
    ],
)
def test_malformed_local_object_is_invalid_rule(selector: dict[str, Any]) -> None:
    assert error_code(selector) == "invalid_rule"


@pytest.mark.parametrize("selector", [None, 5, 1.5, True, ["2027-03-28T09:30:00Z"]])
def test_selector_neither_string_nor_object_is_invalid_rule(selector: Any) -> None:
    assert error_code(selector) == "invalid_rule"


@pytest.mark.parametrize(
    "zone",
    [
        "EST",
        "EST5EDT",
        "GMT",
        "CET",
        "utc",
        "Etc/UTC",
        "Etc/GMT+1",
        "+01:00",
        "UTC+1",
        "europe/berlin",
        "Europe/Nowhere",
        "Mars/Olympus_Mons",
        "Europe",
        "Europe/",
        "/Europe/Berlin",
        "Europe//Berlin",
        "Europe/../Europe/Berlin",
        "America/Argentina/../../Europe/Berlin",
        "Europe/Berlin/",
        "Europe\\Berlin",
        " Europe/Berlin",
        "",
    ],
)
def test_unknown_or_non_area_location_zone_is_invalid_time_zone(zone: str) -> None:
    # given a local time naming a zone that is not UTC or an IANA Area/Location name
    selector = local("2027-03-28", "09:30:00", zone)
    # then it is rejected as an invalid time zone
    assert error_code(selector) == "invalid_time_zone"
    assert not is_valid_zone(zone)


def _tzdata_keys() -> list[str]:
    text = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return sorted(line for line in text.splitlines() if line)


def test_every_area_location_name_of_the_pinned_tzdata_loads() -> None:
    # given every Area/Location key the pinned tzdata ships
    names = [n for n in _tzdata_keys() if "/" in n and not n.startswith("Etc/")]
    assert "America/Argentina/Buenos_Aires" in names
    # then each is valid and loads under its own key
    for name in names:
        assert is_valid_zone(name), name
        assert load_zone(name).key == name


def test_load_zone_is_cached_and_rejects_bad_names() -> None:
    assert load_zone("Europe/Berlin") is load_zone("Europe/Berlin")
    assert load_zone("UTC").key == "UTC"
    with pytest.raises(ToolError) as caught:
        load_zone("EST")
    assert caught.value.code == "invalid_time_zone"


@pytest.mark.parametrize("name", [None, 5, ["Europe/Berlin"]])
def test_is_valid_zone_is_false_for_non_strings(name: Any) -> None:
    assert not is_valid_zone(name)


# ---------------------------------------------------------------- omitted time_zone


def test_omitted_time_zone_uses_the_implicit_zone() -> None:
    calls: list[str] = []

    def implicit() -> str:
        calls.append("asked")
        return "Europe/Berlin"

    # when a local time omits time_zone
    instant = resolve_at(local("2027-07-15", "09:30:00"), now_ms=NOW, implicit_zone=implicit)
    # then the implicit zone is asked once and used
    assert format_instant(instant) == "2027-07-15T07:30:00.000Z"
    assert calls == ["asked"]


def test_implicit_zone_failure_propagates() -> None:
    def refuse() -> str:
        raise ToolError("timezone_confirmation_required", sessionTimeZone="unavailable")

    with pytest.raises(ToolError) as caught:
        resolve_at(local("2027-07-15", "09:30:00"), now_ms=NOW, implicit_zone=refuse)
    assert caught.value.code == "timezone_confirmation_required"


def test_syntax_errors_come_before_asking_for_the_zone() -> None:
    assert error_code(local("2027-02-30", "09:30:00")) == "invalid_rule"


# ---------------------------------------------------------------- range and future


@pytest.mark.parametrize(
    "selector",
    [
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00+00:01",  # before the range, and in the past: range comes first
        local("9999-12-31", "23:59:59", "America/New_York"),
        local("0001-01-01", "00:00:00", "Europe/Berlin"),
    ],
)
def test_unrepresentable_instant_is_time_out_of_range(selector: Any) -> None:
    assert error_code(selector) == "time_out_of_range"


@pytest.mark.parametrize(
    "selector",
    [
        format_instant(NOW),  # now itself is not strictly future
        format_instant(NOW - 1),
        "2020-01-01T00:00:00Z",
        "0001-01-01T00:00:00Z",
        local("2026-12-01", "10:00:00", "Europe/Berlin"),  # equals NOW
    ],
)
def test_now_or_past_is_not_future(selector: Any) -> None:
    assert error_code(selector) == "not_future"


def test_one_millisecond_after_now_is_future() -> None:
    assert resolve(format_instant(NOW + 1)) == format_instant(NOW + 1)


# ---------------------------------------------------------------- properties


def _offset_text(minutes: int, use_z: bool) -> str:
    if minutes == 0:
        return "Z" if use_z else "+00:00"
    sign = "-" if minutes < 0 else "+"
    hours, rest = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{rest:02d}"


@settings(deadline=None)
@given(
    ms=st.integers(MIN_MS, MAX_MS),
    offset_minutes=st.integers(-(23 * 60 + 59), 23 * 60 + 59),
    digits=st.integers(0, 3),
    use_z=st.booleans(),
)
def test_offset_string_round_trip(ms: int, offset_minutes: int, digits: int, use_z: bool) -> None:
    # given a valid instant written as local wall time at some offset, with 0-3 digits
    unit = 10 ** (3 - digits)
    ms -= ms % unit
    wall = ms + offset_minutes * 60_000
    assume(MIN_MS <= wall <= MAX_MS)
    wall_text = format_instant(wall)
    fraction = "" if digits == 0 else "." + wall_text[20 : 20 + digits]
    text = wall_text[:19] + fraction + _offset_text(offset_minutes, use_z)
    # when it is resolved / then it is the same instant
    assert resolve_at(text, now_ms=MIN_MS - 1, implicit_zone=no_implicit_zone) == ms


_ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "America/Argentina/Buenos_Aires",
    "Pacific/Apia",
]


@settings(deadline=None)
@given(
    ms=st.integers(
        parse_instant("1850-01-01T00:00:00.000Z"), parse_instant("2150-01-01T00:00:00.000Z")
    ),
    zone_name=st.sampled_from(_ZONES),
)
def test_local_wall_time_round_trip(ms: int, zone_name: str) -> None:
    # given an instant shown as wall time in a zone
    shown = to_datetime(ms).astimezone(load_zone(zone_name))
    selector = local(
        f"{shown.year:04d}-{shown.month:02d}-{shown.day:02d}",
        f"{shown.hour:02d}:{shown.minute:02d}:{shown.second:02d}.{shown.microsecond // 1000:03d}",
        zone_name,
    )
    # when that wall time is resolved
    resolved = resolve_at(selector, now_ms=MIN_MS - 1, implicit_zone=no_implicit_zone)
    # then it is the instant, or for a repeated wall time its first, earlier occurrence
    if shown.fold == 0:
        assert resolved == ms
    else:
        assert resolved < ms
        again = to_datetime(resolved).astimezone(load_zone(zone_name))
        assert again.replace(tzinfo=None) == shown.replace(tzinfo=None)
        assert ms - resolved <= timedelta(hours=24) / timedelta(milliseconds=1)


# ---------------------------------------------------------------- before the Gregorian reform


def test_local_dates_before_1582_are_proleptic_gregorian() -> None:
    """docs/decisions.md, "Two differences from the reference implementation": a local
    date before 1582-10-15 is read in the proleptic ISO calendar, not the Julian one."""
    long_ago = parse_instant("1000-01-01T00:00:00.000Z")
    # The ten days the reform skipped exist, and a date keeps its Gregorian instant.
    assert (resolve(local("1582-10-10", "12:00:00", "UTC"), now_ms=long_ago)
            == "1582-10-10T12:00:00.000Z")
    assert (resolve(local("1300-03-01", "00:00:00", "UTC"), now_ms=long_ago)
            == "1300-03-01T00:00:00.000Z")
    # A Julian leap day that is no Gregorian one is no date.
    assert error_code(local("1500-02-29", "12:00:00", "UTC")) == "invalid_rule"
    # Any such date is in the past today.
    assert error_code(local("1582-10-10", "12:00:00", "UTC")) == "not_future"
