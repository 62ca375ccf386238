"""Management-tool arguments and the create record (docs/architecture.md#management-tools)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import Event, Session, SessionHeader
from dsh_schedule.shared.core.fold import EMPTY, FoldState, fold, fold_events
from dsh_schedule.shared.core.instant import MAX_MS, MAX_SAFE_INTEGER, format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    MAX_EVERY_SECONDS,
    AfterSchedule,
    AtSchedule,
    CreateChange,
    EverySchedule,
    decode_change,
    encode_change,
    js_trim,
)
from dsh_schedule.shared.core.requests import (
    CreateRequest,
    build_create,
    parse_create_args,
    parse_delete_args,
    parse_list_args,
)
from dsh_schedule.shared.core.timecontext import derive_zone_context, implicit_zone
from dsh_schedule.shared.core.views import list_value

NOW = parse_instant("2026-12-01T09:00:00.000Z")


def no_zone() -> str:
    raise AssertionError("the implicit zone must not be consulted")


def code_of(call: Any, *args: Any) -> str:
    with pytest.raises(ToolError) as caught:
        call(*args)
    return caught.value.code


# ---------------------------------------------------------------- schedule_create shape


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            {"prompt": "stretch", "after_seconds": 600},
            CreateRequest(kind="after", prompt="stretch", after_seconds=600),
        ),
        (  # an integral JSON float counts as an integer
            {"prompt": "stretch", "after_seconds": 600.0},
            CreateRequest(kind="after", prompt="stretch", after_seconds=600),
        ),
        (
            {"prompt": "x", "after_seconds": MAX_SAFE_INTEGER},
            CreateRequest(kind="after", prompt="x", after_seconds=MAX_SAFE_INTEGER),
        ),
        (  # the prompt is trimmed with the JavaScript whitespace set
            {"prompt": "\ufeff\u3000 call Ana\n\u2028", "at": "2027-01-01T00:00:00Z"},
            CreateRequest(kind="at", prompt="call Ana", at="2027-01-01T00:00:00Z"),
        ),
        (  # U+001C is not JavaScript whitespace, so it stays
            {"prompt": "\x1ccall", "at": {"date": "2027-01-01", "time": "09:00:00"}},
            CreateRequest(
                kind="at", prompt="\x1ccall", at={"date": "2027-01-01", "time": "09:00:00"}
            ),
        ),
        (  # at is kept as given; it is resolved inside the transaction
            {"prompt": "x", "at": "nonsense"},
            CreateRequest(kind="at", prompt="x", at="nonsense"),
        ),
        (
            {"prompt": "check CI", "every_seconds": 3600},
            CreateRequest(kind="every", prompt="check CI", every_seconds=3600),
        ),
        (
            {"prompt": "x", "every_seconds": 300.0},
            CreateRequest(kind="every", prompt="x", every_seconds=300),
        ),
        (
            {"prompt": "x", "every_seconds": MAX_EVERY_SECONDS},
            CreateRequest(kind="every", prompt="x", every_seconds=MAX_EVERY_SECONDS),
        ),
        (  # a safe interval whose milliseconds are not is a range question for later
            {"prompt": "x", "every_seconds": MAX_EVERY_SECONDS + 1},
            CreateRequest(kind="every", prompt="x", every_seconds=MAX_EVERY_SECONDS + 1),
        ),
        (
            {"prompt": "x", "every_seconds": MAX_SAFE_INTEGER},
            CreateRequest(kind="every", prompt="x", every_seconds=MAX_SAFE_INTEGER),
        ),
    ],
)
def test_create_args_accepted(args: Any, expected: CreateRequest) -> None:
    assert parse_create_args(args) == expected


@pytest.mark.parametrize(
    ("args", "code"),
    [
        # 1. object, keys, exactly one selector
        pytest.param(None, "invalid_selector", id="no-arguments"),
        pytest.param([], "invalid_selector", id="array"),
        pytest.param("stretch", "invalid_selector", id="string"),
        pytest.param({"prompt": "x"}, "invalid_selector", id="no-selector"),
        pytest.param(
            {"prompt": "x", "after_seconds": 600, "every_seconds": 600},
            "invalid_selector",
            id="two-selectors",
        ),
        pytest.param(
            {"prompt": "x", "after_seconds": 1, "at": "2027-01-01T00:00:00Z", "every_seconds": 300},
            "invalid_selector",
            id="three-selectors",
        ),
        pytest.param(
            {"prompt": "x", "after_seconds": 600, "at": None},
            "invalid_selector",
            id="null-selector-counts-as-given",
        ),
        pytest.param({"prompt": "x", "cron": "* * * * *"}, "invalid_selector", id="cron"),
        pytest.param(
            {"prompt": "x", "after_seconds": 600, "time_zone": "UTC"},
            "invalid_selector",
            id="unknown-key",
        ),
        pytest.param({"prompt": "", "cron": "x"}, "invalid_selector", id="selector-before-prompt"),
        # 2. prompt
        pytest.param({"after_seconds": 600}, "invalid_prompt", id="prompt-missing"),
        pytest.param({"prompt": 5, "after_seconds": 600}, "invalid_prompt", id="prompt-number"),
        pytest.param({"prompt": None, "after_seconds": 600}, "invalid_prompt", id="prompt-null"),
        pytest.param({"prompt": "", "after_seconds": 600}, "invalid_prompt", id="prompt-empty"),
        pytest.param(
            {"prompt": " \t\n\u00a0\u3000\ufeff", "after_seconds": 600},
            "invalid_prompt",
            id="prompt-whitespace",
        ),
        pytest.param(
            {"prompt": "call \ud800", "after_seconds": 600},
            "invalid_prompt",
            id="prompt-lone-surrogate",
        ),
        pytest.param(
            {"prompt": "", "after_seconds": 1.5}, "invalid_prompt", id="prompt-before-rule"
        ),
        # 3. the selector's value
        pytest.param({"prompt": "x", "after_seconds": 0}, "invalid_rule", id="after-zero"),
        pytest.param({"prompt": "x", "after_seconds": -1}, "invalid_rule", id="after-negative"),
        pytest.param({"prompt": "x", "after_seconds": 1.5}, "invalid_rule", id="after-fraction"),
        pytest.param({"prompt": "x", "after_seconds": True}, "invalid_rule", id="after-true"),
        pytest.param({"prompt": "x", "after_seconds": False}, "invalid_rule", id="after-false"),
        pytest.param({"prompt": "x", "after_seconds": "30"}, "invalid_rule", id="after-string"),
        pytest.param({"prompt": "x", "after_seconds": None}, "invalid_rule", id="after-null"),
        pytest.param({"prompt": "x", "after_seconds": [600]}, "invalid_rule", id="after-list"),
        pytest.param({"prompt": "x", "after_seconds": 2**53}, "invalid_rule", id="after-unsafe"),
        pytest.param(
            {"prompt": "x", "after_seconds": 1e300}, "invalid_rule", id="after-huge-float"
        ),
        pytest.param(
            {"prompt": "x", "after_seconds": float("inf")}, "invalid_rule", id="after-infinity"
        ),
        pytest.param(
            {"prompt": "x", "after_seconds": float("nan")}, "invalid_rule", id="after-nan"
        ),
        pytest.param({"prompt": "x", "every_seconds": 299}, "frequency_too_high", id="every-299"),
        pytest.param(
            {"prompt": "x", "every_seconds": 299.0}, "frequency_too_high", id="every-299.0"
        ),
        pytest.param({"prompt": "x", "every_seconds": 0}, "frequency_too_high", id="every-zero"),
        pytest.param(
            {"prompt": "x", "every_seconds": -600}, "frequency_too_high", id="every-negative"
        ),
        pytest.param({"prompt": "x", "every_seconds": 600.5}, "invalid_rule", id="every-fraction"),
        pytest.param({"prompt": "x", "every_seconds": True}, "invalid_rule", id="every-true"),
        pytest.param({"prompt": "x", "every_seconds": "600"}, "invalid_rule", id="every-string"),
        pytest.param({"prompt": "x", "every_seconds": None}, "invalid_rule", id="every-null"),
        pytest.param({"prompt": "x", "every_seconds": 2**53}, "invalid_rule", id="every-unsafe"),
        pytest.param(
            {"prompt": "x", "every_seconds": -(2**53)}, "invalid_rule", id="every-unsafe-negative"
        ),
    ],
)
def test_create_args_rejected(args: Any, code: str) -> None:
    assert code_of(parse_create_args, args) == code


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        pytest.param(
            "   ",
            "prompt must be a non-empty string after trimming whitespace.",
            id="an empty prompt is told it must not be empty",
        ),
        pytest.param(
            "call \ud800",
            "prompt must be valid Unicode text; it holds an unpaired surrogate.",
            id="a lone surrogate is told it is not valid Unicode",
        ),
        pytest.param(
            "\udc00 call",
            "prompt must be valid Unicode text; it holds an unpaired surrogate.",
            id="a lone low surrogate too",
        ),
    ],
)
def test_an_invalid_prompt_says_what_is_wrong(prompt: str, message: str) -> None:
    with pytest.raises(ToolError) as caught:
        parse_create_args({"prompt": prompt, "after_seconds": 600})
    assert (caught.value.code, caught.value.message) == ("invalid_prompt", message)


LIMIT_MESSAGE = "prompt must be at most {} bytes of UTF-8 after trimming whitespace; shorten it."


@pytest.mark.parametrize(
    ("prompt", "limit", "accepted"),
    [
        pytest.param("a" * 32768, None, True, id="32 KiB of ASCII is the default limit"),
        pytest.param("a" * 32769, None, False, id="one byte more is refused"),
        pytest.param("é" * 16384, None, True, id="two-byte characters count as two"),
        pytest.param("é" * 16384 + "a", None, False, id="and one more byte is refused"),
        pytest.param("😀" * 8192, None, True, id="four-byte characters count as four"),
        pytest.param("😀" * 8193, None, False, id="past the limit by four bytes"),
        pytest.param("a" * 20_000_000, None, False, id="a 20 MB prompt is refused"),
        pytest.param(" " * 9 + "a" * 32768 + "\n", None, True, id="the trimmed prompt counts"),
        pytest.param("a" * 10, 10, True, id="a deployment's own limit"),
        pytest.param("é" * 5 + "a", 10, False, id="a deployment's own limit, in bytes"),
    ],
)
def test_a_prompt_longer_than_the_limit_is_refused_naming_it(
        prompt: str, limit: int | None, accepted: bool) -> None:
    args = {"prompt": prompt, "after_seconds": 600}
    parse = (lambda: parse_create_args(args)) if limit is None else (
        lambda: parse_create_args(args, max_prompt_bytes=limit))
    if accepted:
        assert parse().prompt == prompt.strip()
        return
    with pytest.raises(ToolError) as caught:
        parse()
    shown = 32768 if limit is None else limit
    assert (caught.value.code, caught.value.message) == (
        "invalid_prompt", LIMIT_MESSAGE.format(shown))


def test_the_prompt_limit_is_checked_after_the_selector_and_before_the_rule() -> None:
    with pytest.raises(ToolError) as caught:
        parse_create_args({"prompt": "a" * 40_000, "after_seconds": 0})
    assert caught.value.code == "invalid_prompt"
    with pytest.raises(ToolError) as caught:
        parse_create_args({"prompt": "a" * 40_000, "after_seconds": 1, "at": "x"})
    assert caught.value.code == "invalid_selector"


def test_a_log_holding_a_prompt_past_the_limit_still_folds_and_delivers() -> None:
    # given a create accepted before the limit existed, with a 40 KiB prompt
    prompt = "p" * 40_000
    create = CreateChange(schedule=AfterSchedule(
        id="schedule-1", prompt=prompt, afterSeconds=60,
        scheduledAt=format_instant(NOW + 60_000)))
    events = [Event(type="schedule/change", seq=0, time=NOW, data=encode_change(create))]

    # then replay keeps it, and its dispatch replays too
    state = fold(events)
    assert [s.prompt for s in state.active] == [prompt]
    assert [v["prompt"] for v in list_value(state, NOW)] == [prompt]
    dispatch = {"version": 1, "operation": "dispatch", "id": "schedule-1"}
    after = fold([*events, Event(type="schedule/change", seq=1, time=NOW + 61_000,
                                 data=dispatch)])
    assert after.active == ()


# ---------------------------------------------------------------- delete and list


def test_delete_args_accepted() -> None:
    assert parse_delete_args({"id": "schedule-1"}) == "schedule-1"


@pytest.mark.parametrize(
    "args",
    [
        None,
        [],
        "schedule-1",
        {},
        {"id": ""},
        {"id": " schedule-1"},
        {"id": "schedule-1\n"},
        {"id": "schedule-1\u3000"},
        {"id": "\ufeffschedule-1"},
        {"id": 1},
        {"id": None},
        {"id": "schedule-\ud800"},
        {"id": "schedule-1", "force": True},
        {"ids": ["schedule-1"]},
    ],
)
def test_delete_args_rejected(args: Any) -> None:
    assert code_of(parse_delete_args, args) == "invalid_rule"


@pytest.mark.parametrize("args", [None, {}])
def test_list_args_accepted(args: Any) -> None:
    parse_list_args(args)


@pytest.mark.parametrize("args", [{"id": "schedule-1"}, [], "", 0, {"all": True}])
def test_list_args_rejected(args: Any) -> None:
    assert code_of(parse_list_args, args) == "invalid_selector"


# ---------------------------------------------------------------- build_create


def created(ids: int) -> FoldState:
    return FoldState(created=frozenset(f"schedule-{n}" for n in range(1, ids + 1)))


def test_after_record_matches_the_documented_example() -> None:
    # given a create request at 2026-12-01T09:00:00Z
    request = parse_create_args({"prompt": " stretch ", "after_seconds": 600})
    # when the record is built
    change = build_create(request, EMPTY, NOW, no_zone)
    # then it is exactly the docs/architecture.md#schedule-records example
    assert encode_change(change) == {
        "version": 1,
        "operation": "create",
        "schedule": {
            "id": "schedule-1",
            "kind": "after",
            "prompt": "stretch",
            "afterSeconds": 600,
            "scheduledAt": "2026-12-01T09:10:00.000Z",
        },
    }


@pytest.mark.parametrize(
    ("args", "state", "expected"),
    [
        (
            {"prompt": "stretch", "after_seconds": 600.0},
            EMPTY,
            AfterSchedule(
                id="schedule-1",
                prompt="stretch",
                afterSeconds=600,
                scheduledAt="2026-12-01T09:10:00.000Z",
            ),
        ),
        (
            {"prompt": "call Ana", "at": "2026-12-01T17:00:00+01:00"},
            created(2),
            AtSchedule(id="schedule-3", prompt="call Ana", scheduledAt="2026-12-01T16:00:00.000Z"),
        ),
        (
            {
                "prompt": "call Ana",
                "at": {"date": "2026-12-01", "time": "17:00:00.5", "time_zone": "Europe/Berlin"},
            },
            EMPTY,
            AtSchedule(id="schedule-1", prompt="call Ana", scheduledAt="2026-12-01T16:00:00.500Z"),
        ),
        (  # the first target is the anchor
            {"prompt": "check CI", "every_seconds": 3600},
            created(1),
            EverySchedule(
                id="schedule-2",
                prompt="check CI",
                everySeconds=3600,
                scheduledAt="2026-12-01T10:00:00.000Z",
            ),
        ),
    ],
)
def test_build_create(args: Any, state: FoldState, expected: Any) -> None:
    change = build_create(parse_create_args(args), state, NOW, no_zone)
    assert change == CreateChange(schedule=expected)


def test_at_without_zone_asks_the_zone_callable() -> None:
    request = parse_create_args({"prompt": "x", "at": {"date": "2027-07-15", "time": "09:30:00"}})
    change = build_create(request, EMPTY, NOW, lambda: "Europe/Berlin")
    assert change.schedule.scheduledAt == "2027-07-15T07:30:00.000Z"


@pytest.mark.parametrize(
    ("args", "now"),
    [
        ({"prompt": "x", "after_seconds": MAX_SAFE_INTEGER}, NOW),
        ({"prompt": "x", "after_seconds": 2}, MAX_MS - 1000),
        ({"prompt": "x", "every_seconds": MAX_EVERY_SECONDS}, NOW),
        ({"prompt": "x", "every_seconds": MAX_EVERY_SECONDS + 1}, NOW),
        ({"prompt": "x", "every_seconds": MAX_SAFE_INTEGER}, NOW),
        ({"prompt": "x", "every_seconds": MAX_SAFE_INTEGER}, 0),
        ({"prompt": "x", "every_seconds": 300}, MAX_MS - 299_999),
        ({"prompt": "x", "at": "9999-12-31T23:59:59-01:00"}, NOW),
    ],
)
def test_target_beyond_the_range_is_time_out_of_range(args: Any, now: int) -> None:
    assert (
        code_of(build_create, parse_create_args(args), EMPTY, now, no_zone) == "time_out_of_range"
    )


@pytest.mark.parametrize(
    ("args", "now"),
    [
        ({"prompt": "x", "after_seconds": 1}, MAX_MS - 1000),
        ({"prompt": "x", "every_seconds": 300}, MAX_MS - 300_000),
    ],
)
def test_target_at_the_last_instant_is_accepted(args: Any, now: int) -> None:
    change = build_create(parse_create_args(args), EMPTY, now, no_zone)
    assert change.schedule.scheduledAt == format_instant(MAX_MS)


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        pytest.param(
            CreateRequest(kind="after", prompt="x"),
            "invalid_rule",
            id="an after request without its seconds is an invalid rule",
        ),
        pytest.param(
            CreateRequest(kind="every", prompt="x"),
            "invalid_rule",
            id="an every request without its seconds is an invalid rule",
        ),
        pytest.param(
            CreateRequest(kind="every", prompt="x", every_seconds=299),
            "frequency_too_high",
            id="an every request below 300 seconds is too frequent",
        ),
    ],
)
def test_build_create_checks_a_hand_made_request_as_the_parser_would(
    request_: CreateRequest, code: str
) -> None:
    assert code_of(build_create, request_, EMPTY, NOW, no_zone) == code


# ---------------------------------------------------------------- one row per error code

HEADERLESS = Session(header=SessionHeader(id="s1", createdAt=0), events=())


def schedule_create(args: Any, session: Session = HEADERLESS) -> CreateChange:
    """The pure part of schedule_create, wired as the tool wires it."""
    request = parse_create_args(args)
    return build_create(request, EMPTY, NOW, lambda: implicit_zone(derive_zone_context(session)))


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"prompt": "x", "after_seconds": 600, "at": "2027-01-01T00:00:00Z"}, "invalid_selector"),
        ({"prompt": "  ", "after_seconds": 600}, "invalid_prompt"),
        ({"prompt": "x", "after_seconds": 1.5}, "invalid_rule"),
        ({"prompt": "x", "at": "2027-01-01t00:00:00Z"}, "invalid_rule"),
        (
            {
                "prompt": "x",
                "at": {"date": "2027-03-28", "time": "02:30:00", "time_zone": "Europe/Berlin"},
            },
            "invalid_rule",
        ),
        (
            {"prompt": "x", "at": {"date": "2027-01-01", "time": "09:00:00", "time_zone": "EST"}},
            "invalid_time_zone",
        ),
        (
            {"prompt": "x", "at": {"date": "2027-01-01", "time": "09:00:00"}},
            "timezone_confirmation_required",
        ),
        ({"prompt": "x", "at": "2026-12-01T09:00:00Z"}, "not_future"),
        ({"prompt": "x", "at": "9999-12-31T23:59:59-01:00"}, "time_out_of_range"),
        ({"prompt": "x", "after_seconds": MAX_SAFE_INTEGER}, "time_out_of_range"),
        ({"prompt": "x", "every_seconds": MAX_EVERY_SECONDS + 1}, "time_out_of_range"),
        ({"prompt": "x", "every_seconds": 299}, "frequency_too_high"),
    ],
)
def test_each_reachable_error_code(args: Any, code: str) -> None:
    assert code_of(schedule_create, args) == code


def test_headerless_session_reports_unavailable_zone() -> None:
    with pytest.raises(ToolError) as caught:
        schedule_create({"prompt": "x", "at": {"date": "2027-01-01", "time": "09:00:00"}})
    assert caught.value.value()["sessionTimeZone"] == "unavailable"
    assert caught.value.value()["clientTimeZones"] == []


def test_omitted_zone_accepted_in_a_confirmed_open_turn() -> None:
    # given a Berlin session whose open turn has a reading and a Berlin prompt
    source = {"kind": "user", "rpcId": "r1", "clientTimeZone": "Europe/Berlin"}
    specs = [
        ("turn/start", {"turn": 1}),
        ("user/message", {"content": [{"type": "text", "text": "remind me"}], "source": source}),
        ("user/message", {"content": [], "source": {"kind": "plugin", "plugin": "time-context"}}),
        ("step/start", {"turn": 1, "step": 1}),
    ]
    events = tuple(Event(type=t, seq=i, time=i, data=d) for i, (t, d) in enumerate(specs))
    session = Session(
        header=SessionHeader(id="s1", createdAt=0, timeZone="Europe/Berlin"), events=events
    )
    # when a local time without time_zone is created
    change = schedule_create(
        {"prompt": "x", "at": {"date": "2027-01-01", "time": "09:00:00"}}, session
    )
    # then it is read in the session zone
    assert change.schedule.scheduledAt == "2027-01-01T08:00:00.000Z"


# ---------------------------------------------------------------- properties

_prompts = st.text(st.characters(exclude_categories=["Cs"]), min_size=1).filter(
    lambda p: js_trim(p) != ""
)
_requests = st.one_of(
    st.builds(lambda p, s: {"prompt": p, "after_seconds": s}, _prompts, st.integers(1, 10**9)),
    st.builds(lambda p, s: {"prompt": p, "every_seconds": s}, _prompts, st.integers(300, 10**9)),
    st.builds(
        lambda p, s: {"prompt": p, "at": format_instant(NOW + s)}, _prompts, st.integers(1, 10**12)
    ),
)


@settings(deadline=None)
@given(calls=st.lists(_requests, min_size=1, max_size=8))
def test_records_the_tools_build_pass_the_invariant(calls: list[dict[str, Any]]) -> None:
    # given a sequence of accepted create calls, each built on the fold so far
    state = EMPTY
    for seq, args in enumerate(calls):
        change = build_create(parse_create_args(args), state, NOW, no_zone)
        data = encode_change(change)
        # then each record decodes strictly and the fold accepts it
        assert decode_change(data) == change
        state = fold_events(state, [Event(type="schedule/change", seq=seq, time=NOW, data=data)])
    assert len(state.active) == len(calls)
    assert [r.id for r in state.active] == [f"schedule-{n}" for n in range(1, len(calls) + 1)]
