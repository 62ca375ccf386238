"""What one due transaction costs a worker and Redis: N agents, each with one reminder due
now in its own JSONL session, woken in batched jobs as the mover hands a burst on.

Not a test (nothing here asserts a timing): a measurement to run by hand, on a private
``redis-server`` it starts and stops itself::

    .venv/bin/python -m tests.bench.due_batch --agents 4000 --job 500

It prints one JSON line: the worker's CPU and wall microseconds per due transaction, the
redis-server CPU per transaction (from ``INFO``), and Redis's commands per transaction by
name, with the microseconds Redis spent in each (``INFO commandstats``: a script's
commands count both as themselves and inside its ``EVAL``). The worker's session store is
cold, as in a burst: each session is read for the first time by its due transaction.
``--log-format text|json`` writes the worker's log lines (one per dispatch) to
``/dev/null`` in that format, as a worker process logs them; by default nothing is logged.
``--store postgres`` keeps the sessions in PostgreSQL instead (a database the run creates and
drops, tests/postgres_server.py); the line then also has the set-up's create calls' p50 and
p99. ``--pause`` waits for a key press before the batch (print the pid, attach ``strace -c -f
-p PID`` or ``py-spy record -p PID``, then press enter).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.loadtest.sessions import write_sessions
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.collector import tune_for_service
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.logging_setup import configure
from dsh_schedule.shared.settings import LogSettings, Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.naming import store_from_settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.due import DueOwner
from tests.redis_server import RedisServer


def _redis_cpu(info: Any) -> float:
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _stores(settings: Settings, kind: str) -> Callable[[], SessionStore]:
    """Makes a store of ``kind`` over the run's sessions, a new one each call (the
    PostgreSQL database is emptied once, here)."""
    if kind == "jsonl":
        return lambda: store_from_settings(settings)
    from dsh_schedule.shared.store.postgres import PostgresStore
    from tests.postgres_server import empty_database, test_database_url

    url = test_database_url()
    if url is None:
        raise SystemExit("no PostgreSQL to measure on (tests/postgres_server.py)")
    empty_database(url)
    return lambda: PostgresStore(url)


def measure(server: RedisServer, agents: int, job: int, *, pause: bool,
            log_format: str | None = None, store_kind: str = "jsonl") -> dict[str, Any]:
    client = server.client()
    client.flushdb()
    sessions = Path(tempfile.mkdtemp(prefix="due-batch-"))
    settings = Settings(redis_url=server.url(), sessions=sessions, prefix="due:", queue="due")
    names = [f"due-{i:05d}" for i in range(agents)]
    new_store = _stores(settings, store_kind)
    store = new_store()
    if isinstance(store, JsonlStore):
        write_sessions(store, names, [], created_at_ms=wall_clock_ms())
        os.sync()
    else:
        for name in names:
            store.create(SessionHeader(id=name, createdAt=wall_clock_ms()))
    Coordination(client, settings).leases.install(
        "host", names, settings.queue, now_ms=wall_clock_ms(), ttl_s=3 * 3600)
    tools = ScheduleTools(store, Coordination(client, settings), settings, wall_clock_ms)
    # Due an hour ahead, whatever the set-up's pace; the worker's clock starts there.
    due_ms = (wall_clock_ms() // 1000 + 3600) * 1000
    create_ms: list[float] = []
    for name in names:
        started = time.perf_counter()
        result = tools.call(name, "schedule_create",
                            {"prompt": f"reminder for {name}", "at": format_instant(due_ms)})
        create_ms.append((time.perf_counter() - started) * 1000)
        if result.is_error:
            raise SystemExit(f"set-up: {result.content}")
    tools.close()
    shift = due_ms - wall_clock_ms()
    # The worker's store is cold, as in a burst: a store of its own.
    worker_store = new_store()
    owner = DueOwner(worker_store, Coordination(client, settings), settings,
                     clock=lambda: wall_clock_ms() + shift)
    tune_for_service()  # as the worker process does
    if log_format is not None:
        configure(LogSettings(format=log_format), stream=open(os.devnull, "w"))  # noqa: SIM115
    if pause:
        input(f"pid {os.getpid()}: press enter to run the batch ")
    client.config_resetstat()
    redis_before = _redis_cpu(client.info("cpu"))
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    outcomes: Counter[str] = Counter()
    for start in range(0, agents, job):
        found = owner.wake([(name, due_ms) for name in names[start:start + job]])
        outcomes.update(outcome.value for outcome in found.values())
    cpu_s, wall_s = time.process_time() - cpu_before, time.perf_counter() - wall_before
    redis_s = _redis_cpu(client.info("cpu")) - redis_before
    stats: Any = client.info("commandstats")
    commands = {
        name.removeprefix("cmdstat_"): {"calls": round(v["calls"] / agents, 2),
                                        "us": round(v["usec"] / agents, 2)}
        for name, v in sorted(stats.items(), key=lambda kv: -kv[1]["usec"])
        if not name.startswith(("cmdstat_config", "cmdstat_info"))
    }
    create_ms.sort()
    return {
        "store": store_kind, "agents": agents, "job": job, "log_format": log_format,
        "outcomes": dict(outcomes),
        "due_transactions_per_s": round(agents / wall_s, 1),
        "create_p50_ms": round(create_ms[len(create_ms) // 2], 2),
        "create_p99_ms": round(create_ms[min(len(create_ms) - 1, len(create_ms) * 99 // 100)], 2),
        "worker_cpu_us": round(cpu_s / agents * 1e6, 1),
        "worker_wall_us": round(wall_s / agents * 1e6, 1),
        "redis_cpu_us": round(redis_s / agents * 1e6, 1),
        "commands_per_transaction": commands,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=4000)
    parser.add_argument("--job", type=int, default=500,
                        help="wakes per job (the mover's MOVE_BATCH)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--pause", action="store_true")
    parser.add_argument("--store", choices=("jsonl", "postgres"), default="jsonl")
    parser.add_argument("--log-format", choices=("text", "json"),
                        help="log the worker's lines to /dev/null in this format")
    args = parser.parse_args()
    with RedisServer() as server:
        for _ in range(args.runs):
            print(json.dumps(measure(server, args.agents, args.job, pause=args.pause,
                                     log_format=args.log_format, store_kind=args.store)),
                  flush=True)


if __name__ == "__main__":
    main()
