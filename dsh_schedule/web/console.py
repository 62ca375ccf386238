"""The web console's back end: a host for the sessions of one directory, the scripted
model's turns, and what the pages read.

Two modes:

- **embedded** (no Redis URL): the whole system in this process, as ``dsh-schedule demo``
  runs it — an in-process Redis, the reference host, a due owner behind an rq
  ``SimpleWorker`` and the mover (``EmbeddedSystem``), stepped by a background thread;
- **redis** (a Redis URL): this process is a host of a real deployment — leases for every
  session it serves and pushed delivery through the bridge (``ReferenceHost.run`` in a
  background thread); the ``worker`` and ``scheduler`` processes run beside it on the
  same session directory and queue.

A prompt is one user turn as docs/host-integration.md describes it: ``turn/start``, the
person's ``user/message`` with the browser's zone as ``clientTimeZone``, a time-context
reading, ``step/start``; then the scripted model's tool calls, and its answer.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.reference import (
    ASSISTANT_MESSAGE,
    TOOL_CALL,
    TOOL_RESULT,
    Agent,
    ReferenceHost,
)
from dsh_schedule.reminders import active_reminders
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import (
    STEP_END,
    STEP_START,
    TURN_END,
    TURN_START,
    USER_MESSAGE,
    NewEvent,
    Session,
    SessionHeader,
)
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import format_instant, to_ms
from dsh_schedule.shared.core.timesel import is_valid_zone, load_zone
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.naming import is_database_url, store_from_settings
from dsh_schedule.shared.store.port import SessionExists
from dsh_schedule.shared.transaction import retry_fenced
from dsh_schedule.status import Status, read_status, write_heartbeat
from dsh_schedule.web import model, pages

log = logging.getLogger(__name__)

STEP_S: Final = 0.05  # the embedded system is stepped this often
HEARTBEAT_EVERY_MS: Final = 1000
STEPPING_STALE_S: Final = 5.0  # an embedded system not stepped for this long is stuck
MAX_PROMPT: Final = 4000  # characters of one prompt
MAX_SESSION_ID: Final = 64
FORM_TOOLS: Final = ("schedule_create", "schedule_delete")  # what the page's forms call
LIFECYCLE_FORM_TOOLS: Final = (*FORM_TOOLS, "schedule_update")  # and with the lifecycle on
STATUS_SOCKET_TIMEOUT_S: Final = 2.0


class ConsoleError(Exception):
    """Input the console cannot use; the message is shown to the person."""


def _session_id_ok(text: str) -> bool:
    return (0 < len(text) <= MAX_SESSION_ID and text[0].isascii() and text[0].isalnum()
            and all(c.isascii() and (c.isalnum() or c in "._-") for c in text))


class Console:
    def __init__(self, settings: Settings, *, clock: Callable[[], int] | None = None,
                 step_s: float = STEP_S) -> None:
        """``clock``: an injected clock; by default Redis's, which every process shares
        (the wall clock on the embedded Redis)."""
        self.settings = settings
        injected = clock
        self.clock = clock = wall_clock_ms if injected is None else injected
        self.step_s = step_s
        self.store = store_from_settings(settings)
        self.embedded = not settings.redis_url
        self.system: EmbeddedSystem | None = None
        if settings.redis_url:
            self.client: redis.Redis = connect(settings.redis_url)
            self.coordination = Coordination(self.client, settings)
            if injected is None:
                self.clock = clock = self.coordination.clock
            self.host = ReferenceHost(self.store, self.coordination, settings, clock=clock,
                                      on_delivery=self._delivered)
            self._status_client: redis.Redis = connect(
                settings.redis_url, socket_connect_timeout=STATUS_SOCKET_TIMEOUT_S,
                socket_timeout=STATUS_SOCKET_TIMEOUT_S,
            )
        else:
            # Its worker runs in the stepping thread: signals stay the web server's.
            system = EmbeddedSystem(self.store, settings, clock=clock, sleep=time.sleep,
                                    on_delivery=self._delivered)
            self.system = system
            self.client = self._status_client = system.client
            self.coordination = system.coordination
            self.host = system.host
        self._opened: set[str] = set()
        self._open_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.closing = False  # set first when the server stops: live streams end
        self.deliveries = 0
        self.last_step_ms: int | None = None
        self._next_heartbeat_ms = 0

    @property
    def mode(self) -> str:
        return "embedded" if self.embedded else "redis"

    # -- running ------------------------------------------------------------------------

    def start(self) -> None:
        """Serve every session of the directory, then run the host in the background."""
        if not is_database_url(self.settings.store_name):
            self.settings.sessions.mkdir(parents=True, exist_ok=True)
        for session_id in self.store.sessions():
            self.open(session_id)
        if self.system is not None:
            target: Callable[[], None] = self._step_loop
        else:
            target = self._run_host
        self._thread = threading.Thread(target=target, name=f"console-{self.mode}",
                                        daemon=True)
        self._thread.start()

    def _step_loop(self) -> None:
        system = self.system
        assert system is not None
        failing = False
        while not self._stop.wait(self.step_s):
            try:
                system.step()
                now = self.clock()
                self.last_step_ms = now
                if now >= self._next_heartbeat_ms:
                    # The stepping loop is this process's mover loop: it says so the way
                    # a scheduler does (docs/architecture.md#operations).
                    write_heartbeat(self.client, self.coordination.keys,
                                    every_s=self.step_s, now_ms=now)
                    self._next_heartbeat_ms = now + HEARTBEAT_EVERY_MS
                failing = False
            except Exception:
                if not failing:
                    log.exception("the embedded system's step failed; stepping on")
                failing = True

    def step_age_s(self) -> float | None:
        """How long ago the embedded system last stepped (None: not yet, or not embedded)."""
        last = self.last_step_ms
        return None if last is None else max(self.clock() - last, 0) / 1000

    def stepping_ok(self) -> bool:
        """Whether the embedded system stepped recently enough for reminders to fire."""
        age = self.step_age_s()
        return age is not None and age <= STEPPING_STALE_S

    def _run_host(self) -> None:
        self.host.run(self._stop)

    def stop(self) -> None:
        self.closing = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.host.close()

    def _delivered(self, session_id: str, delivery: Delivery) -> None:
        self.deliveries += 1
        log.info("%s: reminder delivered in turn %d", session_id, delivery.turn)

    # -- sessions -----------------------------------------------------------------------

    def open(self, session_id: str) -> Agent:
        """The root agent of a session this console serves (installed on first use)."""
        with self._open_lock:
            if session_id not in self._opened:
                self.host.open_root(session_id)
                self._opened.add(session_id)
            return self.host.agents[session_id]

    def sessions(self) -> list[str]:
        return self.store.sessions()

    def exists(self, session_id: str) -> bool:
        try:
            return self.store.exists(session_id)
        except ValueError:
            return False

    def new_session_id(self) -> str:
        now = datetime.fromtimestamp(self.clock() / 1000)
        return f"web-{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"

    def create_session(self, session_id: str, time_zone: str) -> str:
        """Create a session whose header zone is ``time_zone`` (the browser's) and serve it."""
        session_id = session_id.strip() or self.new_session_id()
        if not _session_id_ok(session_id):
            raise ConsoleError(
                f"a session id is 1 to {MAX_SESSION_ID} letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if not is_valid_zone(time_zone):
            raise ConsoleError(
                f"{time_zone!r} is not a time zone Schedule accepts: UTC or an IANA "
                "Area/Location name such as Europe/Berlin"
            )
        try:
            self.store.create(SessionHeader(id=session_id, createdAt=self.clock(),
                                            timeZone=time_zone))
        except SessionExists:
            raise ConsoleError(f"session {session_id!r} already exists") from None
        self.open(session_id)
        return session_id

    def length(self, session_id: str) -> int:
        """The log's length (what a live page compares to see whether it changed)."""
        return len(self.store.read(session_id).events)

    def _load(self, session_id: str) -> tuple[Session, FoldState | None, str | None]:
        try:
            session, state = self.store.load(session_id)
        except ScheduleLogError as exc:
            return self.store.read(session_id), None, f"the schedule records do not fold: {exc}"
        return session, state, None

    def session_page(self, session_id: str) -> pages.SessionPage:
        session, state, problem = self._load(session_id)
        return pages.session_page(session, state, problem, now_ms=self.clock())

    def summaries(self) -> list[pages.SessionSummary]:
        found = []
        now = self.clock()
        for session_id in self.store.sessions():
            try:
                session, state, problem = self._load(session_id)
            except (PersistenceError, ScheduleLogError) as exc:
                found.append(pages.unreadable_summary(session_id, exc))
                continue
            found.append(pages.session_summary(session, state, problem, now_ms=now))
        return found

    def reminders(self, due_before: str = "", zone: str = "", text: str = ""
                  ) -> pages.ReminderListing:
        """The active reminders of every session, walked session by session: those due
        before ``due_before`` (a local date and time read in ``zone``, the browser's;
        empty: any time) whose session id, id, kind or prompt holds ``text``."""
        before_ms = None if not due_before.strip() else _local_instant(due_before, zone)
        found = active_reminders(self.store, now_ms=self.clock(), due_before_ms=before_ms)
        return pages.reminder_listing(found, text.strip())

    def signature(self) -> tuple[tuple[str, int], ...]:
        """Each session and its log's length: what the sessions page watches."""
        found = []
        for session_id in self.store.sessions():
            try:
                found.append((session_id, self.length(session_id)))
            except (PersistenceError, ScheduleLogError):
                found.append((session_id, -1))
        return tuple(found)

    # -- a user turn ----------------------------------------------------------------------

    def prompt(self, session_id: str, text: str, client_time_zone: str | None) -> str:
        """One user turn: the person's prompt (carrying the browser's zone, when it is one
        Schedule accepts), a time-context reading, the model's tool calls and its answer,
        which is returned."""
        text = text.strip()
        if not text:
            raise ConsoleError("the prompt is empty")
        if len(text) > MAX_PROMPT:
            raise ConsoleError(f"a prompt is at most {MAX_PROMPT} characters")
        return self._turn(session_id, text, client_time_zone, None)

    def act(self, session_id: str, call: model.ToolCall, client_time_zone: str | None) -> str:
        """One user turn in which the person's form, not the model, calls a tool: the
        same handler the model's calls reach, so its answer or error is the tool's own
        (docs/web.md#acting-from-the-page). Returns the readable acknowledgement."""
        offered = LIFECYCLE_FORM_TOOLS if self.settings.lifecycle else FORM_TOOLS
        if call.name not in offered:
            raise ConsoleError(f"the console's forms call {', '.join(offered)}")
        return self._turn(session_id, f"(console form) {call.name} {_compact(call.args)}",
                          client_time_zone, call)

    def _turn(self, session_id: str, text: str, client_time_zone: str | None,
              form_call: model.ToolCall | None) -> str:
        if not self.exists(session_id):
            raise ConsoleError(f"session {session_id!r} does not exist")
        agent = self.open(session_id)
        header = self.store.read(session_id).header
        client_zone = client_time_zone if is_valid_zone(client_time_zone) else None
        reading_zone = header.timeZone or client_zone
        source: dict[str, Any] = {"kind": "user", "rpcId": f"web-{secrets.token_hex(6)}"}
        if client_zone is not None:
            source["clientTimeZone"] = client_zone
        with self.host.plugin.bridge.turn(session_id):
            now = self.clock()

            def opening(turn: int) -> list[NewEvent]:
                return [
                    NewEvent(type=TURN_START, time=now, data={"turn": turn}),
                    _message(now, text, source),
                    _message(now, _reading_text(now, reading_zone), {
                        "kind": "plugin", "plugin": "time-context", "form": "reading",
                        "timeZone": reading_zone, "at": format_instant(now),
                    }),
                    NewEvent(type=STEP_START, time=now, data={"turn": turn, "step": 0}),
                ]

            turn = self._append(session_id, opening)
            plan = (model.Plan(calls=(form_call,)) if form_call is not None
                    else model.plan(text, now_ms=now, zone=reading_zone,
                                    calendar=self.settings.calendar,
                                    lifecycle=self.settings.lifecycle))
            answered = [self._call(session_id, agent, call) for call in plan.calls]
            reply = plan.reply or model.answer(answered, zone=reading_zone)

            def closing(_length: int) -> list[NewEvent]:
                at = self.clock()
                return [
                    NewEvent(type=STEP_START, time=at, data={"turn": turn, "step": 1}),
                    NewEvent(type=ASSISTANT_MESSAGE, time=at,
                             data={"content": [{"type": "text", "text": reply}]}),
                    NewEvent(type=STEP_END, time=at, data={"turn": turn, "step": 1}),
                    NewEvent(type=TURN_END, time=at, data={"turn": turn}),
                ]

            self._append(session_id, closing)
            self.store.flush(session_id)
        return reply

    def _call(self, session_id: str, agent: Agent, call: model.ToolCall) -> model.Answered:
        """Run one tool call of the model and log it with its answer."""
        _definition, handler = agent.tools[call.name]
        result = handler(call.args)

        def logged(_length: int) -> list[NewEvent]:
            at = self.clock()
            return [
                NewEvent(type=TOOL_CALL, time=at, data={"name": call.name, "args": call.args}),
                NewEvent(type=TOOL_RESULT, time=at,
                         data={"content": result.content, "isError": result.is_error}),
            ]

        self._append(session_id, logged)
        return model.Answered(call=call, is_error=result.is_error, value=result.value)

    def _append(self, session_id: str, build: Callable[[int], list[NewEvent]]) -> int:
        """Append ``build(length)`` at the log's end (the turn is numbered by the seq of
        its ``turn/start``, as the reference host numbers it); returns that length."""

        def attempt(_n: int) -> int:
            length = len(self.store.read(session_id).events)
            self.store.append(session_id, build(length), expected_seq=length)
            return length

        return retry_fenced(f"web append to {session_id}", attempt, attempts=8)

    # -- operations -----------------------------------------------------------------------

    def status(self) -> Status | str:
        """``dsh-schedule status``'s figures, or why Redis could not answer."""
        try:
            return read_status(self._status_client, self.settings, now_ms=self.clock())
        except redis.RedisError as exc:
            return f"Redis did not answer ({type(exc).__name__})"

    def lateness(self) -> pages.Lateness:
        found: list[tuple[int, int]] = []
        for session_id in self.store.sessions():
            try:
                found.extend(pages.deliveries(self.store.read(session_id).events))
            except (PersistenceError, ScheduleLogError):
                continue
        return pages.lateness(found)


SELECTORS: Final = ("after_seconds", "at", "every_seconds", "cron")
_WHOLE: Final = re.compile(r"[+-]?\d{1,18}")
_LOCAL_TIME: Final = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})T(?P<time>\d{2}:\d{2})(?P<s>:\d{2})?")


def create_call(form: dict[str, str], *, calendar: bool, lifecycle: bool = False
                ) -> model.ToolCall:
    """The ``schedule_create`` call of the page's create form: its prompt and exactly one
    selector, the kind the form names. Values pass as typed (a whole number as a number),
    so the tool, not the page, judges them. ``at`` is the browser's local date and time
    with the browser's zone; ``cron`` is the rule read in that zone. With the lifecycle on,
    a filled-in ``count`` or ``until`` (read as ``at`` is) goes with it."""
    kind = form.get("selector", "")
    _check_selector(kind, calendar)
    args: dict[str, Any] = {"prompt": form.get("prompt", ""),
                            kind: _selector_value(form, kind)}
    if lifecycle:
        args.update(_end_conditions(form))
    return model.ToolCall("schedule_create", args)


def update_call(form: dict[str, str], *, calendar: bool) -> model.ToolCall:
    """The ``schedule_update`` call of the page's edit form, or of a row's pause or resume
    button: the id, and only what the form changes — a non-empty prompt, the timing
    when a selector other than ``keep`` is picked (read as create reads it), ``paused``
    when the form says ``true`` or ``false``, a filled-in ``until`` or ``count``. The tool
    judges the rest, including an edit that changes nothing."""
    args: dict[str, Any] = {"id": form.get("id", "")}
    if form.get("prompt", "").strip():
        args["prompt"] = form["prompt"]
    kind = form.get("selector", "keep") or "keep"
    if kind != "keep":
        _check_selector(kind, calendar)
        args[kind] = _selector_value(form, kind)
    paused = form.get("paused", "")
    if paused in ("true", "false"):
        args["paused"] = paused == "true"
    elif paused:
        raise ConsoleError("paused is true or false")
    args.update(_end_conditions(form))
    return model.ToolCall("schedule_update", args)


def _check_selector(kind: str, calendar: bool) -> None:
    offered = SELECTORS if calendar else SELECTORS[:3]
    if kind not in offered:
        raise ConsoleError(f"the selector is one of {', '.join(offered)}")


def _selector_value(form: dict[str, str], kind: str) -> Any:
    value = form.get(kind, "").strip()
    zone = form.get("clientTimeZone", "").strip()
    if kind in ("after_seconds", "every_seconds"):
        return _whole(value)
    if kind == "at":
        return _local_at(value, zone)
    if kind == "cron" and zone:
        return {"expression": value, "time_zone": zone}
    return value


def _end_conditions(form: dict[str, str]) -> dict[str, Any]:
    """``count`` and ``until`` when filled in (``until`` read as a local ``at`` is)."""
    found: dict[str, Any] = {}
    if count := form.get("count", "").strip():
        found["count"] = _whole(count)
    if until := form.get("until", "").strip():
        found["until"] = _local_at(until, form.get("clientTimeZone", "").strip())
    return found


def _whole(value: str) -> Any:
    return int(value) if _WHOLE.fullmatch(value) else value


def _local_at(value: str, zone: str) -> Any:
    """The browser's local date and time as an ``at`` object in the browser's zone (the
    text as typed when it is no such time: the tool says why)."""
    match = _LOCAL_TIME.fullmatch(value)
    if match is None:
        return value
    selector = {"date": match["date"], "time": match["time"] + (match["s"] or ":00")}
    if zone:
        selector["time_zone"] = zone
    return selector


def delete_call(form: dict[str, str]) -> model.ToolCall:
    """The ``schedule_delete`` call of a reminder's delete button."""
    return model.ToolCall("schedule_delete", {"id": form.get("id", "")})


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _message(now: int, text: str, source: dict[str, Any]) -> NewEvent:
    return NewEvent(type=USER_MESSAGE, time=now,
                    data={"content": [{"type": "text", "text": text}], "source": source})


def _local_instant(text: str, zone: str) -> int:
    """Epoch ms of a form's local date and time (``YYYY-MM-DDTHH:MM[:SS]``) in ``zone``
    (UTC when it is no zone Schedule accepts); ConsoleError when it is no such time."""
    try:
        local = datetime.fromisoformat(text.strip())
    except ValueError:
        local = None
    if local is None or local.tzinfo is not None:
        raise ConsoleError(f"{text!r} is not a local date and time such as 2030-01-01T06:00")
    where = load_zone(zone) if is_valid_zone(zone) else UTC
    return to_ms(local.replace(tzinfo=where))


def _reading_text(now: int, zone: str | None) -> str:
    return f"Current time reading: {model.local_text(now, zone)} ({format_instant(now)})."
