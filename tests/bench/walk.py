"""The walk of one tool call and one due wake through the package's files, traced at run
time (issue 36: "a tool call and a due wake each enter at most 10 project files, no file
re-entered more than twice on the way down").

Not a test: a measurement to run by hand::

    .venv/bin/python -m tests.bench.walk

It runs a ``schedule_create`` and a due wake on a JSONL store in a temporary directory with
an in-process Redis (fakeredis), each once to warm up and once traced (``sys.setprofile``).
A file is *entered* when a function of it is called from another file; the walk is the
files in the order they were first entered. It prints, for each of the two, the number of
files entered (all, and those outside ``shared/core`` and ``shared/store``), each
file's entries, the walk, and the files re-entered on the way down: entered while they
stood already lower on the stack (a file entered, left for another and entered again from
there), with the most times each was.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import fakeredis

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore
from dsh_schedule.worker.due import DueOwner

PACKAGE = Path(__file__).resolve().parents[2] / "dsh_schedule"
# The pure domain and the stores behind their port: counted apart as well, since a reader
# follows the transaction into them only through ``fold`` and ``SessionStore``.
BEHIND = ("shared/core/", "shared/store/")


def _project_file(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    name = Path(frame.f_code.co_filename).resolve()
    return name.relative_to(PACKAGE).as_posix() if name.is_relative_to(PACKAGE) else None


def _descent(frame: FrameType | None) -> list[str]:
    """The project files on the stack from ``frame`` down to the first call, a run of
    frames in one file counted once (libraries between them skipped)."""
    files: list[str] = []
    while frame is not None:
        here = _project_file(frame)
        if here is not None and (not files or files[-1] != here):
            files.append(here)
        frame = frame.f_back
    return files


def traced(work: Callable[[], Any]) -> tuple[list[str], Counter[str], Counter[str]]:
    """The files ``work`` enters, in the order first entered; each file's entries; and
    each file's most re-entries on the way down (the times it stood already on the stack
    below when it was entered: a call back up into it, the decider pattern's one)."""
    entries: Counter[str] = Counter()
    reentries: Counter[str] = Counter()
    order: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        here = _project_file(frame)
        if here is None:
            return
        below = _descent(frame.f_back)
        if below and below[0] == here:
            return
        entries[here] += 1
        reentries[here] = max(reentries[here], below.count(here))
        if here not in order:
            order.append(here)

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return order, entries, reentries


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_796_126_400_000  # 2026-12-01T12:00:00Z

    def __call__(self) -> int:
        return self.now_ms


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        settings = Settings(sessions=Path(root))
        store = JsonlStore(Path(root))
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        clock = Clock()
        coordination = Coordination(client, settings)
        tools = ScheduleTools(store, coordination, settings, clock)
        owner = DueOwner(store, coordination, settings, clock=clock)
        agents = ["warm", "walked"]
        for agent in agents:
            store.create(SessionHeader(id=agent, createdAt=clock()))
        coordination.leases.install("host", agents, settings.queue, now_ms=clock(),
                                    ttl_s=86_400)
        args = {"prompt": "stretch", "after_seconds": 60}
        tools.call("warm", "schedule_create", args)
        walks = {"tool call": traced(lambda: tools.call("walked", "schedule_create", args))}
        clock.now_ms += 61_000
        owner.wake([("warm", clock())])
        walks["due wake"] = traced(lambda: owner.wake([("walked", clock())]))
    for name, (order, entries, reentries) in walks.items():
        outside = [f for f in order if not f.startswith(BEHIND)]
        print(json.dumps({"walk": name, "files": len(order),
                          "files outside core and store": len(outside),
                          "most entries": max(entries.values()),
                          "most re-entries on the way down": max(reentries.values()),
                          "entries": {f: entries[f] for f in order},
                          "re-entered on the way down": {f: reentries[f] for f in order
                                                         if reentries[f]}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
