"""How late a reminder in a session no host has loaded reaches the session
(docs/benchmarks.md): due → its message appended, with real processes.

Not a test (nothing here asserts a timing): a measurement to run by hand::

    .venv/bin/python -m tests.bench.unloaded_latency --reminders 20

It starts a redis-server of its own, a ``scheduler``, a ``worker`` and a ``host
--all-sessions`` with the default timings, then, one at a time, creates a session and an
``after_seconds`` reminder in it with no host (the session is never loaded), and waits for
its message. It prints, as one JSON line, the lateness of each message (its append time
minus the reminder's target, both on Redis's clock) and the p50, p99 and max.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import USER_MESSAGE, SessionHeader
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.redis_server import RedisServer
from tests.support import Processes, process_env


def lateness_ms(store: JsonlStore, session: str, target_ms: int) -> int | None:
    for event in store.read(session).events:
        if event.type == USER_MESSAGE and event.data["source"].get("plugin") == "tool-schedule":
            return event.time - target_ms
    return None


def burst(store: JsonlStore, coord: Coordination, settings: Settings, procs: Processes,
          count: int) -> None:
    """``count`` sessions whose reminders fall due in the same second, created with no
    host; then the lateness of each message and the host's peak RSS."""
    at_ms = coord.clock() + 30_000 + count * 10
    at_ms -= at_ms % 1000
    tools = ScheduleTools(store, coord, settings, lambda: at_ms - 600_000)
    started = time.perf_counter()
    for n in range(count):
        store.create(SessionHeader(id=f"b{n}", createdAt=coord.clock(), timeZone="UTC"))
        tools.call(f"b{n}", "schedule_create", {"prompt": "p", "after_seconds": 600})
    created_s = time.perf_counter() - started
    late: dict[str, int] = {}
    deadline = time.monotonic() + 900
    while len(late) < count and time.monotonic() < deadline:
        time.sleep(1.0)
        for n in range(count):
            if f"b{n}" not in late and (found := lateness_ms(store, f"b{n}", at_ms)) is not None:
                late[f"b{n}"] = found
    peak = Path(f"/proc/{procs.procs['host'].pid}/status").read_text()
    rss = next(line.split()[1] for line in peak.splitlines() if line.startswith("VmHWM"))
    ordered = sorted(late.values())
    print(json.dumps({
        "burst": count, "create_seconds": round(created_s, 1), "delivered": len(late),
        "p50_ms": ordered[len(ordered) // 2] if ordered else None,
        "p99_ms": ordered[round(0.99 * (len(ordered) - 1))] if ordered else None,
        "max_ms": ordered[-1] if ordered else None, "host_peak_rss_kib": int(rss)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reminders", type=int, default=20)
    parser.add_argument("--after", type=int, default=2, help="seconds to each reminder")
    parser.add_argument("--burst", type=int, default=0,
                        help="instead, this many sessions whose reminders fall due at once")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unloaded-latency-"))
    server = RedisServer(work / "redis").start()
    env = process_env(server.url(), work / "sessions", WAKE_UNLOADED="on")
    procs = Processes(work, env)
    try:
        settings = Settings.from_env(env)
        store = JsonlStore(settings.sessions)
        coord = Coordination(server.client(), settings)
        tools = ScheduleTools(store, coord, settings, coord.clock)
        procs.spawn("scheduler", "scheduler")
        procs.spawn("worker", "worker")
        procs.spawn("host", "host", "--all-sessions",
                    *(() if args.burst else ("--unload-after", "5")))
        while "rebuilt" not in procs.log_tail("host", 100):
            time.sleep(0.1)
        if args.burst:
            burst(store, coord, settings, procs, args.burst)
            return
        late: list[int] = []
        for n in range(args.reminders):
            session = f"s{n}"
            store.create(SessionHeader(id=session, createdAt=coord.clock(), timeZone="UTC"))
            created = json.loads(tools.call(session, "schedule_create", {
                "prompt": "p", "after_seconds": args.after}).content)
            target = parse_instant(created["scheduledAt"])
            deadline = time.monotonic() + 60
            while (found := lateness_ms(store, session, target)) is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"no message in {session}:\n{procs.describe()}")
                time.sleep(0.05)
            late.append(found)
        ordered = sorted(late)
        print(json.dumps({
            "reminders": len(late), "lateness_ms": late,
            "p50_ms": ordered[len(ordered) // 2],
            "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
            "max_ms": ordered[-1]}))
    finally:
        procs.close()
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
