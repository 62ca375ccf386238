"""``schedule_create`` with ``cron`` (docs/decisions.md#calendar-rules): answered with the
code it always had while calendar rules are disabled, and a message saying how to enable
them; when enabled, the selector's shape, grammar and
frequency before any zone question, the zone as for a local ``at``, and the version-2
record it builds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import Event, Session, SessionHeader
from dsh_schedule.shared.core.fold import EMPTY, fold_events
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.records import CronSchedule, decode_change, encode_change
from dsh_schedule.shared.core.requests import build_create, parse_create_args
from dsh_schedule.shared.core.timecontext import derive_zone_context, implicit_zone
from dsh_schedule.shared.core.views import schedule_view

NOW = parse_instant("2026-12-01T09:00:00.000Z")  # a Tuesday, 10:00 in Berlin

HEADERLESS = Session(header=SessionHeader(id="s1", createdAt=0), events=())


def confirmed(zone: str = "Europe/Berlin") -> Session:
    """A session of ``zone`` whose open turn confirms it (a reading and the client's zone)."""
    source = {"kind": "user", "rpcId": "r1", "clientTimeZone": zone}
    specs = [
        ("turn/start", {"turn": 1}),
        ("user/message", {"content": [{"type": "text", "text": "remind me"}], "source": source}),
        ("user/message", {"content": [], "source": {"kind": "plugin", "plugin": "time-context"}}),
        ("step/start", {"turn": 1, "step": 1}),
    ]
    events = tuple(Event(type=t, seq=i, time=i, data=d) for i, (t, d) in enumerate(specs))
    return Session(header=SessionHeader(id="s1", createdAt=0, timeZone=zone), events=events)


def create(args: Any, session: Session = HEADERLESS, *, calendar: bool = True,
           now: int = NOW) -> Any:
    """The pure part of schedule_create, wired as the tool wires it."""
    request = parse_create_args(args, calendar=calendar)
    return build_create(request, EMPTY, now, lambda: implicit_zone(derive_zone_context(session)))


def error_of(args: Any, session: Session = HEADERLESS, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(ToolError) as caught:
        create(args, session, **kwargs)
    value: dict[str, Any] = caught.value.value()
    return value


CRON_ARGS = [
    {"prompt": "x", "cron": "0 9 * * MON-FRI"},
    {"prompt": "x", "cron": {"expression": "0 9 * * MON-FRI", "time_zone": "UTC"}},
    {"prompt": "x", "cron": None},
    {"prompt": "", "cron": "0 9 * * *"},
    {"prompt": "x", "cron": "*/1 * * * *"},
    {"prompt": "x", "cron": "0 9 * * *", "every_seconds": 300},
]


CRON_OFF = {
    "code": "invalid_selector",
    "message": "cron is a calendar rule, and calendar rules are not enabled here (the "
    "deployment enables them with DSH_SCHEDULE_CALENDAR=on, or calendar=True on the plugin). "
    "Provide exactly one of after_seconds, at, or every_seconds, and no other keys.",
}


@pytest.mark.parametrize("args", CRON_ARGS)
def test_disabled_cron_answers_invalid_selector_saying_how_to_enable_it(
    args: dict[str, Any],
) -> None:
    # the code an unknown key answers, with a message naming the selector the call used
    assert error_of(args, calendar=False) == CRON_OFF
    assert error_of(args, confirmed(), calendar=False) == CRON_OFF


def test_other_unknown_keys_answer_as_they_always_did() -> None:
    expected = {"code": "invalid_selector", "message":
                "Provide exactly one of after_seconds, at, or every_seconds, and no other keys."}
    assert error_of({"prompt": "x", "rrule": "FREQ=DAILY"}, calendar=False) == expected
    assert error_of({"prompt": "x"}, calendar=False) == expected
    assert ToolError("invalid_selector").value() == expected


def test_a_rule_with_a_zone_builds_the_version_2_record() -> None:
    args = {"prompt": "  stand-up ", "cron": {"expression": " 0  9 * *\tmon-fri ",
                                              "time_zone": "Europe/Berlin"}}
    change = create(args)
    data = encode_change(change)
    assert json.dumps(data) == json.dumps({"version": 2, "operation": "create", "schedule": {
        "id": "schedule-1", "kind": "cron", "prompt": "stand-up", "cron": "0 9 * * mon-fri",
        "timeZone": "Europe/Berlin", "scheduledAt": "2026-12-02T08:00:00.000Z"}})
    assert decode_change(data) == change
    state = fold_events(EMPTY, [Event(type="schedule/change", seq=0, time=NOW, data=data)])
    assert list(schedule_view(change.schedule, state, NOW)) == [
        "id", "kind", "prompt", "cron", "timeZone", "scheduledAt", "state", "deliveryMode"]


def test_the_first_target_is_strictly_after_the_create() -> None:
    # created at exactly 09:00 UTC, the 09:00 UTC occurrence is not the first one
    change = create({"prompt": "x", "cron": {"expression": "0 9 * * *", "time_zone": "UTC"}})
    assert change.schedule.scheduledAt == "2026-12-02T09:00:00.000Z"


def test_a_bare_rule_takes_the_confirmed_zone_of_the_turn() -> None:
    change = create({"prompt": "x", "cron": "30 2 * * *"}, confirmed("America/New_York"))
    assert isinstance(change.schedule, CronSchedule)
    assert change.schedule.timeZone == "America/New_York"
    assert change.schedule.scheduledAt == "2026-12-02T07:30:00.000Z"


@pytest.mark.parametrize("session", [HEADERLESS, confirmed().__class__(
    header=SessionHeader(id="s1", createdAt=0, timeZone="Europe/Berlin"), events=())])
def test_no_zone_and_no_confirmed_context_asks_as_a_local_at_does(session: Session) -> None:
    cron = error_of({"prompt": "x", "cron": "0 9 * * MON-FRI"}, session)
    at = error_of({"prompt": "x", "at": {"date": "2027-01-01", "time": "09:00:00"}}, session)
    assert cron["code"] == "timezone_confirmation_required"
    # the same code and known zones; the message speaks of the selector the call used
    assert {**cron, "message": ""} == {**at, "message": ""}
    assert "at.time_zone" in at["message"] and "at as a string" in at["message"]
    assert cron["message"] == (
        "This cron rule has no time_zone, and the user's time zone is not confirmed for this "
        'request. Ask the user which time zone they mean, then pass the rule as {"expression": '
        '"...", "time_zone": "..."} with "UTC" or an IANA Area/Location name.')


@pytest.mark.parametrize(
    ("cron", "code"),
    [
        pytest.param(5, "invalid_rule", id="a number"),
        pytest.param(None, "invalid_rule", id="null"),
        pytest.param(["0 9 * * *"], "invalid_rule", id="a list"),
        pytest.param({"time_zone": "UTC"}, "invalid_rule", id="no expression"),
        pytest.param({"expression": 5}, "invalid_rule", id="expression not a string"),
        pytest.param({"expression": "0 9 * * *", "zone": "UTC"}, "invalid_rule", id="other key"),
        pytest.param({"expression": "0 9 * * *", "time_zone": 1}, "invalid_rule", id="zone type"),
        pytest.param("0 9 * *", "invalid_rule", id="four fields"),
        pytest.param("@daily", "invalid_rule", id="a macro"),
        pytest.param("0 9 L * *", "invalid_rule", id="L"),
        pytest.param("0 9 * * MON-SUN", "invalid_rule", id="descending after names"),
        pytest.param("*/4 * * * *", "frequency_too_high", id="every 4 minutes"),
        pytest.param("0,3 * * * *", "frequency_too_high", id="3 minutes apart"),
        pytest.param("58 23 * * 8", "invalid_rule", id="day of week 8"),
    ],
)
def test_shape_grammar_and_frequency_come_before_any_zone_question(cron: Any, code: str) -> None:
    # an unconfirmed session would answer timezone_confirmation_required, were it asked
    assert error_of({"prompt": "x", "cron": cron})["code"] == code
    # and the parser answers it before the queue, with no fold and no clock
    with pytest.raises(ToolError) as caught:
        parse_create_args({"prompt": "x", "cron": cron}, calendar=True)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("args", "code", "now"),
    [
        ({"prompt": "x", "cron": {"expression": "0 9 * * *", "time_zone": "EST"}},
         "invalid_time_zone", NOW),
        ({"prompt": "x", "cron": {"expression": "0 9 * * *", "time_zone": "Mars/Base"}},
         "invalid_time_zone", NOW),
        ({"prompt": "x", "cron": {"expression": "0 0 30 2 *", "time_zone": "UTC"}},
         "invalid_rule", NOW),
        ({"prompt": "x", "cron": {"expression": "0 0 29 2 *", "time_zone": "UTC"}},
         "time_out_of_range", parse_instant("9996-03-01T00:00:00.000Z")),
        ({"prompt": "x", "cron": "0 9 * * *", "at": "2027-01-01T00:00:00Z"},
         "invalid_selector", NOW),
        ({"prompt": "x", "cron": "0 9 * * *", "hourly": True}, "invalid_selector", NOW),
        ({"prompt": "  ", "cron": "0 9 * * *"}, "invalid_prompt", NOW),
    ],
)
def test_the_remaining_codes(args: dict[str, Any], code: str, now: int) -> None:
    assert error_of(args, confirmed(), now=now)["code"] == code


def test_enabled_invalid_selector_names_cron() -> None:
    message = error_of({"prompt": "x"})["message"]
    assert "cron" in message


@pytest.mark.parametrize(
    "args",
    [
        {"prompt": "x", "after_seconds": 600},
        {"prompt": "x", "every_seconds": 300},
        {"prompt": "x", "at": "2026-12-01T16:00:00Z"},
        {"prompt": "x", "at": {"date": "2026-12-01", "time": "16:00:00"}},
    ],
)
def test_the_other_selectors_build_the_same_version_1_records_either_way(
    args: dict[str, Any],
) -> None:
    on, off = create(args, confirmed()), create(args, confirmed(), calendar=False)
    assert on == off and encode_change(on)["version"] == 1
