"""Where a ``schedule_create`` through the tool handler spends its time, and how many round
trips to PostgreSQL it makes (docs/benchmarks.md#the-postgresql-store-issue-38).

Not a test (nothing here asserts a timing): a measurement to run by hand::

    .venv/bin/python -m tests.bench.create_round_trips --store postgres --creates 1000

It starts a redis-server of its own (and, for ``postgres``, uses a database it creates
and drops, tests/postgres_server.py), creates the sessions through the store, then calls
``schedule_create`` once on each, twice over. It prints one JSON line: p50 and p99 of the
whole call, of the store's ``flush``, ``load`` and append (with its barrier) and of the
re-arm, the call's CPU, and, for PostgreSQL, the round trips of a first and of a second
create on a session (libpq's trace: one per ``Sync`` or simple ``Query`` message, the
client waiting for the server's answer to each).

``--appends N`` instead times the PostgreSQL store's write alone, N times each way,
alternated in one process: ``append_durably`` (one synchronously committed statement)
against ``append`` then ``flush`` (an asynchronous commit, then the barrier's transaction).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.naming import store_from_settings
from dsh_schedule.shared.store.port import SessionStore
from tests.redis_server import RedisServer


class Trace:
    """libpq's trace of every pooled connection, into one file, with marks between."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="create-trace-")) / "trace.log"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def configure(self, original: Callable[[Any], None], conn: Any) -> None:
        from psycopg import pq

        original(conn)
        conn.pgconn.trace(self.fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def mark(self, label: str) -> None:
        os.write(self.fd, f"=== {label}\n".encode())

    def round_trips(self) -> dict[str, float]:
        """The round trips between marks, averaged by mark label."""
        counts: dict[str, list[int]] = defaultdict(list)
        label = None
        for line in self.path.read_text(errors="replace").splitlines():
            if line.startswith("=== "):
                label = line[4:]
                counts[label].append(0)
            elif label and line.startswith("F\t") and line.split("\t")[2] in ("Sync", "Query"):
                counts[label][-1] += 1
        return {k: round(sum(v) / len(v), 2) for k, v in counts.items() if k != "end"}


def _store(kind: str, settings: Settings, trace: Trace | None) -> SessionStore:
    if kind == "jsonl":
        return store_from_settings(settings)
    from dsh_schedule.shared.store import postgres_reading
    from dsh_schedule.shared.store.postgres import PostgresStore
    from tests.postgres_server import empty_database, test_database_url

    url = test_database_url()
    if url is None:
        raise SystemExit("no PostgreSQL to measure on (tests/postgres_server.py)")
    empty_database(url)
    if trace is not None:
        postgres_reading.configure_connection = functools.partial(  # type: ignore[assignment]
            trace.configure, postgres_reading.configure_connection)
    return PostgresStore(url)


def _timed(times: dict[str, float], obj: object, name: str, label: str) -> None:
    original = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            times[label] = times.get(label, 0.0) + (time.perf_counter() - started) * 1000

    setattr(obj, name, timed)


def measure(kind: str, creates: int, *, trace: bool) -> dict[str, Any]:
    tracing = Trace() if trace and kind == "postgres" else None
    with RedisServer() as server:
        settings = Settings(redis_url=server.url(), sessions=Path(tempfile.mkdtemp()),
                            prefix="rt:", queue="rt")
        store = _store(kind, settings, tracing)
        names = [f"rt-{i:05d}" for i in range(creates)]
        for name in names:
            store.create(SessionHeader(id=name, createdAt=wall_clock_ms()))
        coordination = Coordination(server.client(), settings)
        tools = ScheduleTools(store, coordination, settings, wall_clock_ms)
        times: dict[str, float] = {}
        for name, label in (("flush", "flush"), ("load", "load"), ("append", "append"),
                            ("append_durably", "append")):
            if hasattr(store, name):
                _timed(times, store, name, label)
        _timed(times, coordination, "rearm", "rearm")
        due = format_instant((wall_clock_ms() // 1000 + 3600) * 1000)
        found: dict[str, list[float]] = defaultdict(list)
        for round_ in ("first", "second"):
            for name in names:
                if tracing is not None:
                    tracing.mark(round_)
                times.clear()
                started, cpu = time.perf_counter(), time.process_time()
                result = tools.call(name, "schedule_create", {"prompt": "x", "at": due})
                times["call"] = (time.perf_counter() - started) * 1000
                times["cpu"] = (time.process_time() - cpu) * 1000
                if result.is_error:
                    raise SystemExit(f"create: {result.content}")
                for label, ms in times.items():
                    found[label].append(ms)
        if tracing is not None:
            tracing.mark("end")
        close = getattr(store, "close", None)
        if close is not None:
            close()
    out: dict[str, Any] = {"store": kind, "creates": 2 * creates}
    for label, values in found.items():
        values.sort()
        out[f"{label}_p50_p99_ms"] = [round(values[len(values) // 2], 2),
                                      round(values[len(values) * 99 // 100], 2)]
    if tracing is not None:
        out["round_trips_per_create"] = tracing.round_trips()
    return out


def appends(count: int) -> dict[str, Any]:
    from dsh_schedule.shared.core.events import NewEvent
    from dsh_schedule.shared.store.postgres import PostgresStore
    from tests.postgres_server import empty_database, test_database_url

    url = test_database_url()
    if url is None:
        raise SystemExit("no PostgreSQL to measure on (tests/postgres_server.py)")
    empty_database(url)
    event = NewEvent(type="message", time=1, data={
        "role": "user", "content": [{"type": "text", "text": "x" * 300}]})
    found: dict[str, list[float]] = {"append_durably": [], "append_then_flush": []}
    with PostgresStore(url) as store:
        for session in found:
            store.create(SessionHeader(id=session, createdAt=1))
        for n in range(count):
            order = list(found) if n % 2 else list(reversed(found))
            for session in order:
                started = time.perf_counter()
                if session == "append_durably":
                    failure = store.append_durably(session, [event], n)[1]
                    if failure is not None:
                        raise failure
                else:
                    store.append(session, [event], n)
                    store.flush(session)
                found[session].append((time.perf_counter() - started) * 1000)
    out: dict[str, Any] = {"appends": count}
    for label, values in found.items():
        values.sort()
        out[f"{label}_p50_p99_p999_ms"] = [
            round(values[len(values) * q // 1000], 2) for q in (500, 990, 999)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("jsonl", "postgres"), default="postgres")
    parser.add_argument("--creates", type=int, default=1000)
    parser.add_argument("--no-trace", action="store_true",
                        help="time only (the trace costs a little CPU)")
    parser.add_argument("--appends", type=int, help="time the PostgreSQL write alone")
    args = parser.parse_args()
    if args.appends:
        print(json.dumps(appends(args.appends)), flush=True)
        return
    print(json.dumps(measure(args.store, args.creates, trace=not args.no_trace)), flush=True)


if __name__ == "__main__":
    main()
