"""What the JSONL store's index of next due moments costs (docs/benchmarks.md).

Not a test (nothing here asserts a timing): a measurement to run by hand::

    .venv/bin/python -m tests.bench.due_index --sessions 10000

It writes ``--sessions`` session logs (a header and one ``at`` reminder a day ahead each,
the bytes the store writes) into a fresh directory, then pages through ``due_index``
(``--page`` entries a page) with a fresh store each time: with no index at all (the scan
that rebuilds it), with the index current, and after ``--grown`` of the logs grew by a
message since their entry. For each it prints the wall and CPU seconds, the logs opened
and the entries answered. Then the CPU cost of one append of a reminder with and without
its index entry, and of rewriting one index file of every session instead (the
alternative layout), in microseconds. One JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, NewEvent, SessionHeader
from dsh_schedule.shared.store.codec import encode_event, encode_header, number_events
from dsh_schedule.shared.store.dueindex import Recorded, encode_recorded
from dsh_schedule.shared.store.jsonl import JsonlStore

T0 = 1_764_579_600_000
WHEN = "2025-12-02T09:00:00.000Z"


class CountingStore(JsonlStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root, syncfs=False)
        self.log_opens = 0

    def _open_locked(self, session_id: str, flags: int, operation: int) -> tuple[int, Any]:
        self.log_opens += 1
        return super()._open_locked(session_id, flags, operation)


class UnindexedStore(JsonlStore):
    def _index_due(self, session_id: str, entry: Any, stamp: tuple[int, ...]) -> Any:
        return None


def reminder(n: int) -> NewEvent:
    schedule = {"id": f"r{n}", "kind": "at", "prompt": "call back", "scheduledAt": WHEN}
    return NewEvent(type=SCHEDULE_CHANGE, time=T0,
                    data={"version": 1, "operation": "create", "schedule": schedule})


def message() -> NewEvent:
    data = {"content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}
    return NewEvent(type=USER_MESSAGE, time=T0, data=data)


def write_logs(root: Path, count: int) -> list[str]:
    root.mkdir(parents=True)
    ids = [f"session-{i:07d}" for i in range(count)]
    for session_id in ids:
        head = encode_header(SessionHeader(id=session_id, createdAt=T0, timeZone="UTC"))
        line = encode_event(number_events([reminder(0)], 0)[0])
        (root / f"{session_id}.jsonl").write_bytes(head + line)
    return ids


def scan(root: Path, page: int, phase: str) -> None:
    store = CountingStore(root)
    started, cpu = time.perf_counter(), time.process_time()
    entries, after = 0, None
    while True:
        got = store.due_index(after=after, limit=page)
        entries += len(got)
        if len(got) < page:
            break
        after = got[-1].session_id
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"phase": phase, "sessions_answered": entries, "seconds": round(seconds, 3),
                      "cpu_seconds": round(cpu, 3), "log_opens": store.log_opens}))


def appends(root: Path, count: int) -> None:
    for name, store in [("append_with_index_us", JsonlStore(root / "a", syncfs=False)),
                        ("append_without_index_us", UnindexedStore(root / "b", syncfs=False))]:
        for i in range(count):
            store.create(SessionHeader(id=f"s{i}", createdAt=T0, timeZone="UTC"))
        started = time.process_time()
        for i in range(count):
            store.append(f"s{i}", [reminder(1)], 0)
        print(json.dumps({name: round((time.process_time() - started) / count * 1e6, 1)}))


def one_file_rewrite(root: Path, sessions: int, rewrites: int) -> None:
    entry = encode_recorded(Recorded(1_764_666_000_000, 1, (2049, 123456, 420, 1, 1))).rstrip()
    body = b"".join(b'"session-%07d":' % i + entry + b",\n" for i in range(sessions))
    started = time.process_time()
    for _ in range(rewrites):
        staging = root / "index.tmp"
        staging.write_bytes(body)
        os.replace(staging, root / "index")
    print(json.dumps({"one_index_file_rewrite_us": round(
        (time.process_time() - started) / rewrites * 1e6, 1), "index_file_bytes": len(body)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--grown", type=float, default=0.01)
    parser.add_argument("--appends", type=int, default=2000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="due-index-"))
    try:
        root = work / "sessions"
        started = time.perf_counter()
        ids = write_logs(root, args.sessions)
        print(json.dumps({"sessions": args.sessions, "page": args.page,
                          "write_logs_seconds": round(time.perf_counter() - started, 3)}))
        scan(root, args.page, "no_index")
        scan(root, args.page, "index_current")
        grown = ids[:: max(1, round(1 / args.grown))] if args.grown > 0 else []
        writer = JsonlStore(root, syncfs=False)
        for session_id in grown:
            with open(writer.path(session_id), "ab") as file:  # another writer, no index
                file.write(encode_event(number_events([message()], 1)[0]))
        scan(root, args.page, f"index_current_but_{len(grown)}_grown")
        scan(root, args.page, "index_current_again")
        appends(work / "appends", args.appends)
        one_file_rewrite(work, args.sessions, 50)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
