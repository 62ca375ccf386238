"""``dsh-schedule demo``: the whole system on embedded defaults, as a readable timeline.

A reference host with a scripted agent creates an ``after``, a local-time ``at`` and an
``every`` reminder, lists them, deletes one, receives the due ones as the exact framing
with their receipts, then survives a restart that drops all Redis state. A local ``at``
without ``time_zone`` is answered ``timezone_confirmation_required`` until a turn's
time-context reading confirms the session's zone (docs/architecture.md#local-times-without-a-zone).
With ``DSH_SCHEDULE_LIFECYCLE=on`` it also edits a reminder, pauses and resumes a
recurring one and lets a ``count: 3`` rule run out
(docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders).
On the embedded Redis the demo's clock is injected, and advancing it by 300 s shows the
fixed-rate reminders arriving as one batch message. With ``--redis URL`` the same runs
against a real Redis with real worker and scheduler subprocesses (and the wall clock, so
without the batch).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler.process import rebuild
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.instant import format_instant, parse_instant, to_datetime
from dsh_schedule.shared.core.presentation import receipt_value, reminder_presentation
from dsh_schedule.shared.core.timesel import load_zone
from dsh_schedule.shared.core.views import render
from dsh_schedule.shared.settings import (
    LogSettings,
    Settings,
    calendar_from_env,
    lifecycle_from_env,
)
from dsh_schedule.shared.store.jsonl import JsonlStore

SESSION = "demo-session"
ZONE = "America/New_York"
SESSION_ZONE = "Europe/Berlin"
EVERY_S = 300


class DemoClock:
    """The wall clock plus an offset the embedded demo can advance (an injected clock)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return wall_clock_ms() + self.offset_ms


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=Path, metavar="DIR",
                        help="session directory (default: a temporary one, removed after)")
    parser.add_argument("--redis", metavar="URL",
                        help="a real Redis: run real worker and scheduler processes "
                        "(default: the embedded Redis, in this process)")


class Timeline:
    """What the demo shows, as it happens: text lines, or with ``json_lines`` one JSON
    object a line (``time``, ``elapsed_s`` and ``message``, or ``block`` for a message
    shown verbatim), so that a ``--log-format json`` stream carries only JSON."""

    def __init__(self, *, json_lines: bool = False) -> None:
        self.start = time.monotonic()
        self.json_lines = json_lines

    def _emit(self, key: str, text: str) -> None:
        elapsed = time.monotonic() - self.start
        print(json.dumps({"time": format_instant(wall_clock_ms()),
                          "elapsed_s": round(elapsed, 1), key: text}, ensure_ascii=False),
              flush=True)

    def say(self, text: str) -> None:
        if self.json_lines:
            self._emit("message", text)
        else:
            print(f"[{time.monotonic() - self.start:5.1f}s] {text}", flush=True)

    def block(self, text: str) -> None:
        if self.json_lines:
            self._emit("block", text)
            return
        for line in text.splitlines():
            print(f"         | {line}", flush=True)


class Demo:
    def __init__(self, sessions: Path, redis_url: str | None, timeline: Timeline) -> None:
        self.t = timeline
        self.store = JsonlStore(sessions)
        self.settings = Settings.from_env(
            {}, sessions=sessions, redis_url=redis_url, calendar=calendar_from_env(),
            lifecycle=lifecycle_from_env(),
            prefix=f"dsh-demo-{os.getpid()}:", queue=f"dsh-demo-{os.getpid()}",
        )
        self.redis_url = redis_url
        self.procs: list[subprocess.Popen[bytes]] = []
        self.system: EmbeddedSystem | None = None
        self.host: ReferenceHost
        self._host_stop = threading.Event()
        self._host_thread: threading.Thread | None = None
        self.delivered: list[Delivery] = []
        self.clock = DemoClock()
        if redis_url is None:
            self.system = EmbeddedSystem(
                self.store, self.settings, clock=self.clock, sleep=time.sleep,
                on_delivery=self._on_delivery, injected_clock=True,
            )
            self.coordination = self.system.coordination
            self.host = self.system.host
        else:
            import redis

            client = redis.Redis.from_url(redis_url)
            self.coordination = Coordination(client, self.settings)
            self.host = self._start_real_host()

    # -- running ----------------------------------------------------------------------

    def _start_real_host(self) -> ReferenceHost:
        host = ReferenceHost(self.store, self.coordination, self.settings,
                             on_delivery=self._on_delivery)
        self._host_stop = threading.Event()
        self._host_thread = threading.Thread(target=host.run, args=(self._host_stop,),
                                             daemon=True)
        self._host_thread.start()
        return host

    def start_processes(self) -> None:
        if self.redis_url is None:
            return
        env = dict(os.environ, DSH_SCHEDULE_REDIS_URL=self.redis_url,
                   DSH_SCHEDULE_SESSIONS=str(self.settings.sessions),
                   DSH_SCHEDULE_PREFIX=self.settings.prefix,
                   DSH_SCHEDULE_QUEUE=self.settings.queue)
        for command in ("worker", "scheduler"):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "dsh_schedule", command], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
            self.t.say(f"started `dsh-schedule {command}` (pid {self.procs[-1].pid})")

    def run_until(self, done: Callable[[], bool], limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not done() and time.monotonic() < deadline:
            if self.system is not None:
                self.system.step()
            time.sleep(0.05)

    def _on_delivery(self, session: str, delivery: Delivery) -> None:
        self.delivered.append(delivery)
        self.t.say("reminder delivered into the session as a user-role message:")
        self.t.block(delivery.text)
        events = self.store.read(session).events
        for event in events:
            data = event.data
            if (event.type == "schedule/change" and data.get("operation") == "dispatch"
                    and any(p.scheduleId == data["id"] for p in delivery.pairs)):
                shown = reminder_presentation(events, event.seq, 0)
                if shown is not None and any(
                    p.occurrenceAt == shown.occurrenceAt for p in delivery.pairs
                ):
                    self.t.say(f"receipt of dispatch seq {event.seq}: "
                               f"{render(receipt_value(shown))}")

    def restart(self) -> None:
        """Drop every Redis key and restart the host; the log rebuilds everything."""
        if self.system is not None:
            self.system.stop_host()
            self.system.flush_redis()
            self.host = self.system.host
        else:
            self._host_stop.set()
            if self._host_thread is not None:
                self._host_thread.join()
            self.host.close()
            for key in self.coordination.client.scan_iter(f"{self.settings.prefix}*"):
                self.coordination.client.delete(key)
            self.coordination.client.delete(f"rq:queue:{self.settings.queue}")
            self.host = self._start_real_host()
        self.host.open_root(SESSION)
        report = rebuild(self.coordination, self.settings, now_ms=self.clock())
        self.t.say(f"host restarted; rebuild woke {list(report.woken)}")

    def close(self) -> None:
        self._host_stop.set()
        if self._host_thread is not None:
            self._host_thread.join()
        self.host.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)

    # -- the script -------------------------------------------------------------------

    def tool(self, name: str, args: dict[str, Any], *, time_context: bool = False) -> Any:
        self.t.say(f"model calls {name} {json.dumps(args, ensure_ascii=False)}")
        result = self.host.prompt(SESSION, "(scripted user turn)", tool_calls=[(name, args)],
                                  client_time_zone=SESSION_ZONE, time_context=time_context)[0]
        self.t.say(f"  -> {'error ' if result.is_error else ''}{result.content}")
        return json.loads(result.content)

    def script(self) -> int:
        self.store.create(SessionHeader(id=SESSION, createdAt=self.clock(),
                                        timeZone=SESSION_ZONE))
        self.t.say(f"session {SESSION!r} created in {self.settings.sessions}")
        self.start_processes()
        agent = self.host.open_root(SESSION)
        self.t.say(f"root agent {SESSION!r} created; Schedule installed: {sorted(agent.tools)}")

        self.tool("schedule_create", {"prompt": "Stand up and stretch", "after_seconds": 3})
        local = to_datetime(self.clock() + 6000).astimezone(load_zone(ZONE))
        self.tool("schedule_create", {"prompt": "Call the team", "at": {
            "date": local.strftime("%Y-%m-%d"), "time": local.strftime("%H:%M:%S"),
            "time_zone": ZONE}})
        every = self.tool("schedule_create", {"prompt": "Check the build", "every_seconds": 300})
        anchor = parse_instant(every["scheduledAt"])
        targets = [format_instant(anchor + k * 300_000) for k in range(3)]
        self.t.say(f"every 300 s, anchor-aligned targets: {', '.join(targets)}, ...")
        self.confirm_zone()
        self.calendar_rule()
        spare = self.tool("schedule_create", {"prompt": "Never mind", "after_seconds": 20})
        self.tool("schedule_list", {})
        self.tool("schedule_delete", {"id": spare["id"]})

        self.t.say("waiting for the due reminders ...")
        self.run_until(lambda: len(self.delivered) >= 2, 30)

        self.tool("schedule_create", {"prompt": "Still here after the restart",
                                      "after_seconds": 4})
        self.t.say("simulating a restart: every Redis key dropped, host restarted")
        self.restart()
        self.run_until(lambda: len(self.delivered) >= 3, 30)

        batch_ok = self.fixed_rate_batch() and self.lifecycle()

        events = self.store.read(SESSION).events
        fold(events)  # the invariant holds over the whole log
        self.t.say(f"session log valid: {len(events)} events; still active:")
        self.tool("schedule_list", {})
        ok = len(self.delivered) == self.expected_deliveries() and batch_ok
        self.t.say("demo finished" if ok else "demo incomplete: a reminder did not arrive")
        return 0 if ok else 1


    def confirm_zone(self) -> None:
        """A local time without a zone: refused until the turn confirms the zone."""
        tomorrow = to_datetime(self.clock() + 86_400_000).astimezone(load_zone(SESSION_ZONE))
        args = {"prompt": "Water the plants",
                "at": {"date": tomorrow.strftime("%Y-%m-%d"), "time": "09:00:00"}}
        self.t.say(f"a local time without time_zone, in a turn without a time-context "
                   f"reading (session zone {SESSION_ZONE}):")
        self.tool("schedule_create", args)
        self.t.say(f"the same in a turn whose time-context reading confirms {SESSION_ZONE} "
                   "(the person's client is there too):")
        self.tool("schedule_create", args, time_context=True)

    def calendar_rule(self) -> None:
        """A weekday rule in a zone and its next occurrence (DSH_SCHEDULE_CALENDAR=on); it is
        deleted again, so the rest of the demo is the same either way."""
        if not self.settings.calendar:
            self.t.say("calendar rules are off; DSH_SCHEDULE_CALENDAR=on shows a weekday rule")
            return
        rule = {"expression": "0 9 * * MON-FRI", "time_zone": ZONE}
        self.t.say(f"a calendar rule: every weekday at 09:00 in {ZONE}")
        view = self.tool("schedule_create", {"prompt": "Daily stand-up", "cron": rule})
        local = to_datetime(parse_instant(view["scheduledAt"])).astimezone(load_zone(ZONE))
        self.t.say(f"next occurrence: {view['scheduledAt']} = {local:%A %Y-%m-%d %H:%M} "
                   f"in {ZONE} (docs/decisions.md#calendar-rules)")
        self.tool("schedule_delete", {"id": view["id"]})

    def expected_deliveries(self) -> int:
        """Messages the script delivers: two one-shots, one after the restart, the
        embedded batch, and with the lifecycle the edited one-shot and the embedded
        batches around a paused and a counted record (one while paused, three counted)."""
        embedded = self.system is not None
        found = 4 if embedded else 3
        if self.settings.lifecycle:
            found += 1 + (4 if embedded else 0)
        return found

    def lifecycle(self) -> bool:
        """An edit that keeps the id, a pause and a resume, and a ``count: 3`` rule that
        runs out (DSH_SCHEDULE_LIFECYCLE=on; the counted rule on the embedded Redis only)."""
        if not self.settings.lifecycle:
            self.t.say("the lifecycle is off; DSH_SCHEDULE_LIFECYCLE=on shows an edit, a pause "
                       "and a count: 3 rule running out")
            return True
        self.t.say("lifecycle: an edit keeps the id, changes only what it names, and re-arms")
        later = self.tool("schedule_create", {"prompt": "Stand up", "after_seconds": 3600})
        before = len(self.delivered)
        self.tool("schedule_update", {"id": later["id"], "prompt": "Stand up and walk",
                                      "after_seconds": 2})
        self.run_until(lambda: len(self.delivered) > before, 30)
        edited = any(p.scheduleId == later["id"] for d in self.delivered[before:]
                     for p in d.pairs)
        if self.system is None:
            self.t.say("pause, resume and count: shown on the embedded Redis only (they "
                       "advance an injected clock)")
            return edited
        return edited and self.pause_and_count()

    def pause_and_count(self) -> bool:
        """A ``count: 3`` rule, paused across one period (the batch leaves it out),
        resumed on its next anchor-aligned target, then delivered three times and gone."""
        counted = self.tool("schedule_create", {"prompt": "Take the bread out",
                                                "every_seconds": EVERY_S, "count": 3})
        self.tool("schedule_update", {"id": counted["id"], "paused": True})
        left_out = self.advance(f"paused {counted['id']}: ")
        self.tool("schedule_update", {"id": counted["id"], "paused": False})
        carried = [self.advance(f"occurrence {n} of 3: ") for n in (1, 2, 3)]
        gone = fold(self.store.read(SESSION).events).find(counted["id"]) is None
        self.t.say(f"{counted['id']} delivered three times and ended: it leaves the list")
        return (counted["id"] not in left_out and gone
                and all(counted["id"] in ids for ids in carried))

    def advance(self, why: str) -> set[str]:
        """Advance the injected clock one period and wait for the batch it makes due;
        the ids that batch carried."""
        before = len(self.delivered)
        self.clock.offset_ms += EVERY_S * 1000
        self.t.say(f"{why}injected clock advanced by {EVERY_S} s")
        self.run_until(lambda: len(self.delivered) > before, 30)
        return {p.scheduleId for d in self.delivered[before:] for p in d.pairs}

    def fixed_rate_batch(self) -> bool:
        """Two fixed-rate reminders falling due together arrive as one batch message."""
        if self.system is None:
            self.t.say("fixed-rate batch: shown on the embedded Redis only (it advances an "
                       "injected clock)")
            return True
        self.tool("schedule_create", {"prompt": "Stretch your legs", "every_seconds": EVERY_S})
        before = len(self.delivered)
        self.clock.offset_ms += EVERY_S * 1000
        self.t.say(f"embedded demo: injected clock advanced by {EVERY_S} s; both fixed-rate "
                   "reminders are due")
        self.run_until(lambda: len(self.delivered) > before, 30)
        batch = [d for d in self.delivered[before:] if len(d.pairs) == 2]
        if batch:
            self.t.say("the fixed-rate reminders arrived as one batch message "
                       "(injected clock, embedded demo)")
        return len(batch) == 1


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "verbose", False):
        logging.getLogger().setLevel(logging.WARNING)
    log_format = LogSettings.from_env(format=getattr(args, "log_format", None)).format
    timeline = Timeline(json_lines=log_format == "json")
    with tempfile.TemporaryDirectory(prefix="dsh-demo-") as tmp:
        sessions = args.sessions or Path(tmp) / "sessions"
        demo = Demo(sessions, args.redis, timeline)
        mode = f"real Redis {args.redis}" if args.redis else "embedded Redis (in-process)"
        timeline.say(f"dsh-schedule demo on {mode}")
        try:
            return demo.script()
        finally:
            demo.close()



