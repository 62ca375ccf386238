"""How fast the system recovers from what died: a worker SIGKILLed inside a due
transaction, a host SIGKILLed holding followups it had not delivered, Redis restarted
empty (docs/architecture.md#a-dead-workers-wakes).

Not a test (nothing here asserts a timing): a measurement to run by hand, at default
settings, on a private ``redis-server`` it starts and stops itself::

    .venv/bin/python -m tests.bench.faults --trials 20 --parallel 6

Each trial has a prefix, a queue and a sessions directory of its own, and real
``dsh-schedule`` processes:

- ``worker:<point>``: a worker with ``DSH_SCHEDULE_CRASH_AT=<point>`` (before-followup,
  after-followup, after-append), a scheduler and a ``dsh-schedule host``; one reminder due
  in 2 s. Once the worker has killed itself a fresh worker starts; the figure is the time
  from the kill to the reminder in the session log, and the trial checks, 5 s later, that
  it is there exactly once.
- ``host:unread`` and ``host:read``: the host is stopped (SIGSTOP) before the reminder is
  due, so the worker's announcement waits for it; with ``read``, the followup entry is
  also read into the host's consumer group under a consumer of its own, as a host killed
  between reading an entry and delivering it leaves it. Then the host is SIGKILLed and a
  fresh one started: the time from the kill to the delivery.
- ``redis:restart`` and ``redis:flush``: a host with one session, a worker and a
  scheduler; Redis is killed and
  started again empty on its port, or FLUSHALL empties it while it runs; the time from
  Redis answering empty to the worker being registered with rq again and
  ``dsh-schedule health`` exiting 0 (right after a flush no lease is back, so health alone
  passes without a worker until the host's next renewal; a trial that gives up reports
  null).

It prints one JSON line per kind: trials, delivered exactly once, p50, p99, max seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.redis_server import RedisServer
from tests.support import Processes, dispatch_records, process_env, reminder_texts

POINTS = ("before-followup", "after-followup", "after-append")
SESSION = "bench-s1"
WATCH_S = 5.0  # a second delivery would show up within this
GIVE_UP_S = 240.0
LIMITS = {"give_up_s": GIVE_UP_S}  # --give-up


def _wait(condition: Callable[[], bool], timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(every)
    return condition()


def _delivered(store: JsonlStore) -> int:
    try:
        return len(reminder_texts(store, SESSION))
    except Exception:
        return 0


class Trial:
    def __init__(self, server: RedisServer, root: Path, name: str) -> None:
        self.root = root
        self.sessions = root / "sessions"
        self.prefix, self.queue = f"{name}:", name
        self.env = process_env(server.url(), self.sessions, PREFIX=self.prefix,
                               QUEUE=self.queue)
        self.procs = Processes(root, self.env)
        self.store = JsonlStore(self.sessions)
        self.client = server.client()
        run = self.procs.run("session", "create", SESSION)
        if run.returncode != 0:
            raise RuntimeError(run.stderr)

    def create(self, after_s: int = 2) -> None:
        run = self.procs.run("call", SESSION, "schedule_create",
                             json.dumps({"prompt": "bench", "after_seconds": after_s}))
        if run.returncode != 0:
            raise RuntimeError(run.stdout + run.stderr)

    def host_ready(self) -> bool:
        return bool(self.client.hget(Keys(self.prefix).agent_host(), SESSION))

    def result(self, started: float) -> dict[str, Any]:
        if not _wait(lambda: _delivered(self.store) >= 1, LIMITS["give_up_s"]):
            return {"seconds": None, "once": False}
        seconds = time.monotonic() - started
        time.sleep(WATCH_S)
        once = _delivered(self.store) == 1 and len(dispatch_records(self.store, SESSION)) == 1
        return {"seconds": seconds, "once": once}

    def close(self) -> None:
        self.procs.close()
        keys = list(self.client.scan_iter(match=f"{self.prefix}*", count=1000))
        keys += list(self.client.scan_iter(match=f"rq:*{self.queue}*", count=1000))
        for start in range(0, len(keys), 500):
            self.client.delete(*keys[start : start + 500])


def worker_trial(server: RedisServer, root: Path, name: str, point: str) -> dict[str, Any]:
    trial = Trial(server, root, name)
    try:
        trial.procs.env = {**trial.env, "DSH_SCHEDULE_CRASH_AT": point}
        crashing = trial.procs.spawn("crashing", "worker")
        trial.procs.env = trial.env
        trial.procs.spawn("scheduler", "scheduler")
        trial.procs.spawn("host", "host", SESSION)
        if not _wait(trial.host_ready, 60):
            raise RuntimeError("host did not lease its session")
        trial.create()
        if not _wait(lambda: crashing.poll() is not None, 60):
            raise RuntimeError("the worker did not reach its crash point")
        started = time.monotonic()
        trial.procs.spawn("worker", "worker")
        return trial.result(started)
    finally:
        trial.close()


def host_trial(server: RedisServer, root: Path, name: str, read: bool) -> dict[str, Any]:
    trial = Trial(server, root, name)
    try:
        trial.procs.spawn("worker", "worker")
        trial.procs.spawn("scheduler", "scheduler")
        trial.procs.spawn("host", "host", SESSION)
        if not _wait(trial.host_ready, 60):
            raise RuntimeError("host did not lease its session")
        time.sleep(1.0)  # the host blocks in its ready read
        trial.procs.send("host", signal.SIGSTOP)
        trial.create()
        stream = Keys(trial.prefix).followups(SESSION)
        if not _wait(lambda: len(dispatch_records(trial.store, SESSION)) == 1, 60):
            raise RuntimeError("nothing was dispatched")
        _wait(lambda: bool(trial.client.exists(stream)), 10)
        if read:  # the state a host killed between reading and delivering leaves
            trial.client.xreadgroup("host", "host-killed", {stream: ">"}, count=10)
        trial.procs.kill("host")
        started = time.monotonic()
        trial.procs.spawn("host", "host", SESSION)
        return trial.result(started)
    finally:
        trial.close()


def redis_trial(root: Path, name: str, *, flush: bool) -> dict[str, Any]:
    with RedisServer(root / "redis") as server:
        env = process_env(server.url(), root / "sessions", PREFIX=f"{name}:", QUEUE=name)
        procs = Processes(root, env)
        try:
            # A host's live agent: health then needs a worker on the queue, not only a
            # scheduler heartbeat.
            if procs.run("session", "create", SESSION).returncode != 0:
                raise RuntimeError("could not create the session")
            procs.spawn("host", "host", SESSION)
            procs.spawn("worker", "worker")
            procs.spawn("scheduler", "scheduler")

            client = server.client()

            def healthy() -> bool:
                # Registered with rq, not only "healthy" because no lease is back yet.
                members = client.smembers(f"rq:workers:{name}")
                return (any(client.hexists(m, "birth") for m in members)
                        and procs.run("health", timeout=30).returncode == 0)

            if not _wait(healthy, 60, every=0.2):
                raise RuntimeError("never healthy")
            if flush:
                server.client().flushall()
            else:
                server.restart()
            started = time.monotonic()
            ok = _wait(healthy, LIMITS["give_up_s"], every=0.2)
            return {"seconds": time.monotonic() - started if ok else None, "once": ok}
        finally:
            procs.close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(kind: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["seconds"] for r in results if r["seconds"] is not None]
    return {
        "kind": kind, "trials": len(results),
        "delivered_once": sum(1 for r in results if r["once"]),
        "p50_s": round(_quantile(seconds, 0.5), 1) if seconds else None,
        "p99_s": round(_quantile(seconds, 0.99), 1) if seconds else None,
        "max_s": round(max(seconds), 1) if seconds else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--kinds", default=",".join(
        [*(f"worker:{p}" for p in POINTS), "host:unread", "host:read", "redis:restart",
         "redis:flush"]))
    parser.add_argument("--give-up", type=float, default=GIVE_UP_S,
                        help="seconds a trial waits for its delivery or health")
    args = parser.parse_args()
    LIMITS["give_up_s"] = args.give_up
    kinds = args.kinds.split(",")
    base = Path(tempfile.mkdtemp(prefix="dsh-bench-faults-"))
    lock = threading.Lock()
    with RedisServer(base / "redis") as server:
        for kind in kinds:
            def one(i: int, kind: str = kind) -> dict[str, Any]:
                root = base / f"{kind.replace(':', '-')}-{i}"
                root.mkdir(parents=True)
                name = f"b{os.getpid()}{kind.replace(':', '').replace('-', '')}{i}"
                group, _sep, detail = kind.partition(":")
                if group == "worker":
                    result = worker_trial(server, root, name, detail)
                elif group == "host":
                    result = host_trial(server, root, name, read=detail == "read")
                else:
                    result = redis_trial(root, name, flush=detail == "flush")
                with lock:
                    print(json.dumps({"kind": kind, "trial": i, **result}), file=sys.stderr,
                          flush=True)
                return result

            parallel = 1 if kind.startswith("redis:") else args.parallel
            with ThreadPoolExecutor(parallel) as pool:
                results = list(pool.map(one, range(args.trials)))
            print(json.dumps(summary(kind, results)), flush=True)


if __name__ == "__main__":
    main()
