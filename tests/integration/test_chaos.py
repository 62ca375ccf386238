"""Chaos under real processes: one ``dsh-schedule host``, two ``worker``s and a
``scheduler`` on a Redis this test starts, while a seeded random plan SIGKILLs and
restarts each kind of process, pauses a worker past its lock's time to live, and kills
Redis (restarting it empty, then running ``dsh-schedule rebuild``).

At the end every one-shot reminder is delivered exactly once and has exactly one dispatch
record, each fixed-rate reminder's one occurrence in the run is dispatched and delivered
once, and every log passes ``dsh-schedule check``.

The seed comes from ``DSH_SCHEDULE_CHAOS_SEED`` (random otherwise) and is part of every
assertion message; the same seed gives the same plan and due times, though not the same
interleaving of real processes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.records import CreateChange, EverySchedule, encode_change
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.redis_server import RedisServer
from tests.support import (
    Processes,
    delivered_counts,
    dispatch_counts,
    process_env,
    wait_until,
)

pytestmark = [pytest.mark.chaos, pytest.mark.redis, pytest.mark.slow]

SEED_ENV = "DSH_SCHEDULE_CHAOS_SEED"
SESSIONS = ("chaos-0", "chaos-1", "chaos-2")
ONE_SHOTS = 50
DUE_S = (4, 70)  # one-shots fall due this many seconds after they are created
FIXED_RATE_DUE_S = (20, 40, 60)  # the one occurrence of each fixed-rate reminder in the run
CHAOS_S = (2, 62)  # the plan's actions start in this window
SETTLE_S = 45  # after the last due time: room for expired locks, claims and reconciles
DUPLICATE_WATCH_S = 5  # a second delivery would show up in this time
WORKERS = ("worker-a", "worker-b")

TIMINGS = {
    "LEASE_TTL": "6",
    "LEASE_RENEW": "1",
    "LOCK_TTL": "2",
    "MAINTENANCE_TTL": "2",
    "TURN_TTL": "10",
    "MOVER_INTERVAL": "0.1",
    "RECONCILE_INTERVAL": "2",
}
LOCK_TTL_S = float(TIMINGS["LOCK_TTL"])


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _seed() -> int:
    named = os.environ.get(SEED_ENV)
    return int(named) if named else random.SystemRandom().randrange(2**32)


def _plan(rng: random.Random) -> list[tuple[float, str, str]]:
    """(start second, action, target) in time order."""
    actions = [("kill", rng.choice(WORKERS)) for _ in range(rng.randint(1, 3))]
    actions += [("kill", "scheduler") for _ in range(rng.randint(1, 2))]
    actions += [("kill", "host") for _ in range(rng.randint(1, 2))]
    actions += [("pause", rng.choice(WORKERS)) for _ in range(rng.randint(1, 2))]
    actions += [("redis-loss", "redis")]
    return sorted((round(rng.uniform(*CHAOS_S), 1), action, target)
                  for action, target in actions)


class Run:
    """The processes, the Redis and the timeline of one chaos run."""

    def __init__(self, tmp_path: Path, server: RedisServer, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.server = server
        self.sessions = tmp_path / "sessions"
        self.env = process_env(server.url(), self.sessions, PREFIX="chaos:", QUEUE="chaos",
                               **TIMINGS)
        self.procs = Processes(tmp_path, self.env)
        self.store = JsonlStore(self.sessions)
        self.started = time.monotonic()
        self.timeline: list[str] = []

    def note(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.1f}s {text}")

    def context(self) -> str:
        """What a failure message needs to reproduce and understand the run."""
        return (f"chaos seed {self.seed} (rerun with {SEED_ENV}={self.seed})\n"
                + "\n".join(self.timeline) + "\n" + self.procs.describe())

    # -- set-up ---------------------------------------------------------------------

    def create_sessions(self) -> dict[str, str]:
        """Sessions made ten minutes ago, each with a fixed-rate reminder made five
        minutes ago whose first occurrence falls due during the run; its id per session."""
        now = _now_ms()
        fixed: dict[str, str] = {}
        for session, due_s in zip(SESSIONS, FIXED_RATE_DUE_S, strict=True):
            self.store.create(SessionHeader(id=session, createdAt=now - 600_000))
            target = now + due_s * 1000
            change = CreateChange(schedule=EverySchedule(
                id="schedule-1", prompt=f"every 300 s in {session}", everySeconds=300,
                scheduledAt=format_instant(target)))
            self.store.append(session, [NewEvent(type=SCHEDULE_CHANGE, time=target - 300_000,
                                                 data=encode_change(change))], expected_seq=0)
            self.store.flush(session)
            fixed[session] = "schedule-1"
        return fixed

    def create_one_shots(self) -> dict[str, list[str]]:
        """ONE_SHOTS reminders through ``dsh-schedule call``, spread over the sessions and
        the run; their ids per session."""
        jobs = [(SESSIONS[i % len(SESSIONS)], f"one-shot {i}", self.rng.randint(*DUE_S))
                for i in range(ONE_SHOTS)]

        def create(job: tuple[str, str, int]) -> tuple[str, str]:
            session, prompt, after = job
            result = self.procs.run("call", session, "schedule_create",
                                    json.dumps({"prompt": prompt, "after_seconds": after}))
            assert result.returncode == 0, result.stdout + result.stderr
            return session, json.loads(result.stdout)["id"]

        ids: dict[str, list[str]] = {session: [] for session in SESSIONS}
        with ThreadPoolExecutor(8) as pool:
            for session, schedule_id in pool.map(create, jobs):
                ids[session].append(schedule_id)
        self.note(f"created {ONE_SHOTS} one-shots, due {DUE_S[0]}..{DUE_S[1]} s on")
        return ids

    # -- the plan -------------------------------------------------------------------

    def play(self, plan: list[tuple[float, str, str]]) -> None:
        begin = time.monotonic()
        for at_s, action, target in plan:
            time.sleep(max(0.0, begin + at_s - time.monotonic()))
            getattr(self, action.replace("-", "_"))(target)

    def kill(self, name: str) -> None:
        self.procs.kill(name)
        pause = round(self.rng.uniform(0.0, 3.0), 1)
        self.note(f"SIGKILL {name}; restart in {pause} s")
        time.sleep(pause)
        self.procs.restart(name)

    def pause(self, name: str) -> None:
        hold = round(LOCK_TTL_S + self.rng.uniform(1.0, 3.0), 1)
        self.note(f"SIGSTOP {name} for {hold} s (lock TTL {LOCK_TTL_S:g} s)")
        self.procs.send(name, signal.SIGSTOP)
        time.sleep(hold)
        self.procs.send(name, signal.SIGCONT)
        self.note(f"SIGCONT {name}")

    def redis_loss(self, _target: str) -> None:
        down = round(self.rng.uniform(2.0, 8.0), 1)
        self.note(f"SIGKILL redis-server; down for {down} s, back empty")
        self.server.kill()
        time.sleep(down)
        self.server.start()
        rebuilt = self.procs.run("rebuild")
        self.note(f"redis-server back; dsh-schedule rebuild exited {rebuilt.returncode}:"
                  f" {(rebuilt.stdout + rebuilt.stderr).strip()[-200:]}")

    # -- observations ---------------------------------------------------------------

    def all_delivered(self, expected: dict[str, list[str]]) -> Callable[[], bool]:
        def check() -> bool:
            return all(set(ids) <= set(delivered_counts(self.store, session))
                       for session, ids in expected.items())
        return check


@pytest.mark.timeout(240)
def test_every_reminder_is_delivered_exactly_once_through_crashes_pauses_and_redis_loss(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    run = Run(tmp_path, redis_server, _seed())
    print(f"chaos seed {run.seed}")
    client = redis_server.client()
    try:
        fixed = run.create_sessions()
        run.procs.spawn("host", "host", *SESSIONS)
        for worker in WORKERS:
            run.procs.spawn(worker, "worker")
        run.procs.spawn("scheduler", "scheduler")
        coordination = Coordination(client, Settings.from_env(run.env))
        assert wait_until(lambda: all(coordination.leases.is_live(s, now_ms=_now_ms())
                                      for s in SESSIONS)), run.context()
        one_shots = run.create_one_shots()
        created = time.monotonic()
        plan = _plan(run.rng)
        run.note("plan: " + ", ".join(f"{a} {t} at {s} s" for s, a, t in plan))
        run.play(plan)
        time.sleep(max(0.0, created + DUE_S[1] - time.monotonic()))
        run.note("last one-shot due")

        expected = {s: [*one_shots[s], fixed[s]] for s in SESSIONS}
        settled = wait_until(run.all_delivered(expected), timeout=SETTLE_S, interval=0.5)
        run.note(f"settled: {settled}")
        time.sleep(DUPLICATE_WATCH_S)
        print("\n".join(run.timeline))  # shown with -rP, or -s

        problems: list[str] = []
        for session, ids in expected.items():
            delivered = delivered_counts(run.store, session)
            dispatched = dispatch_counts(run.store, session)
            for schedule_id in ids:
                if delivered[schedule_id] != 1 or dispatched[schedule_id] != 1:
                    problems.append(f"{session} {schedule_id}: delivered"
                                    f" {delivered[schedule_id]}x, dispatched"
                                    f" {dispatched[schedule_id]}x")
            unknown = (set(delivered) | set(dispatched)) - set(ids)
            if unknown:
                problems.append(f"{session}: unexpected ids {sorted(unknown)}")
        died = run.procs.dead()
        if died:
            problems.append(f"processes died on their own: {died}")
        assert not problems, "\n".join(problems) + "\n" + run.context()
        checked = run.procs.check(run.sessions)
        assert checked.returncode == 0, checked.stdout + checked.stderr + run.context()
    finally:
        client.close()
        run.procs.close()
