"""The web console over plain HTTP: forms, refusals, the live stream, the status JSON."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.web.console import ConsoleError, create_call, update_call
from dsh_schedule.web.model import ToolCall
from tests.support import wait_until
from tests.web.conftest import ROOT, Served

HOSTILE = "<img src=x onerror=alert(1)>"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def call(url: str, form: dict[str, str] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    data = None if form is None else urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {})
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def test_creating_a_session_validates_the_zone_and_the_id(served: Served) -> None:
    status, headers, _ = call(served.at("/sessions"), {"id": "s1", "timeZone": "Asia/Shanghai"})
    assert status == 303 and headers["location"] == "/session/s1"
    assert served.console.store.read("s1").header.timeZone == "Asia/Shanghai"

    for zone in ("Mars/Olympus_Mons", "Etc/GMT+5", "EST", "", "+01:00"):
        status, _, body = call(served.at("/sessions"), {"id": "s2", "timeZone": zone})
        assert status == 400, zone
        assert "not a time zone Schedule accepts" in body
    status, _, body = call(served.at("/sessions"), {"id": "../escape", "timeZone": "UTC"})
    assert status == 400 and "a session id is" in body
    status, _, body = call(served.at("/sessions"), {"id": "s1", "timeZone": "UTC"})
    assert status == 400 and "already exists" in body
    assert served.console.store.sessions() == ["s1"]

    status, headers, _ = call(served.at("/sessions"), {"id": "", "timeZone": "UTC"})
    assert status == 303 and headers["location"].startswith("/session/web-")


def test_a_form_from_another_site_is_refused(served: Served) -> None:
    served.console.create_session("s", "UTC")
    length = served.console.length("s")
    for headers in ({"Origin": "http://elsewhere.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Origin": "null"}):
        status, _, _ = call(served.at("/prompt/s"), {"text": "list"}, headers)
        assert status == 403, headers
        status, _, _ = call(served.at("/sessions"), {"id": "x", "timeZone": "UTC"}, headers)
        assert status == 403, headers
    assert served.console.length("s") == length
    assert not served.console.exists("x")
    # The console's own pages post with their own origin.
    status, _, _ = call(served.at("/prompt/s"), {"text": "list"},
                        {"Origin": served.url.rstrip("/")})
    assert status == 303
    assert served.console.length("s") > length


def test_a_prompt_is_escaped_in_the_page_and_in_the_fragment(served: Served) -> None:
    served.console.create_session("s", "UTC")
    status, _, fragment = call(served.at("/prompt/s"),
                               {"text": HOSTILE, "clientTimeZone": "UTC"}, {"HX-Request": "true"})
    assert status == 200
    status, _, page = call(served.at("/session/s"))
    assert status == 200
    for html in (fragment, page):
        assert HOSTILE not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html
    user = [e.data for e in served.console.store.read("s").events if e.type == "user/message"]
    assert user[0]["content"][0]["text"] == HOSTILE
    assert user[0]["source"]["clientTimeZone"] == "UTC"


def test_a_browser_zone_schedule_does_not_accept_is_not_recorded(served: Served) -> None:
    served.console.create_session("s", "UTC")
    call(served.at("/prompt/s"), {"text": "list", "clientTimeZone": "Etc/Unknown"})
    [user] = [e.data for e in served.console.store.read("s").events
              if e.type == "user/message" and e.data["source"]["kind"] == "user"]
    assert "clientTimeZone" not in user["source"]


def test_bad_prompts_and_unknown_sessions(served: Served) -> None:
    served.console.create_session("s", "UTC")
    status, _, body = call(served.at("/prompt/s"), {"text": "   "}, {"HX-Request": "true"})
    assert (status, body) == (400, "the prompt is empty")
    status, _, body = call(served.at("/prompt/nope"), {"text": "list"})
    assert status == 400 and "does not exist" in body
    status, _, body = call(served.at("/session/nope"))
    assert status == 404 and "No such session" in body
    status, _, _ = call(served.at("/stream/session/nope"))
    assert status == 404


def test_the_live_stream_sends_the_fragments_of_a_session(served: Served) -> None:
    served.console.create_session("s", "UTC")
    served.console.prompt("s", "remind me in 1 second to stretch", "UTC")
    assert wait_until(lambda: any(e.type == "schedule/change" and
                                  e.data.get("operation") == "dispatch"
                                  for e in served.console.store.read("s").events), 20)
    with urllib.request.urlopen(served.at("/stream/session/s"), timeout=30) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        seen: dict[str, list[str]] = {}
        event = None
        while len(seen) < 3:
            line = stream.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[len("event: "):]
                seen[event] = []
            elif line.startswith("data: ") and event is not None:
                seen[event].append(line[len("data: "):])
            elif not line:
                event = None
        assert set(seen) == {"transcript", "receipts", "reminders"}
        assert any("stretch" in line for line in seen["transcript"])


def test_the_status_json_is_what_status_reads(served: Served) -> None:
    served.console.create_session("s", "UTC")
    status, headers, body = call(served.at("/api/status"))
    assert status == 200 and headers["content-type"] == "application/json"
    value = json.loads(body)
    assert value["prefix"] == served.console.settings.prefix
    assert value["liveAgents"] == 1
    assert value["queues"][0]["name"] == served.console.settings.queue
    status, _, page = call(served.at("/operations"))
    assert status == 200 and 'id="lateness"' in page


def test_the_next_wakes_are_times_the_browser_shows_in_its_zone(served: Served) -> None:
    """A next wake carries its instant for the page's script, which shows it in the
    browser's zone, and a countdown, as the sessions page's next due time does."""
    served.console.create_session("w", "UTC")
    status, _, _ = call(served.at("/create/w"), {
        "prompt": "stretch", "selector": "after_seconds", "after_seconds": "600"})
    assert status == 303
    due = wait_until_wake(served)
    _, _, page = call(served.at("/operations/figures"))
    due_ms = parse_instant(due)
    assert (f'<time datetime="{due}" data-local-ms="{due_ms}"' in page
            and f'<span class="countdown" data-due-ms="{due_ms}">' in page)
    script = (ROOT / "dsh_schedule/web/static/console.js").read_text()
    assert "[data-local-ms]" in script and "[data-due-ms]" in script


def wait_until_wake(served: Served) -> str:
    found: list[str] = []

    def scheduled() -> bool:
        _, _, body = call(served.at("/api/status"))
        found[:] = [w["due"] for w in json.loads(body)["nextWakes"]]
        return bool(found)

    wait_until(scheduled)
    return found[0]


def test_a_log_that_cannot_be_read_is_said_to_be_unreadable(served: Served) -> None:
    served.console.create_session("broken", "UTC")
    path = served.console.store.path("broken")
    with path.open("a", encoding="utf-8") as log:
        log.write("this is no event\n")
        log.write(json.dumps({"type": "turn/start", "seq": 1, "time": 0,
                              "data": {"turn": 1}}) + "\n")
    status, _, page = call(served.at("/session/broken"))
    assert status == 500 and "cannot be read" in page
    status, _, page = call(served.at("/"))
    assert status == 200
    assert 'data-session="broken"' in page and 'class="error"' in page


def schedules(served: Served, session: str) -> list[dict[str, Any]]:
    return [e.data for e in served.console.store.read(session).events
            if e.type == "schedule/change"]


def test_the_create_form_calls_the_tool_and_answers_with_its_acknowledgement(
        served: Served) -> None:
    served.console.create_session("form", "UTC")
    status, headers, _ = call(served.at("/create/form"), {
        "prompt": "stretch", "selector": "after_seconds", "after_seconds": "600",
        "clientTimeZone": "Europe/Berlin"})
    assert status == 303 and headers["location"] == "/session/form"
    created = schedules(served, "form")
    assert [c["operation"] for c in created] == ["create"]
    assert created[0]["schedule"]["prompt"] == "stretch"

    status, headers, body = call(served.at("/create/form"), {
        "prompt": "call", "selector": "at", "at": "2099-01-02T17:00",
        "clientTimeZone": "Asia/Shanghai"}, {"HX-Request": "true"})
    assert status == 200
    ack = urllib.parse.unquote(headers["x-acknowledgement"])
    assert ack.startswith("Set schedule-2: “call” at 2099-01-02")
    assert "Set schedule-2" in body
    tool_calls = [e.data for e in served.console.store.read("form").events
                  if e.type == "tool/call"]
    assert tool_calls[-1]["args"] == {"prompt": "call", "at": {
        "date": "2099-01-02", "time": "17:00:00", "time_zone": "Asia/Shanghai"}}


def test_a_bad_create_form_gets_the_tools_error_and_changes_no_reminder(
        served: Served) -> None:
    served.console.create_session("bad", "UTC")
    for form, code in (
        ({"prompt": "x", "selector": "after_seconds", "after_seconds": "soon"},
         "invalid_rule"),
        ({"prompt": "x", "selector": "every_seconds", "every_seconds": "60"},
         "frequency_too_high"),
        ({"prompt": "x", "selector": "at", "at": "tomorrow"}, "invalid_rule"),
        ({"prompt": "x" * 33_000, "selector": "after_seconds", "after_seconds": "5"},
         "invalid_prompt"),
        ({"prompt": "", "selector": "after_seconds", "after_seconds": "5"}, "invalid_prompt"),
    ):
        status, headers, _ = call(served.at("/create/bad"), form, {"HX-Request": "true"})
        assert status == 200, form
        ack = urllib.parse.unquote(headers["x-acknowledgement"])
        assert ack.startswith("schedule_create answered "), ack
        assert f"answered {code}:" in ack
    assert schedules(served, "bad") == []

    length = served.console.length("bad")
    for form in ({"prompt": "x", "selector": "cron", "cron": "0 9 * * *"},
                 {"prompt": "x", "selector": "both", "after_seconds": "5"}, {}):
        status, _, body = call(served.at("/create/bad"), form, {"HX-Request": "true"})
        assert status == 400 and "the selector is one of" in body, form
    status, _, body = call(served.at("/create/nowhere"), {
        "prompt": "x", "selector": "after_seconds", "after_seconds": "5"})
    assert status == 400 and "does not exist" in body
    assert served.console.length("bad") == length


def test_the_delete_button_calls_the_tool_and_says_what_it_answered(served: Served) -> None:
    served.console.create_session("del", "UTC")
    served.console.prompt("del", "every 5 minutes check the build", None)
    status, headers, _ = call(served.at("/delete/del"), {"id": "schedule-1"},
                              {"HX-Request": "true"})
    assert status == 200
    assert urllib.parse.unquote(headers["x-acknowledgement"]) == "Deleted schedule-1."
    assert [c["operation"] for c in schedules(served, "del")] == ["create", "delete"]

    status, headers, _ = call(served.at("/delete/del"), {"id": "schedule-1"},
                              {"HX-Request": "true"})
    assert status == 200
    said = urllib.parse.unquote(headers["x-acknowledgement"])
    assert said.startswith("schedule-1 is not an active reminder")
    assert len(schedules(served, "del")) == 2


def test_the_forms_are_refused_from_another_site(served: Served) -> None:
    served.console.create_session("csrf", "UTC")
    served.console.prompt("csrf", "every 5 minutes check the build", None)
    length = served.console.length("csrf")
    for path, form in (("/create/csrf", {"prompt": "x", "selector": "after_seconds",
                                         "after_seconds": "5"}),
                       ("/delete/csrf", {"id": "schedule-1"}),
                       ("/update/csrf", {"id": "schedule-1", "paused": "true"})):
        for headers in ({"Origin": "http://elsewhere.example"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Origin": "null"}):
            status, _, _ = call(served.at(path), form, headers)
            assert status == 403, (path, headers)
    assert served.console.length("csrf") == length


def test_the_favicon_is_served(served: Served) -> None:
    status, headers, body = call(served.at("/favicon.ico"))
    assert status == 200 and headers["content-type"].startswith("image/svg+xml")
    assert body.startswith("<svg")



def test_the_create_form_offers_cron_only_with_calendar_rules() -> None:
    form = {"prompt": "stand-up", "selector": "cron", "cron": "0 9 * * MON-FRI",
            "clientTimeZone": "Europe/Berlin"}
    assert create_call(form, calendar=True).args == {
        "prompt": "stand-up", "cron": {"expression": "0 9 * * MON-FRI",
                                       "time_zone": "Europe/Berlin"}}
    with pytest.raises(ConsoleError, match="one of after_seconds, at, every_seconds$"):
        create_call(form, calendar=False)


def test_the_sessions_page_lists_every_sessions_reminders_with_a_filter(
        served: Served) -> None:
    for session, prompt, at in (("north", "water the plants", "2099-01-02T17:00"),
                                ("south", "call the office", "2099-03-01T09:00")):
        served.console.create_session(session, "UTC")
        status, _, _ = call(served.at(f"/create/{session}"), {
            "prompt": prompt, "selector": "at", "at": at, "clientTimeZone": "UTC"})
        assert status == 303
    status, _, page = call(served.at("/"))
    assert status == 200 and 'id="reminder-filter"' in page
    assert listed(page) == [("north", "schedule-1"), ("south", "schedule-1")]
    assert "water the plants" in page and "call the office" in page

    _, _, page = call(served.at("/?q=OFFICE"))
    assert listed(page) == [("south", "schedule-1")]
    # The north reminder is due at 2099-01-02T17:00Z, 2099-01-03 01:00 in Shanghai.
    query = urllib.parse.urlencode({"due_before": "2099-01-03T01:00", "zone": "Asia/Shanghai"})
    _, _, page = call(served.at(f"/?{query}"))
    assert listed(page) == [] and "No active reminders pass the filter." in page
    query = urllib.parse.urlencode({"due_before": "2099-01-03T01:00:01",
                                    "zone": "Asia/Shanghai"})
    _, _, page = call(served.at(f"/?{query}"))
    assert listed(page) == [("north", "schedule-1")]

    status, _, page = call(served.at("/?due_before=tonight"))
    assert status == 400 and 'id="filter-error"' in page and "is not a local date" in page


def test_a_session_that_cannot_be_listed_is_named_above_the_reminders(served: Served) -> None:
    served.console.create_session("broken", "UTC")
    with served.console.store.path("broken").open("a", encoding="utf-8") as log:
        log.write("this is no event\n")
    status, _, page = call(served.at("/?q=" + urllib.parse.quote(HOSTILE)))
    assert status == 200 and 'data-unreadable="broken"' in page and HOSTILE not in page


def listed(page: str) -> list[tuple[str, str]]:
    """The (session, id) of each row of the sessions page's list across sessions."""
    table = page.split('id="all-reminders"', 1)[1]
    return re.findall(r'<tr data-session="([^"]+)" data-schedule-id="([^"]+)"', table)


def test_the_create_form_sends_count_and_until_only_with_the_lifecycle_on() -> None:
    form = {"prompt": "water", "selector": "every_seconds", "every_seconds": "600",
            "count": "3", "until": "2099-01-02T17:00", "clientTimeZone": "Europe/Berlin"}
    assert create_call(form, calendar=False, lifecycle=True).args == {
        "prompt": "water", "every_seconds": 600, "count": 3,
        "until": {"date": "2099-01-02", "time": "17:00:00", "time_zone": "Europe/Berlin"}}
    assert create_call(form, calendar=False).args == {"prompt": "water", "every_seconds": 600}
    blank = {**form, "count": " ", "until": ""}
    assert create_call(blank, calendar=False, lifecycle=True).args == {
        "prompt": "water", "every_seconds": 600}


@pytest.mark.parametrize(("form", "args"), [
    ({"id": "schedule-2", "paused": "true"}, {"id": "schedule-2", "paused": True}),
    ({"id": "schedule-2", "paused": "false", "selector": "keep"},
     {"id": "schedule-2", "paused": False}),
    ({"id": "schedule-2", "prompt": "  ", "selector": "after_seconds", "after_seconds": "90"},
     {"id": "schedule-2", "after_seconds": 90}),
    ({"id": "schedule-2", "prompt": "water", "count": "many"},
     {"id": "schedule-2", "prompt": "water", "count": "many"}),  # the tool judges it
    ({"id": "schedule-2", "selector": "at", "at": "2099-01-02T17:00:30",
      "clientTimeZone": "Asia/Shanghai"},
     {"id": "schedule-2", "at": {"date": "2099-01-02", "time": "17:00:30",
                                 "time_zone": "Asia/Shanghai"}}),
    ({"id": ""}, {"id": ""}),  # no change: the tool answers it
])
def test_the_edit_form_and_the_pause_buttons_send_only_what_they_change(
        form: dict[str, str], args: dict[str, Any]) -> None:
    assert update_call(form, calendar=False) == ToolCall("schedule_update", args)


def test_the_edit_form_refuses_what_it_does_not_offer() -> None:
    with pytest.raises(ConsoleError, match="the selector is one of"):
        update_call({"id": "schedule-1", "selector": "cron", "cron": "0 9 * * *"},
                    calendar=False)
    with pytest.raises(ConsoleError, match="paused is true or false"):
        update_call({"id": "schedule-1", "paused": "maybe"}, calendar=False)


def test_the_update_route_calls_the_tool_with_the_lifecycle_on_and_refuses_it_off(
        served_off: Served, served_lifecycle: Served) -> None:
    # given a recurring reminder in a console with the lifecycle on
    on = served_lifecycle
    on.console.create_session("life", "UTC")
    on.console.prompt("life", "every 5 minutes check the build", None)

    # when its pause button posts, then the tool's resume, then an unknown id
    answers = []
    for form in ({"id": "schedule-1", "paused": "true"}, {"id": "schedule-1", "paused": "false"},
                 {"id": "schedule-9", "paused": "true"}):
        status, headers, _ = call(on.at("/update/life"), form, {"HX-Request": "true"})
        assert status == 200
        answers.append(urllib.parse.unquote(headers["x-acknowledgement"]))

    # then each acknowledgement is the tool's answer in words, one update record each
    assert answers[0].startswith("Paused schedule-1: “check the build” every 300 s")
    assert answers[0].endswith(", paused.")
    assert answers[1].startswith("Resumed schedule-1:")
    assert answers[2] == "schedule-9 is not an active reminder (schedule_not_found)."
    records = schedules(on, "life")
    assert [r["operation"] for r in records] == ["create", "update", "update"]
    assert records[1] == {"version": 2, "operation": "update", "id": "schedule-1",
                          "paused": True}

    # and with the lifecycle off the route writes nothing and says why
    served_off.console.create_session("plain", "UTC")
    served_off.console.prompt("plain", "every 5 minutes check the build", None)
    length = served_off.console.length("plain")
    status, _, body = call(served_off.at("/update/plain"), {"id": "schedule-1", "paused": "true"})
    assert status == 400 and "schedule_create, schedule_delete" in body
    assert served_off.console.length("plain") == length
