"""A burst of reminders due in the same second on live agents, and the idle cost of those
agents, on each session store in the same run (docs/benchmarks.md#the-postgresql-store).

Not a test (nothing here asserts a timing): a measurement to run by hand::

    .venv/bin/python -m tests.bench.store_burst --agents 10000 --idle 60

For each store (``--stores``, default ``jsonl,postgres``) it starts a redis-server of its
own (and, for PostgreSQL, a server of its own: ``tests/postgres_private.py``), creates
``--agents`` sessions, starts ``--workers`` ``worker`` processes, a ``scheduler`` and one
``host`` serving every session (the load test's ``RedisRuntime``), and waits until every
agent is leased. Then:

- idle: for ``--idle`` seconds nothing is due; it counts the statements the processes sent
  the database (from the server's log, every statement logged meanwhile), the commands
  Redis ran and the CPU of each process and of the redis-server (the load test's
  ``cpu_window``);
- burst: one reminder per agent, all due in the same whole second (created through the
  tools with ``--threads`` threads, a clock set back so each is ``after_seconds`` 600
  from it), then the lateness of each dispatch and each delivered message (its append
  time minus the target) read from the logs once all are delivered.

It prints one JSON line per store. A run that fails keeps its directory, with the
processes' logs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.loadtest.process_idle import cpu_window
from dsh_schedule.loadtest.process_runtime import RedisRuntime
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, SessionHeader
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.shared.store.naming import close_store, open_store
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.store.postgres import EVENTS
from tests.postgres_private import PrivateServer
from tests.redis_server import RedisServer

BENCH = "store-burst-bench"  # this measurement's own connections
LEAD_S = 20.0  # the burst's due second is at least this far after its creates begin
CREATES_PER_S = 150  # a low guess of the create rate, for the lead


def _log_statements(server: PrivateServer, on: bool) -> None:
    """Have the server log every statement (with the client's application name), or stop:
    the statistics views lag behind idle connections, the log does not."""
    with psycopg.connect(server.url, autocommit=True, application_name=BENCH) as conn:
        if on:
            conn.execute("ALTER SYSTEM SET log_statement = 'all'")
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%m %a [%p] '")
        else:
            conn.execute("ALTER SYSTEM RESET log_statement")
            conn.execute("ALTER SYSTEM RESET log_line_prefix")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(1.0)


def _statements_since(server: PrivateServer, offset: int) -> tuple[int, int]:
    """The statements other clients ran since ``offset`` of the server's log, and the log's
    end."""
    path = server.root / "server.log"
    with path.open("rb") as log:
        log.seek(offset)
        text = log.read()
    # A statement with parameters is logged as "execute <name>: ...", one without as
    # "statement: ...".
    lines = [line for line in text.splitlines()
             if b"LOG:  statement: " in line or b"LOG:  execute " in line]
    return sum(f" {BENCH} ".encode() not in line for line in lines), offset + len(text)


def _percentiles(values: list[int]) -> dict[str, int | None]:
    ordered = sorted(values)
    if not ordered:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"p50_ms": ordered[len(ordered) // 2],
            "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
            "max_ms": ordered[-1]}


def _marks(store: SessionStore, session: str, target_ms: int) -> tuple[int | None, int | None]:
    """The lateness of the session's first reminder dispatch and delivered message."""
    dispatched = delivered = None
    for event in store.read(session).events:
        if dispatched is None and event.type == SCHEDULE_CHANGE and \
                event.data.get("operation") == "dispatch":
            dispatched = event.time - target_ms
        elif event.type == USER_MESSAGE and \
                event.data.get("source", {}).get("plugin") == "tool-schedule":
            delivered = event.time - target_ms
            break
    return dispatched, delivered


def _delivered(kind: str, store: SessionStore, pg: PrivateServer | None,
               names: list[str]) -> int:
    """How many sessions hold a reminder message: one query on PostgreSQL, the tails of
    the files on JSONL."""
    if pg is not None:
        with psycopg.connect(pg.url, autocommit=True, application_name=BENCH) as conn:
            row = conn.execute(
                f"SELECT count(DISTINCT session_id) FROM {EVENTS} WHERE position("
                "convert_to('\"plugin\":\"tool-schedule\"', 'UTF8') in line) > 0"
            ).fetchone()
        return int(row[0]) if row else 0
    assert isinstance(store, JsonlStore), kind
    return sum(b'"plugin":"tool-schedule"' in store.path(name).read_bytes()[-4096:]
               for name in names)


def _profile(directory: Path | None, kind: str, pids: Mapping[str, int], seconds: float
             ) -> list[subprocess.Popen[bytes]]:
    """With ``--profile DIR``: sample the first worker and the host through the burst with
    ``py-spy record`` (installed by hand: it is no dependency), as collapsed stacks."""
    if directory is None:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(
        ["py-spy", "record", "--format", "raw", "--rate", "50", "--duration",
         str(int(seconds)), "--pid", str(pids[role]),
         "--output", str(directory / f"{kind}-{role}.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for role in ("worker-1", "host")]


def measure(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"store-burst-{kind}-"))
    redis_server = RedisServer(work / "redis").start()
    pg = PrivateServer().start() if kind == "postgres" else None
    tag = f"store-burst-{kind}"
    rt = RedisRuntime(redis_server.url(), work / "sessions", prefix=f"{tag}:", queue=tag,
                      workers=args.workers, logs=work / "logs", tags=(tag,), owns_db=True,
                      store=pg.url if pg is not None else None)
    store = open_store(rt.settings.store_name)
    result: dict[str, Any] = {"store": kind, "agents": args.agents, "workers": args.workers}
    measured = False
    try:
        names = [f"a{n:06d}" for n in range(args.agents)]
        started = time.perf_counter()
        for name in names:
            store.create(SessionHeader(id=name, createdAt=int(time.time() * 1000)))
        result["sessions_s"] = round(time.perf_counter() - started, 1)
        rt.start_workers()
        rt.start_mover()
        rt.start_host(names)
        live = Keys(rt.settings.prefix).agent_host()
        if not rt.wait(lambda: int(rt.client.hlen(live)) >= args.agents, 300.0):
            raise SystemExit(f"{kind}: agents not leased; see {work / 'logs'}")
        time.sleep(5)  # the host's start-up settles
        if args.idle:
            result["idle"] = _idle(rt, pg, args)
        coord = Coordination(rt.client, rt.settings)
        at_ms = coord.clock() + int(1000 * (LEAD_S + args.agents / CREATES_PER_S))
        at_ms -= at_ms % 1000
        tools = ScheduleTools(store, coord, rt.settings, lambda: at_ms - 600_000)

        def create(name: str) -> bool:
            return not tools.call(name, "schedule_create",
                                  {"prompt": "burst", "after_seconds": 600}).is_error

        started = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            created = sum(pool.map(create, names))
        tools.close()
        result["creates_s"] = round(time.perf_counter() - started, 1)
        result["created"] = created
        result["slack_s"] = round((at_ms - coord.clock()) / 1000, 1)
        profilers = _profile(args.profile, kind, rt.pids(),
                             (at_ms - coord.clock()) / 1000 + 60)
        time.sleep(max(0.0, (at_ms - coord.clock()) / 1000))
        # Wait cheaply (the logs are read once, at the end: their times say the lateness).
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline and _delivered(kind, store, pg, names) < created:
            time.sleep(3.0)
        marks = {name: found for name in names
                 if (found := _marks(store, name, at_ms))[1] is not None}
        result["delivered"] = len(marks)
        result["dispatch"] = _percentiles([d for d, _ in marks.values() if d is not None])
        result["message"] = _percentiles([m for _, m in marks.values() if m is not None])
        result["dead"] = rt.exited()
        for profiler in profilers:
            profiler.wait()
        measured = True
        return result
    finally:
        rt.close()
        close_store(store)
        redis_server.close()
        if pg is not None:
            pg.close()
        if measured:  # else the processes' logs stay for the error to point at
            shutil.rmtree(work, ignore_errors=True)


def _idle(rt: RedisRuntime, pg: PrivateServer | None, args: argparse.Namespace
          ) -> dict[str, Any]:
    """For ``--idle`` seconds with nothing due: the statements the processes sent the
    database, the commands Redis ran and each process's CPU (the load test's window)."""
    if pg is not None:
        _log_statements(pg, True)
        _, offset = _statements_since(pg, 0)
    window = cpu_window(rt, args.idle, args.agents)
    statements = None
    if pg is not None:
        statements, _ = _statements_since(pg, offset)
        _log_statements(pg, False)
    return {
        "seconds": window.seconds,
        "db_statements_per_s": None if statements is None
        else round(statements / window.seconds, 2),
        "redis_commands_per_s": window.commands_per_s,
        "cpu_cores": {role: None if cores is None else round(cores, 4)
                      for role, cores in window.processes.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--stores", default="jsonl,postgres")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8, help="create threads")
    parser.add_argument("--idle", type=float, default=0.0, help="idle seconds to measure")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="sample the first worker and the host with py-spy into DIR")
    parser.add_argument("--wait", type=float, default=600.0,
                        help="how long to wait for every delivery")
    args = parser.parse_args()
    for kind in args.stores.split(","):
        print(json.dumps(measure(kind, args)), flush=True)


if __name__ == "__main__":
    main()
