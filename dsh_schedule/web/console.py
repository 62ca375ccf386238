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

A prompt is one user turn as docs/host-integration.md describes it (``turns``); what the
forms send is read into tool calls by ``forms``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Final

import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.reference import Agent, ReferenceHost
from dsh_schedule.reminders import active_reminders
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect
from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Session, SessionHeader
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.timesel import is_valid_zone
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.naming import is_database_url, store_from_settings
from dsh_schedule.shared.store.port import SessionExists
from dsh_schedule.status import Status, read_status, write_heartbeat
from dsh_schedule.web import model, pages, turns
from dsh_schedule.web.forms import (
    MAX_SESSION_ID,
    SELECTORS,
    ConsoleError,
    create_call,
    delete_call,
    local_instant,
    session_id_ok,
    update_call,
)
from dsh_schedule.web.turns import FORM_TOOLS, LIFECYCLE_FORM_TOOLS, MAX_PROMPT

# The console's public names, wherever they are defined.
__all__ = [
    "FORM_TOOLS",
    "LIFECYCLE_FORM_TOOLS",
    "MAX_PROMPT",
    "MAX_SESSION_ID",
    "SELECTORS",
    "Console",
    "ConsoleError",
    "create_call",
    "delete_call",
    "update_call",
]

log = logging.getLogger(__name__)

STEP_S: Final = 0.05  # the embedded system is stepped this often
HEARTBEAT_EVERY_MS: Final = 1000
STEPPING_STALE_S: Final = 5.0  # an embedded system not stepped for this long is stuck
STATUS_SOCKET_TIMEOUT_S: Final = 2.0




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
        if not session_id_ok(session_id):
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
        before_ms = None if not due_before.strip() else local_instant(due_before, zone)
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

    # -- a user turn (``turns``) ---------------------------------------------------------

    def prompt(self, session_id: str, text: str, client_time_zone: str | None) -> str:
        """One user turn: the person's prompt, the model's tool calls and its answer,
        which is returned."""
        return turns.prompt(self, session_id, text, client_time_zone)

    def act(self, session_id: str, call: model.ToolCall, client_time_zone: str | None) -> str:
        """One user turn in which the person's form, not the model, calls a tool; returns
        the readable acknowledgement."""
        return turns.act(self, session_id, call, client_time_zone)

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

