"""What the timers of unloaded sessions cost (docs/benchmarks.md): the rebuild from the
store's index, Redis's memory per timer, an idle scheduler pass.

Not a test (nothing here asserts a timing): a measurement to run by hand::

    .venv/bin/python -m tests.bench.unloaded_timers --sessions 100000

It writes ``--sessions`` session logs (one ``at`` reminder a day ahead each) into a fresh
directory and starts a redis-server of its own, then rebuilds every timer
(``UnloadedTimers.rebuild``) with a fresh store: with no index at all (the scan that
writes it) and with the index current (what a host does after a flush). For each it
prints the wall and CPU seconds of this process and the logs opened; then Redis's bytes
per timer (``used_memory`` before and after), and the commands and CPU microseconds of
Redis of one scheduler pass with nothing due. One JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import redis

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.unloaded import UnloadedTimers
from dsh_schedule.shared.settings import Settings
from tests.bench.due_index import CountingStore, write_logs
from tests.redis_server import RedisServer


def rebuild(timers: UnloadedTimers, root: Path, phase: str) -> None:
    store = CountingStore(root)
    started, cpu = time.perf_counter(), time.process_time()
    written = timers.rebuild(store, "q", now_ms=0)
    print(json.dumps({"phase": phase, "timers_written": written,
                      "seconds": round(time.perf_counter() - started, 3),
                      "cpu_seconds": round(time.process_time() - cpu, 3),
                      "log_opens": store.log_opens}))


def idle_pass(client: redis.Redis, timers: UnloadedTimers) -> None:
    before = client.info("commandstats")
    usec = sum(v["usec"] for v in before.values())
    calls = sum(v["calls"] for v in before.values())
    timers.take_due(0)
    after = client.info("commandstats")
    print(json.dumps({
        "idle_pass_commands": sum(v["calls"] for v in after.values()) - calls - 1,
        "idle_pass_redis_us": sum(v["usec"] for v in after.values()) - usec}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unloaded-timers-"))
    server = RedisServer(work / "redis").start()
    try:
        client = server.client()
        root = work / "sessions"
        started = time.perf_counter()
        write_logs(root, args.sessions)
        print(json.dumps({"sessions": args.sessions,
                          "write_logs_seconds": round(time.perf_counter() - started, 3)}))
        timers = UnloadedTimers(client, Keys("b:"), Settings(wake_unloaded=True))
        empty = int(client.info("memory")["used_memory"])
        rebuild(timers, root, "no_index")
        used = int(client.info("memory")["used_memory"])
        print(json.dumps({"redis_bytes_per_timer": round((used - empty) / args.sessions, 1)}))
        client.flushdb()
        rebuild(timers, root, "index_current")
        idle_pass(client, timers)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
