"""The web console in a real browser (Playwright on Debian's Chromium), against an
embedded console served from a thread (docs/web.md).

Each page's screenshot is saved under ``test-artifacts/web/``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from dsh_schedule.shared.core.instant import format_instant, to_ms
from tests.support import reminder_texts
from tests.web.conftest import ARTIFACTS, TOKEN, Served

pytestmark = pytest.mark.browser

SHANGHAI = "Asia/Shanghai"
ARRIVAL_S = 20  # the longest a due reminder may take to show up


def open_page(browser: Browser, zone: str) -> Page:
    context = browser.new_context(timezone_id=zone, viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    return page


def dialogs_of(page: Page) -> list[str]:
    """Every dialog the page opens (an ``alert`` would be script that ran), dismissed."""
    seen: list[str] = []

    def record(dialog: object) -> None:
        seen.append(dialog.message)  # type: ignore[attr-defined]
        dialog.dismiss()  # type: ignore[attr-defined]

    page.on("dialog", record)
    return seen


def send(page: Page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def user_events(served: Served, session: str) -> list[dict[str, object]]:
    return [e.data for e in served.console.store.read(session).events
            if e.type == "user/message" and e.data["source"].get("kind") == "user"]


def test_a_session_created_in_the_browser_takes_the_browsers_zone(
        served: Served, browser: Browser, artifacts: Path) -> None:
    page = open_page(browser, SHANGHAI)
    page.goto(served.url)
    zone_field = page.locator("input[name=timeZone]")
    expect(zone_field).to_have_value(SHANGHAI)
    page.fill("input[name=id]", "from-shanghai")
    page.click("#create-session button")
    page.wait_for_url("**/session/from-shanghai")
    expect(page.locator("#session-zone")).to_have_text(SHANGHAI)
    assert served.console.store.read("from-shanghai").header.timeZone == SHANGHAI

    page.goto(served.url)
    row = page.locator('tr[data-session="from-shanghai"]')
    expect(row).to_contain_text(SHANGHAI)
    page.screenshot(path=artifacts / "sessions.png", full_page=True)


def test_a_zone_the_browser_cannot_have_is_refused(served: Served, browser: Browser) -> None:
    page = open_page(browser, SHANGHAI)
    page.goto(served.url)
    page.fill("input[name=id]", "nowhere")
    page.fill("input[name=timeZone]", "Mars/Olympus_Mons")
    page.click("#create-session button")
    expect(page.locator("#create-error")).to_contain_text("not a time zone")
    assert not served.console.exists("nowhere")


def test_a_reminder_arrives_without_a_reload(
        served: Served, browser: Browser, artifacts: Path) -> None:
    served.console.create_session("live", "Europe/Berlin")
    page = open_page(browser, "Europe/Berlin")
    page.goto(served.at("/session/live"))
    page.evaluate("window.__sameDocument = true")

    send(page, "remind me in 3 seconds to stretch")
    expect(page.locator("#reminders tr[data-schedule-id=schedule-1]")).to_contain_text("stretch")
    reminder = page.locator("#transcript .msg.reminder")
    expect(reminder.locator(".reminder-prompt")).to_have_text("stretch", timeout=ARRIVAL_S * 1000)

    # The same document all along: the reminder came over the live stream.
    assert page.evaluate("window.__sameDocument") is True
    # The prompt carried the browser's zone.
    assert user_events(served, "live")[0]["source"]["clientTimeZone"] == "Europe/Berlin"
    # The exact framing is one click away, and it is the frame in the log.
    reminder.locator("summary").click()
    frame = reminder.locator("pre.frame")
    expect(frame).to_be_visible()
    assert frame.inner_text() == reminder_texts(served.console.store, "live")[0]
    assert 'reminder_prompt_json: "stretch"' in frame.inner_text()
    # The receipt of the dispatch, labelled session-local; nothing is active any more.
    receipt = page.locator("#receipts .receipt").first
    expect(receipt.locator(".label")).to_have_text("session-local")
    assert json.loads(receipt.locator("pre").inner_text())["prompt"] == "stretch"
    expect(page.locator("#reminders")).to_contain_text("No active reminders")

    send(page, "every 5 minutes check the build")
    expect(page.locator("#reminders tr[data-schedule-id=schedule-2]")).to_contain_text(
        "check the build")
    expect(page.locator("#reminders tr[data-schedule-id=schedule-2] .countdown")).to_contain_text(
        "in ")
    page.screenshot(path=artifacts / "session.png", full_page=True)


def test_a_local_time_without_a_zone_is_confirmed_by_the_browsers_zone(
        served: Served, browser: Browser) -> None:
    served.console.create_session("office", SHANGHAI)
    page = open_page(browser, SHANGHAI)
    page.goto(served.at("/session/office"))
    target = (datetime.now(ZoneInfo(SHANGHAI)) + timedelta(hours=2)).replace(
        second=0, microsecond=0)
    send(page, f"at {target:%H:%M} call the office")

    row = page.locator("#reminders tr[data-schedule-id=schedule-1]")
    expect(row).to_contain_text("call the office")
    expect(row).to_contain_text(f"{target:%H:%M}:00 {SHANGHAI}")
    expect(page.locator("#transcript .msg.assistant").last).to_contain_text("Set schedule-1")
    events = served.console.store.read("office").events
    call = next(e.data for e in events if e.type == "tool/call")
    assert call["args"]["at"] == {"date": target.date().isoformat(),
                                  "time": f"{target:%H:%M}:00"}  # no time_zone
    created = next(e.data for e in events if e.type == "schedule/change")
    assert created["schedule"]["scheduledAt"] == format_instant(to_ms(target))
    readings = [e for e in events if e.type == "user/message"
                and e.data["source"].get("plugin") == "time-context"]
    assert len(readings) == 1


def test_a_local_time_from_a_browser_in_another_zone_asks_for_the_zone(
        served: Served, browser: Browser) -> None:
    served.console.create_session("office", SHANGHAI)
    page = open_page(browser, "America/New_York")
    page.goto(served.at("/session/office"))
    send(page, "at 17:00 call the office")
    answer = page.locator("#transcript .msg.assistant").last
    expect(answer).to_contain_text("timezone_confirmation_required")
    expect(answer).to_contain_text("America/New_York")
    expect(page.locator("#reminders")).to_contain_text("No active reminders")

    send(page, f"at 17:00 in {SHANGHAI} call the office")
    expect(page.locator("#reminders tr[data-schedule-id=schedule-1]")).to_contain_text(
        f"17:00:00 {SHANGHAI}")


def test_a_prompt_is_shown_as_text_and_runs_nothing(served: Served, browser: Browser) -> None:
    served.console.create_session("escape", "UTC")
    page = open_page(browser, "UTC")
    dialogs = dialogs_of(page)
    page.goto(served.at("/session/escape"))

    hostile = "<img src=x onerror=alert(1)>"
    send(page, hostile)
    shown = page.locator("#transcript .msg.user .text").last
    expect(shown).to_have_text(hostile)
    send(page, "remind me in 1 second to <script>alert(2)</script><b onclick=alert(3)>x</b>")
    prompt = page.locator("#transcript .msg.reminder .reminder-prompt")
    expect(prompt).to_have_text("<script>alert(2)</script><b onclick=alert(3)>x</b>",
                                timeout=ARRIVAL_S * 1000)
    page.reload()  # rendered by the page itself, not the live stream, this time
    expect(page.locator("#transcript .msg.user .text").first).to_have_text(hostile)
    for region in ("#transcript", "#reminders", "#receipts"):
        assert page.locator(f"{region} img, {region} script, {region} b").count() == 0
    page.wait_for_timeout(500)
    assert dialogs == []

    # The check above would have seen script that ran: markup inserted as HTML does.
    page.evaluate("document.body.insertAdjacentHTML('beforeend', '<img src=x onerror=alert(9)>')")
    page.wait_for_timeout(500)
    assert dialogs == ["9"]


def test_the_operations_page_shows_the_status_and_the_lateness_of_deliveries(
        served: Served, browser: Browser, artifacts: Path) -> None:
    served.console.create_session("ops", "UTC")
    page = open_page(browser, "UTC")
    page.goto(served.at("/session/ops"))
    send(page, "remind me in 1 second to drink water")
    expect(page.locator("#transcript .msg.reminder")).to_have_count(1, timeout=ARRIVAL_S * 1000)

    page.goto(served.at("/operations"))
    figures = page.locator("#status-figures")
    expect(figures).to_contain_text("live agents")
    expect(figures.locator("tr", has_text="live agents")).to_contain_text("1")
    expect(page.locator("#health")).to_be_visible()
    expect(page.locator("#lateness-summary")).to_contain_text("median")
    counts = [int(text) for text in page.locator("#lateness td.num").all_inner_texts()]
    assert sum(counts) == 1
    page.screenshot(path=artifacts / "operations.png", full_page=True)


def test_with_a_token_a_browser_signs_in_once_and_the_live_page_works(
        served_with_token: Served, browser: Browser) -> None:
    served = served_with_token
    served.console.create_session("guarded", "Europe/Berlin")
    page = open_page(browser, "Europe/Berlin")
    # Without the cookie, a page is the sign-in form, and a wrong token is said to be so.
    page.goto(served.at("/session/guarded"))
    expect(page.locator("form#login")).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("guarded")
    page.fill("#token", "not-the-token-at-all")
    page.click("form#login button")
    expect(page.locator("#login-error")).to_contain_text("not the console's token")
    page.fill("#token", TOKEN)
    page.click("form#login button")
    page.wait_for_url(served.url)
    expect(page.locator('tr[data-session="guarded"]')).to_be_visible()
    # The cookie carries the scripts, the forms and the live stream.
    page.goto(served.at("/session/guarded"))
    page.evaluate("window.__sameDocument = true")
    send(page, "remind me in 2 seconds to stretch")
    reminder = page.locator("#transcript .msg.reminder")
    expect(reminder.locator(".reminder-prompt")).to_have_text("stretch", timeout=ARRIVAL_S * 1000)
    assert page.evaluate("window.__sameDocument") is True


# The documentation's screenshots: written where DSH_SCHEDULE_DOC_IMAGES names (to refresh
# docs/images/, docs/web.md#tests), else beside the other artifacts; a test run never
# changes the checkout.
DOC_IMAGES = Path(os.environ.get("DSH_SCHEDULE_DOC_IMAGES") or ARTIFACTS / "doc-images")


def delete_from_the_page(page: Page, schedule_id: str) -> None:
    """Click a row's Delete button as a person would: a live update may replace the
    reminders table between finding the button and the click, which loses the click, so
    a click that changed nothing is made again on the new button (at most three times;
    the test's log check below still requires exactly one delete)."""
    button = page.locator(f"#reminders tr[data-schedule-id={schedule_id}] button")
    for _ in range(3):
        button.click()
        try:
            expect(page.locator("#act-result")).to_have_text(
                f"Deleted {schedule_id}.", timeout=5000)
            return
        except AssertionError:
            if button.count() == 0:
                return  # deleted: the final expectations say how


def test_a_reminder_is_created_and_deleted_from_the_page(
        served: Served, browser: Browser) -> None:
    served.console.create_session("acting", "Europe/Berlin")
    page = open_page(browser, "Europe/Berlin")
    page.goto(served.at("/session/acting"))
    # A valid form: the tool's acknowledgement, in words, and the row appears.
    page.fill("#reminder-prompt", "stretch " + "and breathe slowly " * 12)
    page.fill("input[name=every_seconds]", "600")
    page.click("#create-reminder button")
    expect(page.locator("#act-result")).to_contain_text("Set schedule-1")
    row = page.locator("#reminders tr[data-schedule-id=schedule-1]")
    expect(row).to_contain_text("breathe slowly")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    # A bad one: the tool's own error, and no new reminder.
    page.fill("#reminder-prompt", "too often")
    page.fill("input[name=every_seconds]", "60")
    page.click("#create-reminder button")
    expect(page.locator("#act-result")).to_contain_text("frequency_too_high")
    expect(page.locator("#reminders tbody tr")).to_have_count(1)
    # An at time is the browser's local time in the browser's zone.
    page.fill("#reminder-prompt", "call the office")
    page.fill("input[name=at]", "2099-01-02T17:00")
    page.click("#create-reminder button")
    expect(page.locator("#reminders tr[data-schedule-id=schedule-2]")).to_contain_text(
        "17:00:00 Europe/Berlin")
    expect(page.locator("#transcript .msg.tool dl.answer").last).to_contain_text("scheduledAt")
    page.screenshot(path=DOC_IMAGES / "console-session.png", full_page=True)
    # Delete: the row goes, and the tool says so.
    delete_from_the_page(page, "schedule-1")
    expect(page.locator("#act-result")).to_have_text("Deleted schedule-1.")
    expect(page.locator("#reminders tr[data-schedule-id=schedule-1]")).to_have_count(0)
    operations = [e.data["operation"] for e in served.console.store.read("acting").events
                  if e.type == "schedule/change"]
    assert operations == ["create", "create", "delete"]
    page.screenshot(path=DOC_IMAGES / "console-reminders.png", full_page=True)


def test_the_embedded_operations_page_tells_one_story(
        served: Served, browser: Browser) -> None:
    served.console.create_session("ops", "UTC")
    page = open_page(browser, "UTC")
    page.goto(served.at("/operations"))
    expect(page.locator("#health")).to_contain_text("run inside this process")
    expect(page.locator("#health")).to_have_class("health ok")
    expect(page.locator("table.queues")).not_to_contain_text("none registered")
    # What a person reads (the raw status JSON stays folded away, as rq sees it).
    assert "no worker" not in page.locator("main").inner_text()
    response = page.request.get(served.at("/favicon.ico"))
    assert response.status == 200
    page.screenshot(path=DOC_IMAGES / "console-operations.png", full_page=True)
    page.goto(served.url)
    page.screenshot(path=DOC_IMAGES / "console-sessions.png", full_page=True)


def click_in_row(page: Page, schedule_id: str, label: str, said: str) -> None:
    """Click a row's button as ``delete_from_the_page`` does (again when a live update
    replaced the table under the click and nothing happened), until the acknowledgement
    starts with ``said``."""
    button = page.locator(f"#reminders tr[data-schedule-id={schedule_id}] button",
                          has_text=label)
    for _ in range(3):
        button.click()
        try:
            expect(page.locator("#act-result")).to_contain_text(said, timeout=5000)
            return
        except AssertionError:
            if button.count() == 0:
                return  # the row changed: the final expectations say how


def test_with_the_lifecycle_on_a_reminder_is_edited_paused_and_resumed_from_the_page(
        served_lifecycle: Served, browser: Browser, artifacts: Path) -> None:
    served = served_lifecycle
    served.console.create_session("life", "Europe/Berlin")
    page = open_page(browser, "Europe/Berlin")
    page.goto(served.at("/session/life"))
    # A recurring reminder with an end: three deliveries in all.
    page.fill("#reminder-prompt", "water the plants")
    page.fill("#create-reminder input[name=every_seconds]", "600")
    page.fill("#create-reminder input[name=count]", "3")
    page.click("#create-reminder button[type=submit]")
    expect(page.locator("#act-result")).to_contain_text("Set schedule-1")
    row = page.locator("#reminders tr[data-schedule-id=schedule-1]")
    expect(row).to_contain_text("0 of 3 delivered")
    # Pause: the row says paused and offers Resume; resume: scheduled again.
    click_in_row(page, "schedule-1", "Pause", "Paused schedule-1")
    expect(row.locator(".state")).to_have_text("paused")
    click_in_row(page, "schedule-1", "Resume", "Resumed schedule-1")
    expect(row.locator(".state")).to_have_text("scheduled")
    # Edit: the row's button fills the form with its id and prompt; a new prompt and
    # timing are saved under the same id.
    click_edit = row.locator("button", has_text="Edit")
    click_edit.click()
    expect(page.locator("#edit-id")).to_have_value("schedule-1")
    expect(page.locator("#edit-prompt")).to_have_value("water the plants")
    page.fill("#edit-prompt", "water the ferns")
    page.fill("#edit-reminder input[name=every_seconds]", "900")
    page.click("#edit-reminder button[type=submit]")
    expect(page.locator("#act-result")).to_contain_text("Updated schedule-1")
    expect(row).to_contain_text("water the ferns")
    expect(row).to_contain_text("every 900 s")
    # An edit that changes nothing is the tool's own error, and writes nothing.
    page.fill("#edit-prompt", "")
    page.check("#edit-reminder input[value=keep]")
    page.click("#edit-reminder button[type=submit]")
    expect(page.locator("#act-result")).to_contain_text("schedule_update answered invalid_selector")
    records = [e.data for e in served.console.store.read("life").events
               if e.type == "schedule/change"]
    assert [r["operation"] for r in records] == ["create", "update", "update", "update"]
    assert records[1] == {"version": 2, "operation": "update", "id": "schedule-1",
                          "paused": True}
    assert records[3]["prompt"] == "water the ferns"
    assert records[3]["everySeconds"] == 900
    page.screenshot(path=artifacts / "session-lifecycle.png", full_page=True)


def test_a_rows_button_is_acknowledged_when_a_live_update_replaced_its_row_meanwhile(
        served: Served, browser: Browser) -> None:
    # given a reminder, and its Delete post held on its way to the console
    served.console.create_session("race", "UTC")
    served.console.prompt("race", "every 5 minutes check the build", None)
    page = open_page(browser, "UTC")
    page.goto(served.at("/session/race"))
    held: list[Route] = []
    page.route("**/delete/race", lambda route: held.append(route))
    page.locator("#reminders tr[data-schedule-id=schedule-1] button").click()
    for _ in range(100):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the delete was never posted"

    # when a live update replaces the reminders table (and the form that posted) before
    # the answer comes
    page.evaluate("(() => { const r = document.getElementById('reminders');"
                  " r.innerHTML = r.innerHTML; })()")
    held[0].continue_()

    # then the tool's answer is still shown beside the forms
    expect(page.locator("#act-result")).to_have_text("Deleted schedule-1.")
    operations = [e.data["operation"] for e in served.console.store.read("race").events
                  if e.type == "schedule/change"]
    assert operations == ["create", "delete"]
