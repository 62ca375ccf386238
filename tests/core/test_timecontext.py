"""Omitted ``time_zone``: deriving the zone from the log (docs/architecture.md#time)."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import Event, Session, SessionHeader
from dsh_schedule.shared.core.timecontext import (
    ZoneContext,
    derive_zone_context,
    implicit_zone,
    open_turn_start,
)

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
TOKYO = "Asia/Tokyo"

Spec = tuple[str, Any]


def turn_start(turn: Any = 1) -> Spec:
    return ("turn/start", {"turn": turn})


def step_start(turn: Any = 1, step: int = 1) -> Spec:
    return ("step/start", {"turn": turn, "step": step})


def step_end(turn: Any = 1, step: int = 1) -> Spec:
    return ("step/end", {"turn": turn, "step": step})


def turn_end(turn: Any = 1) -> Spec:
    return ("turn/end", {"turn": turn})


_MISSING = object()


def user(zone: Any = BERLIN, rpc: str = "r1") -> Spec:
    source: dict[str, Any] = {"kind": "user", "rpcId": rpc}
    if zone is not _MISSING:
        source["clientTimeZone"] = zone
    return ("user/message", {"content": [{"type": "text", "text": "remind me"}], "source": source})


def reading(**extra: Any) -> Spec:
    source = {"kind": "plugin", "plugin": "time-context", **extra}
    return ("user/message", {"content": [{"type": "text", "text": "local time"}], "source": source})


def session(*specs: Spec, zone: str | None = BERLIN) -> Session:
    events = tuple(
        Event(type=kind, seq=index, time=1_000 + index, data=data)
        for index, (kind, data) in enumerate(specs)
    )
    return Session(header=SessionHeader(id="s1", createdAt=0, timeZone=zone), events=events)


def confirmation(s: Session) -> dict[str, Any]:
    with pytest.raises(ToolError) as caught:
        implicit_zone(derive_zone_context(s))
    assert caught.value.code == "timezone_confirmation_required"
    return caught.value.value()


OPEN_BERLIN = (turn_start(), user(BERLIN), reading(), step_start())


@pytest.mark.parametrize(
    "s",
    [
        pytest.param(session(*OPEN_BERLIN), id="one-client-zone-equal-to-header"),
        pytest.param(
            session(turn_start(), user(BERLIN, "r1"), user(BERLIN, "r2"), reading(), step_start()),
            id="two-messages-same-zone",
        ),
        pytest.param(
            session(turn_start(), reading(), user(BERLIN), step_start()),
            id="reading-before-the-message",
        ),
        pytest.param(
            session(*OPEN_BERLIN, ("tool/call", {"name": "schedule_create"})),
            id="unknown-events-after-step-start",
        ),
        pytest.param(
            session(turn_start(), user(BERLIN), reading(form="long", sections=[1]), step_start()),
            id="extra-source-keys-ignored",
        ),
        pytest.param(
            session(*OPEN_BERLIN, step_end(1, 1), step_start(1, 2)),
            id="second-step-of-the-turn",
        ),
        pytest.param(
            session(
                turn_start(1),
                user(NEW_YORK),
                reading(),
                step_start(1),
                step_end(1),
                turn_end(1),
                turn_start(2),
                user(BERLIN),
                reading(),
                step_start(2),
            ),
            id="earlier-turn-zones-do-not-count",
        ),
        pytest.param(
            session(turn_start(), user(BERLIN), user(_MISSING), reading(), step_start()),
            id="message-without-zone-contributes-nothing",
        ),
    ],
)
def test_omitted_zone_is_the_session_zone(s: Session) -> None:
    # given an open turn with a reading and exactly the header zone from the person
    # when the implicit zone is asked / then it is the header zone
    assert implicit_zone(derive_zone_context(s)) == BERLIN


@pytest.mark.parametrize(
    ("s", "session_zone", "client_zones"),
    [
        pytest.param(session(*OPEN_BERLIN, zone=None), "unavailable", [BERLIN], id="headerless"),
        pytest.param(
            session(turn_start(), user(NEW_YORK), reading(), step_start()),
            BERLIN,
            [NEW_YORK],
            id="client-session-mismatch",
        ),
        pytest.param(
            session(
                turn_start(),
                user(TOKYO, "r1"),
                user(BERLIN, "r2"),
                user(NEW_YORK, "r3"),
                reading(),
                step_start(),
            ),
            BERLIN,
            [NEW_YORK, TOKYO, BERLIN],
            id="mixed-zones-sorted",
        ),
        pytest.param(
            session(turn_start(), user(BERLIN), step_start()), BERLIN, [], id="no-reading"
        ),
        pytest.param(
            session(turn_start(), user(_MISSING), reading(), step_start()),
            BERLIN,
            [],
            id="no-client-zone-is-missing",
        ),
        pytest.param(
            session(turn_start(), user(5), user(None), reading(), step_start()),
            BERLIN,
            [],
            id="non-string-client-zone",
        ),
        pytest.param(session(*OPEN_BERLIN, step_end()), BERLIN, [], id="closed-by-step-end"),
        pytest.param(
            session(*OPEN_BERLIN, step_end(), turn_end()), BERLIN, [], id="closed-by-turn-end"
        ),
        pytest.param(session(), BERLIN, [], id="empty-log"),
        pytest.param(
            session(turn_start(), user(BERLIN), reading()), BERLIN, [], id="no-step-started"
        ),
        pytest.param(
            session(turn_start(1), user(BERLIN), reading(), step_start(2)),
            BERLIN,
            [],
            id="step-of-a-turn-never-started",
        ),
        pytest.param(
            session(turn_start("1"), user(BERLIN), reading(), step_start(1)),
            BERLIN,
            [],
            id="turn-ids-compare-strictly",
        ),
        pytest.param(
            session(
                turn_start(1),
                user(BERLIN),
                reading(),
                step_start(1),
                step_end(1),
                turn_end(1),
                turn_start(2),
                user(BERLIN),
                step_start(2),
            ),
            BERLIN,
            [],
            id="reading-of-an-earlier-turn",
        ),
        pytest.param(
            session(
                turn_start(),
                user(BERLIN),
                ("user/message", {"source": {"kind": "plugin", "plugin": "tool-schedule"}}),
                step_start(),
            ),
            BERLIN,
            [],
            id="other-plugin-message-is-no-reading",
        ),
        pytest.param(
            session(
                turn_start(),
                ("user/message", {"source": {"kind": "user", "clientTimeZone": BERLIN}}),
                step_start(),
                zone="",
            ),
            "unavailable",
            [],
            id="empty-header-zone-is-unavailable",
        ),
    ],
)
def test_confirmation_required(s: Session, session_zone: str, client_zones: list[str]) -> None:
    # when the implicit zone is asked for a session that does not confirm one
    value = confirmation(s)
    # then the error reports the known zones
    assert list(value) == ["code", "message", "sessionTimeZone", "clientTimeZones"]
    assert value["sessionTimeZone"] == session_zone
    assert value["clientTimeZones"] == sorted(client_zones)


@pytest.mark.parametrize(
    "specs",
    [
        pytest.param((("step/start", None),), id="step-start-data-null"),
        pytest.param((("step/start", {"step": 1}),), id="step-start-without-turn"),
        pytest.param((("step/start", [1]),), id="step-start-data-list"),
        pytest.param((("turn/start", "x"), step_start()), id="turn-start-data-string"),
        pytest.param(
            (
                turn_start(),
                ("user/message", None),
                ("user/message", {"source": "user"}),
                ("user/message", {"source": None}),
                ("user/message", 7),
                reading(),
                step_start(),
            ),
            id="malformed-user-messages",
        ),
        pytest.param(
            (turn_start({"a": 1}), user(BERLIN), reading(), step_start([1])),
            id="unhashable-turn-ids",
        ),
    ],
)
def test_malformed_events_contribute_nothing(specs: tuple[Spec, ...]) -> None:
    # given non-Schedule events of unexpected shapes / when the context is derived
    context = derive_zone_context(session(*specs))
    # then nothing raises and the zone is not confirmed
    assert context.client_zones == ()
    assert confirmation(session(*specs))["code"] == "timezone_confirmation_required"


def test_derived_context_fields() -> None:
    # given an open turn with a reading and two distinct client zones
    s = session(turn_start(7), user(TOKYO), user(BERLIN), user(TOKYO), reading(), step_start(7))
    # then the context lists them sorted and unique
    assert derive_zone_context(s) == ZoneContext(
        session_zone=BERLIN, client_zones=(TOKYO, BERLIN), has_reading=True
    )


def test_no_reading_means_no_client_zones() -> None:
    s = session(turn_start(), user(BERLIN), step_start())
    assert derive_zone_context(s) == ZoneContext(session_zone=BERLIN)


def test_open_turn_starts_at_the_last_turn_start_of_that_turn() -> None:
    # given a turn id that was started twice (a resumed turn)
    s = session(
        turn_start(1), user(NEW_YORK), turn_start(1), user(BERLIN), reading(), step_start(1)
    )
    # then the open turn begins at the later turn/start, and only its zones count
    assert open_turn_start(s.events) == 2
    assert implicit_zone(derive_zone_context(s)) == BERLIN


def test_an_open_turn_copied_from_a_fork_parent_confirms_nothing() -> None:
    """A fork's own suffix holds no turn: the parent's open turn is not the child's."""
    parent = session(turn_start(), user(), reading(), step_start())
    assert implicit_zone(derive_zone_context(parent)) == BERLIN
    child = Session(
        header=SessionHeader(id="child", createdAt=0, timeZone=BERLIN, parentSession="s",
                             seedLength=len(parent.events)),
        events=parent.events,
    )
    with pytest.raises(ToolError) as caught:
        implicit_zone(derive_zone_context(child))
    assert caught.value.code == "timezone_confirmation_required"
