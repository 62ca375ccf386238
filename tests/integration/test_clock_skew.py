"""Skewed clocks under real processes (docs/decisions.md#one-clock-for-every-decision): a
``dsh-schedule host``, a ``worker`` and a ``scheduler`` on a Redis this test starts, some
of them with a wall clock shifted by the test-only ``DSH_SCHEDULE_TEST_CLOCK_SKEW``.

"True time" is Redis's clock, which is this machine's: the test watches the session logs
from its own process and notes when each dispatch record first shows up. A record seen
before its target was written early, whatever time the record itself carries.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.clock import SKEW_ENV
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent, SessionHeader
from dsh_schedule.shared.core.instant import format_instant, parse_instant
from dsh_schedule.shared.core.records import AtSchedule, CreateChange, encode_change
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.integration.test_chaos import TIMINGS, LogStory
from tests.redis_server import RedisServer
from tests.support import Processes, process_env, wait_until

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SESSION = "skewed"
# A hot loop of wakes and re-arms costs thousands of commands a second; an idle
# deployment of one host, one worker and a scheduler moving ten times a second, tens.
IDLE_COMMANDS_PER_S = 400


def _true_ms() -> int:
    """This machine's clock, which is Redis's (the test's redis-server runs here)."""
    return time.time_ns() // 1_000_000


class Watch:
    """Notes, by the true clock, when each dispatch record first shows up in the log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.first_seen: dict[tuple[str, int], int] = {}  # (id, seq) -> true ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            seen = _true_ms()
            for schedule_id, seq, _at, _accepted in LogStory.read(self.path).dispatches:
                self.first_seen.setdefault((schedule_id, seq), seen)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class SkewRun:
    """A host, a worker and a scheduler, each with its own clock skew (seconds)."""

    def __init__(self, tmp_path: Path, server: RedisServer) -> None:
        self.sessions = tmp_path / "sessions"
        self.sessions.mkdir()
        self.server = server
        self.env = process_env(server.url(), self.sessions, PREFIX="skew:", QUEUE="skew",
                               **TIMINGS)
        self.procs = Processes(tmp_path, self.env)
        self.store = JsonlStore(self.sessions)
        self.client = server.client()
        self.coordination = Coordination(self.client, Settings.from_env(self.env))
        self.intended: dict[str, int] = {}  # prompt -> its target by the true clock
        self.watch: Watch | None = None

    def write_session(self, *after_s: float) -> None:
        """The session, with a one-shot due ``after_s`` seconds from now (true time) for
        each value, written straight into its log before any process starts."""
        now = _true_ms()
        self.store.create(SessionHeader(id=SESSION, createdAt=now - 60_000))
        events = []
        for n, after in enumerate(after_s, start=1):
            target = now + round(after * 1000)
            prompt = f"written {n}"
            self.intended[prompt] = target
            events.append(NewEvent(type=SCHEDULE_CHANGE, time=now - 30_000,
                                   data=encode_change(CreateChange(schedule=AtSchedule(
                                       id=f"schedule-{n}", prompt=prompt,
                                       scheduledAt=format_instant(target))))))
        self.store.append(SESSION, events, expected_seq=0)
        self.store.flush(SESSION)
        self.watch = Watch(self.store.path(SESSION))

    def start(self, *, host: float = 0, worker: float = 0, scheduler: float = 0,
              **settings: str) -> None:
        """The three processes with these skews (seconds) and ``DSH_SCHEDULE_<NAME>``
        settings beside the test timings."""
        self.env.update({f"DSH_SCHEDULE_{name}": value for name, value in settings.items()})
        for name, skew in (("host", host), ("worker", worker), ("scheduler", scheduler)):
            args = ("host", SESSION) if name == "host" else (name,)
            self.procs.spawn(name, *args, env={SKEW_ENV: str(skew)} if skew else None)
        coord = self.coordination
        assert wait_until(lambda: bool(coord.leases.live_among([SESSION], now_ms=coord.clock())),
                          timeout=60), \
            self.procs.describe()

    def create(self, prompt: str, after_s: int, *, skew: float = 0) -> None:
        """A one-shot through ``dsh-schedule call`` (a host's tools) with its own skew;
        its intended target is the call's start plus ``after_s`` by the true clock."""
        started = _true_ms()
        result = self.procs.run("call", SESSION, "schedule_create",
                                json.dumps({"prompt": prompt, "after_seconds": after_s}),
                                env={SKEW_ENV: str(skew)} if skew else None)
        assert result.returncode == 0, result.stdout + result.stderr
        self.intended[prompt] = started + after_s * 1000

    def story(self) -> LogStory:
        return LogStory.read(self.store.path(SESSION))

    def delivered_all(self) -> bool:
        story = self.story()
        prompts = {s["prompt"] for sid, s in story.creates.items() if sid in story.delivered()}
        return prompts >= set(self.intended)

    def commands(self) -> int:
        """Commands Redis has run so far (INFO commandstats)."""
        stats: dict[str, Any] = self.client.info("commandstats")
        return sum(int(entry["calls"]) for entry in stats.values())

    def problems(self) -> list[str]:
        """Each reminder not delivered exactly once, dispatched before its intended
        target by the true clock, or logged with a time later than it was written."""
        assert self.watch is not None
        self.watch.stop()
        story = self.story()
        problems = []
        by_prompt = {s["prompt"]: sid for sid, s in story.creates.items()}
        delivered, dispatched = story.delivered(), story.dispatched()
        for prompt, target in self.intended.items():
            schedule_id = by_prompt.get(prompt)
            if schedule_id is None:
                problems.append(f"{prompt}: not in the log")
                continue
            if delivered[schedule_id] != 1 or dispatched[schedule_id] != 1:
                problems.append(f"{prompt}: delivered {delivered[schedule_id]}x, "
                                f"dispatched {dispatched[schedule_id]}x")
            for sid, seq, at, _accepted in story.dispatches:
                if sid != schedule_id:
                    continue
                seen = self.watch.first_seen.get((sid, seq))
                if seen is not None and seen < target:
                    problems.append(f"{prompt}: dispatch seen {target - seen} ms before "
                                    f"its target {format_instant(target)}")
                if seen is not None and at > seen + 50:
                    problems.append(f"{prompt}: dispatch logged at {format_instant(at)}, "
                                    f"{at - seen} ms after it was written")
                if at < parse_instant(story.creates[sid]["scheduledAt"]):
                    problems.append(f"{prompt}: dispatch logged before its target")
        return problems

    def context(self) -> str:
        return self.procs.describe()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.procs.close()
        self.client.close()


@pytest.fixture
def run(tmp_path: Path, redis_server: RedisServer) -> Iterator[SkewRun]:
    r = SkewRun(tmp_path, redis_server)
    yield r
    r.close()


@pytest.mark.timeout(180)
def test_a_worker_30_s_ahead_dispatches_nothing_early_by_true_time(run: SkewRun) -> None:
    # given one-shots due 15, 23 and 31 s from now by the true clock
    run.write_session(15, 23, 31)
    # when the worker's wall clock runs 30 s ahead (the host and the scheduler are right),
    # within the lease's TTL (the default's)
    run.start(worker=30, LEASE_TTL="60", LEASE_RENEW="20")
    # then each is delivered once, none dispatched before its target by the true clock,
    # and each dispatch record carries the true time it was decided at
    assert wait_until(run.delivered_all, timeout=90, interval=0.5), run.context()
    problems = run.problems()
    assert not problems, "\n".join(problems) + "\n" + run.context()


@pytest.mark.timeout(180)
def test_a_worker_90_s_ahead_and_a_host_90_s_behind_still_deliver_on_time(
    run: SkewRun
) -> None:
    # given a one-shot due 15 s from now, written in the log
    run.write_session(15)
    # when the worker runs 90 s ahead and the host 90 s behind (past the lease's TTL),
    run.start(host=-90, worker=90)
    # and a host's tools 90 s behind create a one-shot due 20 s after the call
    run.create("relative", 20, skew=-90)
    # then both are delivered once, neither before its target by the true clock
    assert wait_until(run.delivered_all, timeout=90, interval=0.5), run.context()
    problems = run.problems()
    assert not problems, "\n".join(problems) + "\n" + run.context()


@pytest.mark.timeout(180)
def test_a_worker_90_s_behind_and_a_scheduler_90_s_ahead_make_no_hot_loop(
    run: SkewRun
) -> None:
    # given a one-shot due 25 s from now by the true clock
    run.write_session(25)
    # when the worker runs 90 s behind and the scheduler 90 s ahead
    run.start(worker=-90, scheduler=90)
    time.sleep(3)  # past the start-up's rebuild and the new lease's wake
    # then, until it is due, Redis runs what an idle deployment costs, not a hot loop
    before, started = run.commands(), time.monotonic()
    time.sleep(5)
    rate = (run.commands() - before) / (time.monotonic() - started)
    print(f"{rate:.0f} Redis commands/s while the reminder waits")  # shown with -rP
    assert rate < IDLE_COMMANDS_PER_S, f"{rate:.0f} commands/s\n{run.context()}"
    # and it is delivered once, not early by the true clock
    assert wait_until(run.delivered_all, timeout=90, interval=0.5), run.context()
    problems = run.problems()
    assert not problems, "\n".join(problems) + "\n" + run.context()
