"""Chaos under real processes: two ``dsh-schedule host``s serving the same sessions, two
``worker``s and a ``scheduler`` on a Redis this test starts, while a seeded random plan
SIGKILLs and restarts each kind of process, runs them on skewed wall clocks (a seeded
share of -90, -30, 0, +30 and +90 s among the two hosts, the two workers and the scheduler,
through the test-only ``DSH_SCHEDULE_TEST_CLOCK_SKEW``; the tool calls take the first
host's), pauses a worker past its lock's time to live
and the host and the scheduler past theirs, takes Redis down for half a minute (back
empty, with no manual ``dsh-schedule rebuild``), makes Redis refuse every write for a
while (OOM or NOREPLICAS error replies), fills the sessions' disk for a while (a small
tmpfs the test mounts) and deletes one key of each kind of a live agent's projection (a
wake's schedule entry, a wake's job hash, an agent-host and a lease-queue entry, a
followup stream), each from another session, as a failover that lost writes would.
Several hundred one-shots fall due in the same second, more
fall due all through the error-reply and full-disk windows (the plan's times are fixed
when the logs are written, so the due times can aim at them), and tool calls (create,
list, delete through ``dsh-schedule call``) run all through the chaos.

At the end, read from the session logs by their format alone
(docs/architecture.md#schedule-records): every one-shot in a log and not deleted there is
delivered exactly once and has exactly one dispatch record; a deleted one has neither;
each fixed-rate reminder's one occurrence in the run is dispatched and delivered once; no
dispatch is decided before its record's target and no delivery comes before its dispatch,
neither by the times the log records nor by when the test first saw the dispatch (true
time: Redis runs on this machine);
every tool call's answer is true of the log; no process exited on its own; and every log
passes ``dsh-schedule check``.

The run is played on each session store: on the JSONL store as above; on the PostgreSQL
store (``postgres``: a private server of the test's own, named to every process by
``DSH_SCHEDULE_STORE``) the full-disk window is a database crash instead (an immediate
shutdown, losing the asynchronous commits the server had not yet written, and a start
after the window's seconds), the logs are read from the database, and ``check`` runs on
each log as ``dsh-schedule export`` prints it.

The seed comes from ``DSH_SCHEDULE_CHAOS_SEED`` (random otherwise) and is part of every
assertion message with the timeline; the same seed gives the same plan and due times,
though not the same interleaving of real processes.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from dsh_schedule.shared.clock import SKEW_ENV
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.records import (
    AtSchedule,
    CreateChange,
    EverySchedule,
    encode_change,
)
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.naming import close_store
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.store.postgres import PostgresStore
from tests.postgres_private import PrivateServer, private_server
from tests.postgres_server import in_ci
from tests.redis_server import RedisServer
from tests.support import Processes, process_env, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.slow]

SEED_ENV = "DSH_SCHEDULE_CHAOS_SEED"
SESSIONS = tuple(f"chaos-{i:02d}" for i in range(20))
LEAD_S = 40  # the plan begins this long after the sessions are written: room for set-up
FIXED_RATE_AT = (0.2, 0.5, 0.8)  # the one occurrence of the fixed-rate reminder of the
# first three sessions falls due at these fractions of the plan's span
BURST = 300  # one-shots written into the logs before the hosts start, all due in one second
# ... and that second falls in one of these windows of the plan, or anywhere in it
# (due a second before Redis starts refusing writes, so that its wakes are running then)
BURST_IN = ("store-fault", "redis-refuses", "redis-down", "anywhere")
STORE_FAULTS = ("disk-full", "db-crash")  # the store's window: JSONL's, PostgreSQL's
IN_WINDOW = 30  # one-shots written into the logs for each error-reply and store window,
# falling due all through it, in the first WINDOW_SESSIONS sessions: more appends to
# each than the slack of a file's last page takes, so that a full disk refuses them
WINDOW_SESSIONS = 5
ONE_SHOTS = 40  # one-shots created through `dsh-schedule call` before the chaos
DUE_S = 4  # those fall due at least this long after they are created, up to the plan's end
CALL_DUE_S = (2, 15)  # one-shots created during the chaos fall due this much later
GAP_S = (0.5, 4.0)  # the plan's pause before each action
SETTLE_S = 45  # after the last due time: room for expired locks, claims and reconciles
DUPLICATE_WATCH_S = 5  # a second delivery would show up in this time
HOSTS = ("host-a", "host-b")
WORKERS = ("worker-a", "worker-b")
SKEWS_S = (-90, -30, 0, 30, 90)  # wall-clock skews, shared out among the processes
REDIS_DOWN_S = (28.0, 32.0)
WINDOW_S = (9.0, 11.0)  # an error-reply or full-disk window lasts this long
DISK_MB = 64  # the sessions' tmpfs
STORE_BACK_S = 60  # how long the test's final reads wait for a restarted database
FILLER = ".chaos-filler"  # the file that fills it, in the sessions directory
# How Redis is made to answer every write with an error reply, and how it is restored.
REFUSALS = {
    "OOM": ({"maxmemory-policy": "noeviction", "maxmemory": "1"}, {"maxmemory": "0"}),
    "NOREPLICAS": ({"min-replicas-to-write": "1"}, {"min-replicas-to-write": "0"}),
}

TIMINGS = {
    "LEASE_TTL": "6",
    "LEASE_RENEW": "1",
    "LOCK_TTL": "2",
    "MAINTENANCE_TTL": "2",
    "TURN_TTL": "10",
    "MOVER_INTERVAL": "0.1",
    "RECONCILE_INTERVAL": "2",
    "REPAIR_AFTER": "10",
}
# The keys of a live agent's projection the plan deletes, each from one session.
LOST_KINDS = ("wake-entry", "wake-job", "agent-host", "lease-queue", "followups")
LOCK_TTL_S = float(TIMINGS["LOCK_TTL"])
# A host pause outlasts its leases and its turn phases; a scheduler pause outlasts
# rq-scheduler's lock (11 s) and the heartbeat's freshness (15 s).
PAUSE_PAST_S = {"worker": LOCK_TTL_S, "host": float(TIMINGS["TURN_TTL"]), "scheduler": 15.0}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _seed() -> int:
    named = os.environ.get(SEED_ENV)
    return int(named) if named else random.SystemRandom().randrange(2**32)


@dataclass(frozen=True)
class Action:
    at_s: float  # when it starts, seconds after the plan begins
    action: str
    target: str
    hold_s: float  # how long the process is down, paused, or the window lasts
    detail: str = ""

    @property
    def end_s(self) -> float:
        return self.at_s + self.hold_s

    def describe(self) -> str:
        extra = f" {self.detail}" if self.detail else ""
        return f"{self.at_s:g}s {self.action} {self.target} {self.hold_s:g}s{extra}"


def _plan(rng: random.Random, store_fault: str = "disk-full") -> list[Action]:
    """The actions, one after the other, in a seeded order with seeded gaps; the store's
    window is ``store_fault`` (the same seed gives the same plan on either store)."""
    picks: list[tuple[str, str]] = [("kill", rng.choice(WORKERS))
                                    for _ in range(rng.randint(1, 3))]
    picks += [("kill", "scheduler") for _ in range(rng.randint(1, 2))]
    picks += [("kill", rng.choice(HOSTS)) for _ in range(rng.randint(1, 2))]
    picks += [("pause", rng.choice(WORKERS)) for _ in range(rng.randint(1, 2))]
    picks += [("pause", rng.choice(HOSTS)), ("pause", "scheduler")]
    picks += [("redis-down", "redis"), ("redis-refuses", "redis"), (store_fault, "sessions")]
    picks += [("lose-keys", "redis")]
    rng.shuffle(picks)
    plan: list[Action] = []
    clock = 0.0
    for action, target in picks:
        clock = round(clock + rng.uniform(*GAP_S), 1)
        if action == "kill":
            step = Action(clock, action, target, round(rng.uniform(0.0, 3.0), 1))
        elif action == "pause":
            past = PAUSE_PAST_S[target.split("-")[0]]
            step = Action(clock, action, target, round(past + rng.uniform(1.0, 3.0), 1),
                          f"(past {past:g} s)")
        elif action == "redis-down":
            step = Action(clock, action, target, round(rng.uniform(*REDIS_DOWN_S), 1))
        elif action == "lose-keys":
            step = Action(clock, action, target, float(TIMINGS["REPAIR_AFTER"]))
        else:
            detail = rng.choice(sorted(REFUSALS)) if action == "redis-refuses" else ""
            step = Action(clock, action, target, round(rng.uniform(*WINDOW_S), 1), detail)
        plan.append(step)
        clock = step.end_s
    return plan


# -- the logs, read by their format alone -----------------------------------------------


@dataclass
class LogStory:
    """What one session log says of its schedules (docs/architecture.md#schedule-records)."""

    creates: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> schedule
    deleted: dict[str, int] = field(default_factory=dict)  # id -> seq
    # (id, seq, time, acceptedAt or None), in log order
    dispatches: list[tuple[str, int, int, str | None]] = field(default_factory=list)
    # (seq, time, [(scheduleId, occurrenceAt)]) of each delivered reminder message
    deliveries: list[tuple[int, int, list[tuple[str, str]]]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> LogStory:
        return cls.of_lines(path.read_bytes().split(b"\n"))

    @classmethod
    def of_lines(cls, lines: list[bytes]) -> LogStory:
        """The story of a log's lines, its header first (a last line may be torn)."""
        story = cls()
        for number, line in enumerate(lines[1:], start=2):
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # a torn last line, being written
                    break
                raise
            story.add(event)
        return story

    def add(self, event: dict[str, Any]) -> None:
        data, seq, at = event["data"], event["seq"], event["time"]
        if event["type"] == SCHEDULE_CHANGE:
            operation = data["operation"]
            if operation == "create":
                self.creates[data["schedule"]["id"]] = data["schedule"]
            elif operation == "delete":
                self.deleted[data["id"]] = seq
            elif operation == "dispatch":
                self.dispatches.append((data["id"], seq, at, data.get("acceptedAt")))
        elif event["type"] == "user/message":
            source = data.get("source") or {}
            if source.get("plugin") == "tool-schedule":
                pairs = [(p["scheduleId"], p["occurrenceAt"])
                         for p in source.get("reminders") or []]
                self.deliveries.append((seq, at, pairs))

    def dispatched(self) -> Counter[str]:
        return Counter(schedule_id for schedule_id, *_ in self.dispatches)

    def delivered(self) -> Counter[str]:
        return Counter(pair[0] for _, _, pairs in self.deliveries for pair in pairs)

    def expected(self) -> set[str]:
        """The ids that must be delivered exactly once: every create not deleted."""
        return set(self.creates) - set(self.deleted)

    def ordering_problems(self) -> list[str]:
        """A dispatch decided before its record's target, a delivery before its dispatch."""
        problems = []
        first_dispatch: dict[str, tuple[int, int]] = {}
        for schedule_id, seq, at, accepted in self.dispatches:
            target = parse_instant(self.creates[schedule_id]["scheduledAt"])
            first_dispatch.setdefault(schedule_id, (seq, at))
            decided = parse_instant(accepted) if accepted is not None else at
            if decided < target or at < target:
                problems.append(f"{schedule_id} dispatched at seq {seq}, time"
                                f" {format_instant(at)}, acceptedAt {accepted}: before its"
                                f" target {format_instant(target)}")
        for seq, at, pairs in self.deliveries:
            for schedule_id, occurrence in pairs:
                dispatch = first_dispatch.get(schedule_id)
                if dispatch is None or dispatch[0] > seq or dispatch[1] > at:
                    problems.append(f"{schedule_id} delivered at seq {seq} (time"
                                    f" {format_instant(at)}) before its dispatch {dispatch}")
                if parse_instant(occurrence) < parse_instant(
                        self.creates[schedule_id]["scheduledAt"]):
                    problems.append(f"{schedule_id} delivered as occurrence {occurrence},"
                                    " before its target")
        return problems


# -- tool calls during the chaos ----------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One ``dsh-schedule call`` and what it answered."""

    session: str
    tool: str
    args: dict[str, Any]
    started_ms: int
    ended_ms: int
    returncode: int
    value: Any  # the parsed stdout, or None
    output: str

    def describe(self) -> str:
        return (f"{self.tool} {json.dumps(self.args)} in {self.session} -> rc"
                f" {self.returncode}: {self.output.strip()[:300]}")


def how_created(answers: list[Answer], session: str, create: dict[str, Any]) -> str:
    """The call that made a reminder, and what it answered (a lost reminder's story)."""
    for answer in answers:
        if (answer.session, answer.tool, answer.args.get("prompt")) == (
                session, "schedule_create", create["prompt"]):
            return f"{answer.describe()} (called {answer.started_ms}..{answer.ended_ms})"
    return "written into the log by the test"


# Error codes a call may answer while Redis or the disk fails; the log decides what happened.
FAULT_CODES = {"internal_error", "persistence_uncertain"}


@dataclass
class ChaosStore:
    """The session store of one run: the test's own handle on it, what names it to the
    processes, and the window of its own fault the plan plays."""

    sessions: Path  # the JSONL directory (unused by a PostgreSQL store's processes)
    store: SessionStore
    fault: str  # one of STORE_FAULTS
    url: str | None = None  # a PostgreSQL store's
    database: PrivateServer | None = None

    def story(self, session: str, *, wait_s: float = 0.0) -> LogStory:
        """What the session's log holds now, read from where the processes write it;
        a database that does not answer is waited for up to ``wait_s`` (the test's own
        pool reconnects after a crash window with its own backoff)."""
        if isinstance(self.store, JsonlStore):
            return LogStory.read(self.store.path(session))
        deadline = time.monotonic() + wait_s
        while True:
            try:
                header, lines = self.store.session_lines(session)
                return LogStory.of_lines([header, *lines])
            except PersistenceError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


class Run:
    """The processes, the Redis and the timeline of one chaos run."""

    def __init__(self, tmp_path: Path, server: RedisServer, where: ChaosStore,
                 seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.server = server
        self.where = where
        self.sessions = where.sessions
        named = {"STORE": where.url} if where.url else {}
        self.env = process_env(server.url(), self.sessions, PREFIX="chaos:", QUEUE="chaos",
                               **named, **TIMINGS)
        self.tmp_path = tmp_path
        self.procs = Processes(tmp_path, self.env)
        self.store = where.store
        self.started = time.monotonic()
        self.begin = self.started + LEAD_S  # the plan's begin, monotonic and wall clock
        self.begin_ms = _now_ms() + LEAD_S * 1000
        self.timeline: list[str] = []
        self.deaths: list[str] = []  # processes that exited on their own, with their logs
        self._seen_dead: set[int] = set()  # pids already reported
        self._killing: set[str] = set()
        self.answers: list[Answer] = []
        self.calls_done = threading.Event()
        names = [*HOSTS, *WORKERS, "scheduler"]
        skews = list(SKEWS_S)
        self.rng.shuffle(skews)
        self.skews: dict[str, int] = dict(zip(names, skews, strict=True))
        # (session, id, seq) -> when the test first saw the dispatch, true epoch ms
        self.first_seen: dict[tuple[str, str, int], int] = {}
        self._last_look = 0.0

    def skew_env(self, name: str) -> dict[str, str]:
        """The test-only wall-clock skew of the process ``name``."""
        skew = self.skews[name]
        return {SKEW_ENV: str(skew)} if skew else {}

    def spawn(self, name: str, *args: str) -> None:
        self.procs.spawn(name, *args, env=self.skew_env(name))

    def note(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.1f}s {text}")

    def context(self) -> str:
        """What a failure message needs to reproduce and understand the run."""
        return (f"chaos seed {self.seed} (rerun with {SEED_ENV}={self.seed}; answers and"
                f" exported logs kept in {self.tmp_path})\n"
                + "\n".join(self.timeline) + "\n" + self.procs.describe())

    def sleep(self, seconds: float) -> None:
        """Sleep, noticing meanwhile any process that exits on its own."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.watch()
            time.sleep(min(0.5, left))
        self.watch()

    def look_at_dispatches(self) -> None:
        """Note, by the true clock, the dispatches that showed up since the last look (at
        most once a second)."""
        if time.monotonic() - self._last_look < 1.0:
            return
        self._last_look = time.monotonic()
        for session in SESSIONS:
            try:
                story = self.where.story(session)
            except OSError:  # not written yet, or the database is down: look again later
                continue
            seen = _now_ms()  # once read: a dispatch is surely there by then, not before
            for schedule_id, seq, _at, _accepted in story.dispatches:
                self.first_seen.setdefault((session, schedule_id, seq), seen)

    def early_by_true_time(self, stories: dict[str, LogStory]) -> list[str]:
        """Dispatches the test saw before their record's target."""
        problems = []
        for (session, schedule_id, seq), seen in sorted(self.first_seen.items()):
            target = parse_instant(stories[session].creates[schedule_id]["scheduledAt"])
            if seen < target:
                problems.append(f"{session} {schedule_id} dispatched (seq {seq}) and seen"
                                f" {target - seen} ms before its target by true time")
        return problems

    def watch(self) -> None:
        """Record each process that exited without the plan killing it; note new
        dispatches."""
        self.look_at_dispatches()
        for name, proc in list(self.procs.procs.items()):
            code = proc.poll()
            if code is None or name in self._killing or proc.pid in self._seen_dead:
                continue
            self._seen_dead.add(proc.pid)
            self.note(f"{name} EXITED {code} on its own")
            self.deaths.append(f"--- {name} (pid {proc.pid}) exited {code} on its own:\n"
                               f"{self.procs.log_summary(name)}")

    # -- set-up ---------------------------------------------------------------------

    def create_sessions(self, plan: list[Action]) -> dict[str, str]:
        """Sessions made ten minutes ago, written straight into the logs before any
        process starts: the first three with a fixed-rate reminder made five minutes ago
        whose first occurrence falls due during the plan; all with their share of the
        burst, BURST one-shots due in one second, and of the IN_WINDOW one-shots due
        through each error-reply and full-disk window. The plan begins LEAD_S later.
        The fixed-rate id per session."""
        now = _now_ms()
        self.begin_ms = now + LEAD_S * 1000
        self.begin = time.monotonic() + LEAD_S
        span_ms = round(plan[-1].end_s * 1000)
        where = self.rng.choice(BURST_IN)
        if where == "store-fault":
            where = self.where.fault
        window = next((step for step in plan if step.action == where), None)
        if window is None:
            burst_at = self.begin_ms + self.rng.randrange(span_ms)
        else:  # due as Redis starts refusing or the database crashes (so wakes are
            # running, and their commits not yet written are lost), else just inside
            lead = -1000 if where in ("redis-refuses", "db-crash") else 500
            burst_at = self.begin_ms + round(window.at_s * 1000) + lead
        targets: dict[str, list[tuple[str, int]]] = {session: [] for session in SESSIONS}
        for n in range(BURST):
            targets[SESSIONS[n % len(SESSIONS)]].append(
                (f"burst {n}", burst_at + self.rng.randrange(1000)))
        in_windows = 0
        for step in plan:
            if step.action in ("redis-refuses", *STORE_FAULTS):
                start = self.begin_ms + round(step.at_s * 1000)
                for n in range(IN_WINDOW):
                    targets[SESSIONS[n % WINDOW_SESSIONS]].append(
                        (f"in {step.action} {n}",
                         start + self.rng.randrange(round(step.hold_s * 1000))))
                in_windows += IN_WINDOW
        fixed: dict[str, str] = {}
        for index, session in enumerate(SESSIONS):
            self.store.create(SessionHeader(id=session, createdAt=now - 600_000))
            events: list[NewEvent] = []
            if index < len(FIXED_RATE_AT):
                target = self.begin_ms + round(FIXED_RATE_AT[index] * span_ms)
                fixed[session] = f"schedule-{len(events) + 1}"
                events.append(NewEvent(type=SCHEDULE_CHANGE, time=target - 300_000,
                                       data=encode_change(CreateChange(schedule=EverySchedule(
                                           id=fixed[session], everySeconds=300,
                                           prompt=f"every 300 s in {session}",
                                           scheduledAt=format_instant(target))))))
            for prompt, target in targets[session]:
                events.append(NewEvent(type=SCHEDULE_CHANGE, time=now - 120_000,
                                       data=encode_change(CreateChange(schedule=AtSchedule(
                                           id=f"schedule-{len(events) + 1}", prompt=prompt,
                                           scheduledAt=format_instant(target))))))
            self.store.append(session, events, expected_seq=0)
            self.store.flush(session)
        self.note(f"wrote {len(SESSIONS)} sessions, {len(fixed)} fixed-rate reminders,"
                  f" {in_windows} one-shots due in the error and disk windows, and a"
                  f" burst of {BURST} one-shots due in the second from"
                  f" {format_instant(burst_at)} ({(burst_at - self.begin_ms) / 1000:.1f} s"
                  f" into the plan, {where}); the plan begins {LEAD_S} s on")
        return fixed

    def call(self, session: str, tool: str, args: dict[str, Any]) -> Answer:
        started = _now_ms()
        try:
            result = self.procs.run("call", session, tool, json.dumps(args), timeout=60,
                                    env=self.skew_env(HOSTS[0]))
            returncode, output = result.returncode, result.stdout + result.stderr
            stdout = result.stdout
        except subprocess.TimeoutExpired as exc:
            returncode, output, stdout = -1, f"timed out: {exc}", ""
        try:
            parsed = json.loads(stdout) if stdout.strip() else None
        except json.JSONDecodeError:
            parsed = None
        answer = Answer(session, tool, args, started, _now_ms(), returncode, parsed, output)
        self.answers.append(answer)
        return answer

    def create_one_shots(self, span_s: float) -> None:
        """ONE_SHOTS reminders through ``dsh-schedule call``, spread over the sessions and
        the run."""
        latest = max(DUE_S, round((self.begin_ms - _now_ms()) / 1000 + span_s))
        jobs = [(SESSIONS[i % len(SESSIONS)], f"one-shot {i}", self.rng.randint(DUE_S, latest))
                for i in range(ONE_SHOTS)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda job: self.call(
                job[0], "schedule_create", {"prompt": job[1], "after_seconds": job[2]}), jobs))
        for answer in answers:
            assert answer.returncode == 0, answer.describe() + "\n" + self.context()
        self.note(f"created {ONE_SHOTS} one-shots, due {DUE_S}..{latest} s on")

    # -- tool calls during the chaos ------------------------------------------------

    def tool_calls(self, rng: random.Random) -> None:
        """Creates, lists and deletes, one after the other, until the plan is played."""
        made: list[tuple[str, str]] = []  # (session, id) answered scheduled
        number = 0
        while not self.calls_done.is_set():
            session = rng.choice(SESSIONS)
            choice = rng.random()
            if choice < 0.5 or not made:
                number += 1
                after = rng.randint(*CALL_DUE_S)
                answer = self.call(session, "schedule_create",
                                   {"prompt": f"chaos call {number}", "after_seconds": after})
                if answer.returncode == 0 and isinstance(answer.value, dict):
                    made.append((session, answer.value["id"]))
            elif choice < 0.75:
                self.call(session, "schedule_list", {})
            else:
                session, schedule_id = made.pop(rng.randrange(len(made)))
                self.call(session, "schedule_delete", {"id": schedule_id})
            time.sleep(rng.uniform(0.0, 0.5))

    def answer_summary(self, skip: int) -> str:
        """How the calls after the first ``skip`` answered, by tool."""
        def outcome(answer: Answer) -> str:
            value = answer.value
            if answer.returncode == 3 and isinstance(value, dict):
                return str(value.get("code"))
            if answer.returncode != 0:
                return f"rc {answer.returncode}"
            if answer.tool == "schedule_delete" and isinstance(value, dict):
                return "deleted" if value.get("deleted") else "not found"
            return "ok"
        counts = Counter(f"{a.tool} {outcome(a)}" for a in self.answers[skip:])
        return ", ".join(f"{key} {n}" for key, n in sorted(counts.items())) or "none"

    # -- the plan -------------------------------------------------------------------

    def play(self, plan: list[Action]) -> None:
        """Each action at its time (or at once, when the one before overran)."""
        late = time.monotonic() - self.begin
        if late > 0:
            self.note(f"set-up overran the lead by {late:.1f} s: the plan begins late")
            self.begin += late
        for step in plan:
            self.sleep(self.begin + step.at_s - time.monotonic())
            getattr(self, step.action.replace("-", "_"))(step)

    def kill(self, step: Action) -> None:
        self.watch()
        self._killing.add(step.target)
        try:
            self.procs.kill(step.target)
            self.note(f"SIGKILL {step.target}; restart in {step.hold_s} s")
            time.sleep(step.hold_s)
            self.procs.restart(step.target)
        finally:
            self._killing.discard(step.target)

    def pause(self, step: Action) -> None:
        self.note(f"SIGSTOP {step.target} for {step.hold_s} s {step.detail}")
        self.procs.send(step.target, signal.SIGSTOP)
        try:
            time.sleep(step.hold_s)
        finally:
            self.procs.send(step.target, signal.SIGCONT)
        self.note(f"SIGCONT {step.target}")

    def redis_down(self, step: Action) -> None:
        self.note(f"SIGKILL redis-server; down for {step.hold_s} s, back empty, no rebuild")
        self.server.kill()
        self.sleep(step.hold_s)
        self.server.start()
        self.note("redis-server back (empty)")

    def redis_refuses(self, step: Action) -> None:
        """Redis answers, but every write gets an error reply (OOM or NOREPLICAS)."""
        refuse, restore = REFUSALS[step.detail]
        client = self.server.client()
        try:
            for name, value in refuse.items():
                client.config_set(name, value)
            self.note(f"redis-server refuses writes ({step.detail}) for {step.hold_s} s")
            self.sleep(step.hold_s)
        finally:
            for name, value in restore.items():
                client.config_set(name, value)
            client.close()
        self.note("redis-server accepts writes again")

    def disk_full(self, step: Action) -> None:
        """The sessions' file system full (ENOSPC) for a while."""
        filler = self.sessions / FILLER
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            for size in (1 << 20, 4096, 1):
                chunk = b"\0" * size
                try:
                    while True:
                        os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
            written = os.fstat(fd).st_size
        finally:
            os.close(fd)
        self.note(f"sessions disk full (a {written >> 20} MiB filler) for {step.hold_s} s")
        try:
            self.sleep(step.hold_s)
        finally:
            filler.unlink()
        self.note("sessions disk has room again")

    def db_crash(self, step: Action) -> None:
        """PostgreSQL shut down immediately (what it had not written to its disk is lost)
        and started again after the window (a crash recovery)."""
        database = self.where.database
        assert database is not None
        database.crash()
        self.note(f"PostgreSQL crashed (immediate shutdown); starts again in {step.hold_s} s")
        self.sleep(step.hold_s)
        database.start()
        self.note("PostgreSQL back (recovered)")

    def lose_keys(self, step: Action) -> None:
        """A partial loss that keeps the generation marker: one key of each kind of a live
        agent's projection deleted, each from another session (the hosts repair them)."""
        keys = Keys("chaos:")
        rng = random.Random(f"{self.seed}-lose")
        sessions = list(SESSIONS)
        rng.shuffle(sessions)
        client = self.server.client()
        lost: list[str] = []
        try:
            for kind in LOST_KINDS:
                for session in sessions:
                    wake = client.get(keys.current_wake(session))
                    if kind == "wake-entry" and wake is not None:
                        done = client.zrem(keys.scheduled_jobs(), wake)
                    elif kind == "wake-job" and wake is not None:
                        done = client.delete(f"rq:job:{wake.decode()}")
                    elif kind == "agent-host":
                        done = client.hdel(keys.agent_host(), session)
                    elif kind == "lease-queue":
                        done = client.hdel(keys.lease_queue(), session)
                    elif kind == "followups":
                        done = client.delete(keys.followups(session))
                    else:
                        continue
                    if done:
                        lost.append(f"{kind} of {session}")
                        sessions.remove(session)
                        break
        except redis.RedisError as exc:
            lost.append(f"then {type(exc).__name__}")
        finally:
            client.close()
        self.note(f"lost keys: {', '.join(lost) or 'none found'}")
        self.sleep(step.hold_s)

    # -- observations ---------------------------------------------------------------

    def stories(self) -> dict[str, LogStory]:
        """Every log, read once the database answers (never during a crash window: the
        plan reads none then)."""
        return {session: self.where.story(session, wait_s=STORE_BACK_S)
                for session in SESSIONS}

    def undelivered(self) -> dict[str, set[str]]:
        """Per session, the ids its log says must still be delivered."""
        stories = self.stories()
        return {session: missing for session, story in stories.items()
                if (missing := story.expected() - set(story.delivered()))}

    def settled(self) -> bool:
        """Every reminder a log says is due delivered (noticing deaths meanwhile)."""
        self.watch()
        try:
            return not self.undelivered()
        except OSError:  # the database is not answering yet
            return False

    def keep(self) -> None:
        """What a failure is read from, in the test's directory: every tool call's answer
        (``answers.jsonl``) and, for a database, each log as ``dsh-schedule export``
        prints it (``exported/``, which must be the log's lines)."""
        with (self.tmp_path / "answers.jsonl").open("w") as kept:
            for answer in self.answers:
                kept.write(json.dumps(answer.__dict__) + "\n")
        if self.where.url is None:
            return
        exported = self.tmp_path / "exported"
        exported.mkdir()
        for session in SESSIONS:
            printed = self.procs.run("export", session)
            assert printed.returncode == 0, printed.stdout + printed.stderr
            (exported / f"{session}.jsonl").write_text(printed.stdout)
            header, lines = self.store.session_lines(session)
            assert printed.stdout.encode() == b"".join(
                line + b"\n" for line in (header, *lines)), f"export of {session} differs"

    def check_logs(self) -> subprocess.CompletedProcess[str]:
        """``dsh-schedule check`` on every log: the JSONL files, or the exported ones."""
        if self.where.url is None:
            return self.procs.check(self.sessions)
        return self.procs.check(self.tmp_path / "exported")

    def last_target_ms(self) -> int:
        return max(parse_instant(schedule["scheduledAt"])
                   for story in self.stories().values()
                   for schedule in story.creates.values())


def answer_problems(answers: list[Answer], stories: dict[str, LogStory]) -> list[str]:
    """Each tool call's answer checked against what the logs hold at the end."""
    problems = []
    deleted_at: dict[tuple[str, str], int] = {}  # answered deleted, when the answer came
    for answer in answers:
        if answer.tool == "schedule_delete" and isinstance(answer.value, dict) \
                and answer.value.get("deleted") is True:
            deleted_at[(answer.session, answer.args["id"])] = answer.ended_ms
    for answer in answers:
        story = stories[answer.session]
        value = answer.value
        code = value.get("code") if isinstance(value, dict) and answer.returncode == 3 else None
        if answer.returncode not in (0, 2, 3) or (answer.returncode == 3 and code is None):
            problems.append(f"call crashed or answered nothing usable: {answer.describe()}")
            continue
        if answer.returncode == 2:  # Redis or the store did not answer: no call made
            continue
        if answer.returncode == 3 and code not in FAULT_CODES:
            problems.append(f"an error no fault explains: {answer.describe()}")
            continue
        if answer.tool == "schedule_create":
            prompt = answer.args["prompt"]
            logged = [sid for sid, s in story.creates.items() if s["prompt"] == prompt]
            if code is None and logged != [value["id"]]:
                problems.append(f"answered {value['id']}, the log holds {logged}:"
                                f" {answer.describe()}")
            elif code == "internal_error" and logged:
                problems.append(f"answered internal_error, yet the log holds {logged}:"
                                f" {answer.describe()}")
        elif answer.tool == "schedule_delete":
            schedule_id = answer.args["id"]
            if code is None and value["deleted"] is True and schedule_id not in story.deleted:
                problems.append(f"answered deleted, the log holds no delete:"
                                f" {answer.describe()}")
            elif code is None and value["deleted"] is False:
                if schedule_id in story.deleted:
                    problems.append(f"answered not found, yet the log deleted it:"
                                    f" {answer.describe()}")
                elif not any(sid == schedule_id and at <= answer.ended_ms
                             for sid, _, at, _ in story.dispatches):
                    problems.append(f"answered not found while it was still active:"
                                    f" {answer.describe()}")
            elif code == "internal_error" and schedule_id in story.deleted:
                problems.append(f"answered internal_error, yet the log deleted it:"
                                f" {answer.describe()}")
        elif answer.tool == "schedule_list" and code is None:
            listed = {item["id"] for item in value}
            for schedule_id in sorted(_surely_active(answers, answer) - listed):
                problems.append(f"left out {schedule_id}, created before the list started and"
                                f" neither due nor deleted before it ended:"
                                f" {answer.describe()}")
            for item in value:
                created = story.creates.get(item["id"])
                if created is None or created["prompt"] != item["prompt"]:
                    problems.append(f"listed {item['id']} as the log never created it:"
                                    f" {answer.describe()}")
                gone = deleted_at.get((answer.session, item["id"]))
                if gone is not None and gone < answer.started_ms:
                    problems.append(f"listed {item['id']}, answered deleted before the"
                                    f" list started: {answer.describe()}")
    return problems


def _surely_active(answers: list[Answer], listing: Answer) -> set[str]:
    """The ids of ``listing``'s session a true list must show: answered created before it
    started, due only after it ended, and no delete of them begun before it ended."""
    deleting = {a.args["id"] for a in answers if a.session == listing.session
                and a.tool == "schedule_delete" and a.started_ms <= listing.ended_ms}
    return {a.value["id"] for a in answers
            if a.session == listing.session and a.tool == "schedule_create"
            and a.returncode == 0 and a.ended_ms < listing.started_ms
            and parse_instant(a.value["scheduledAt"]) > listing.ended_ms
            and a.value["id"] not in deleting}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """The sessions directory on a tmpfs of DISK_MB this test mounts (root only: CI runs
    as root, and there a failure to mount fails the test)."""
    directory = tmp_path / "sessions"
    directory.mkdir()
    if os.geteuid() != 0 and not in_ci():
        pytest.skip("the chaos test mounts a small tmpfs for its full-disk window, which"
                    " needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs",
                              str(directory)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.fail(f"could not mount a tmpfs on {directory} for the full-disk window:"
                    f" {(mounted.stdout + mounted.stderr).strip()}", pytrace=False)
    try:
        yield directory
    finally:
        if subprocess.run(["umount", str(directory)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(directory)], check=False)


@pytest.fixture(params=["jsonl", pytest.param("postgres", marks=pytest.mark.postgres)])
def chaos_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChaosStore]:
    """The JSONL store on its small tmpfs (the full-disk window), or the PostgreSQL store
    on a private server the test crashes (the database window). That server writes what
    asynchronous commits leave in its memory only every 10 s, so a crash loses every
    such commit no synchronous one made durable after."""
    if request.param == "jsonl":
        sessions = request.getfixturevalue("small_disk")
        yield ChaosStore(sessions, JsonlStore(sessions), "disk-full")
        return
    with private_server(wal_writer_delay="10s", wal_writer_flush_after="0") as database:
        store = PostgresStore(database.url, timeout_s=2)
        try:
            yield ChaosStore(tmp_path / "unused", store, "db-crash", database.url, database)
        finally:
            close_store(store)
            server_log = database.root / "server.log"
            if server_log.exists():
                (tmp_path / "postgres.log").write_bytes(server_log.read_bytes())


@pytest.mark.timeout(480)
def test_every_reminder_is_delivered_exactly_once_through_crashes_pauses_and_redis_loss(
    tmp_path: Path, redis_server: RedisServer, chaos_store: ChaosStore
) -> None:
    run = Run(tmp_path, redis_server, chaos_store, _seed())
    print(f"chaos seed {run.seed}")
    client = redis_server.client()
    calls: threading.Thread | None = None
    try:
        plan = _plan(run.rng, chaos_store.fault)
        fixed = run.create_sessions(plan)
        for host in HOSTS:
            run.spawn(host, "host", *SESSIONS)
        for worker in WORKERS:
            run.spawn(worker, "worker")
        run.spawn("scheduler", "scheduler")
        run.note("wall-clock skews: " + ", ".join(f"{name} {skew:+d} s"
                                                   for name, skew in run.skews.items()))
        coordination = Coordination(client, Settings.from_env(run.env))
        assert wait_until(lambda: all(bool(coordination.leases.live_among([s], now_ms=_now_ms()))
                                      for s in SESSIONS)), run.context()
        run.create_one_shots(plan[-1].end_s)
        run.note("plan: " + ", ".join(step.describe() for step in plan))
        calls = threading.Thread(target=run.tool_calls,
                                 args=(random.Random(f"{run.seed}-calls"),), daemon=True)
        calls.start()
        run.play(plan)
        run.calls_done.set()
        calls.join(120)
        run.note(f"plan played; tool calls during it: {run.answer_summary(ONE_SHOTS)}")

        last_due_s = (run.last_target_ms() - _now_ms()) / 1000
        run.sleep(max(0.0, last_due_s))
        run.note("last one-shot due")
        settled = wait_until(run.settled, timeout=SETTLE_S, interval=0.5)
        run.note(f"settled: {settled}")
        run.sleep(DUPLICATE_WATCH_S)
        print("\n".join(run.timeline))  # shown with -rP, or -s
        run.keep()

        stories = run.stories()
        problems: list[str] = []
        for session, story in stories.items():
            delivered, dispatched = story.delivered(), story.dispatched()
            for schedule_id in sorted(story.creates):
                want = 0 if schedule_id in story.deleted else 1
                create = story.creates[schedule_id]
                if delivered[schedule_id] != want or dispatched[schedule_id] != want:
                    problems.append(f"{session} {schedule_id}"
                                    f" ({create['prompt']}): delivered"
                                    f" {delivered[schedule_id]}x, dispatched"
                                    f" {dispatched[schedule_id]}x, want {want};"
                                    f" {how_created(run.answers, session, create)}")
            problems += [f"{session} {p}" for p in story.ordering_problems()]
        problems += run.early_by_true_time(stories)
        for session, schedule_id in fixed.items():
            if schedule_id not in stories[session].creates:
                problems.append(f"{session}: the fixed-rate {schedule_id} is gone")
        problems += answer_problems(run.answers, stories)
        run.watch()
        if run.deaths:
            problems.append("processes exited on their own:\n" + "\n".join(run.deaths))
        assert not problems, "\n".join(problems) + "\n" + run.context()
        checked = run.check_logs()
        assert checked.returncode == 0, checked.stdout + checked.stderr + run.context()
    finally:
        run.calls_done.set()
        if calls is not None:
            calls.join(60)
        client.close()
        run.procs.close()
