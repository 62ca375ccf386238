"""A process that appends to one JSONL session as fast as it can, retrying on conflicts.

Usage: python _append_worker.py ROOT SESSION TAG COUNT GO_FILE

It announces itself with ``GO_FILE.ready.TAG``, waits for ``GO_FILE`` so that all
workers start together, then appends COUNT events, each after re-reading the length.
Every tenth event is a ``schedule/change`` create, so the invariant runs under contention.
Prints the number of fence conflicts it met.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dsh_schedule.shared.core.errors import FenceConflict
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, NewEvent
from dsh_schedule.shared.store.jsonl import JsonlStore

WAIT_LIMIT_S = 60.0


def event(tag: int, i: int) -> NewEvent:
    if i % 10 == 0:
        schedule = {
            "id": f"schedule-w{tag}-{i}",
            "kind": "at",
            "prompt": "call back",
            "scheduledAt": "2026-12-01T16:00:00.000Z",
        }
        data = {"version": 1, "operation": "create", "schedule": schedule}
        return NewEvent(type=SCHEDULE_CHANGE, time=i, data=data)
    return NewEvent(type="test/append", time=i, data={"worker": tag, "i": i})


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path.name} never appeared")
        time.sleep(0.001)


def main(argv: list[str]) -> int:
    root, session_id, tag_text, count_text, go_text = argv
    tag, count, go = int(tag_text), int(count_text), Path(go_text)
    store = JsonlStore(Path(root))
    Path(f"{go}.ready.{tag}").touch()
    wait_for(go)
    conflicts = 0
    for i in range(count):
        while True:
            session, _ = store.load(session_id)
            try:
                store.append(session_id, [event(tag, i)], len(session.events))
                break
            except FenceConflict:
                conflicts += 1
    print(conflicts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
