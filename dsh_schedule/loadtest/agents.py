"""The load test's plan, its agents on reference hosts in this process, and timed calls.

A phase opens its own agents (``open_agents``), spread over ``--hosts`` reference hosts
sharing one store and one Redis coordination, times calls on threads (``timed_calls``),
and disposes of its agents.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
import redis
from rq import Queue

from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.plugin import ToolHandler
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.loadtest.runtime import Runtime, queue_idle
from dsh_schedule.loadtest.sessions import write_session
from dsh_schedule.loadtest.stats import (
    Progress,
    Stopwatch,
)
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import (
    READ_COUNT,
    FollowupEntry,
    Followups,
    Pair,
    StreamRead,
)
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.settings import Settings

FAR_S: Final = 30 * 86_400
OpResult = tuple[list[float], float, int]


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes of one load-test run (bounded by ``loadtest.add_arguments``)."""

    tag: str
    hosts: int
    workers: int
    threads: int
    create_agents: int
    creates: int
    session_sizes: tuple[int, ...]
    session_calls: int
    due_agents: int
    late_agents: int
    late_reminders: int
    window_s: int
    lead_s: int
    rebuild_agents: int
    rebuild_records: int
    rebuild_db: int
    max_seconds: float
    idle_agents: int
    idle_window_s: int
    idle_warmup_s: int
    burst_agents: int
    memory_sessions: int
    memory_events: int
    unloaded_sessions: int = 0  # the unloaded phase (loadtest/unloaded.py)
    unloaded_burst: int = 0


class RecordingFollowups(Followups):
    """The host's followup reader, noting when each reminder's entry was written: the
    millisecond part of its stream id, which Redis assigns from its own clock."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        super().__init__(client, keys)
        self.written_ms: dict[tuple[str, Pair], int] = {}
        self._lock = threading.Lock()

    def read_streams(self, agents: Sequence[str], consumer: str, *,
                  count: int = READ_COUNT) -> dict[str, StreamRead]:
        found = super().read_streams(agents, consumer, count=count)
        for agent, read in found.items():
            self._note(agent, read.entries)
        return found

    def claim_stale(self, agent: str, consumer: str, *, min_idle_ms: int) -> list[FollowupEntry]:
        return self._note(agent, super().claim_stale(agent, consumer, min_idle_ms=min_idle_ms))

    def _note(self, agent: str, entries: list[FollowupEntry]) -> list[FollowupEntry]:
        with self._lock:
            for entry in entries:
                ms = int(entry.entry_id.split("-", 1)[0])
                for pair in entry.pairs:
                    self.written_ms.setdefault((agent, pair), ms)
        return entries


class Hosts:
    """Reference hosts in this process, sharing one store and one Redis coordination, with
    the agents spread over them; each agent is a root agent of exactly one host."""

    def __init__(self, hosts: Sequence[ReferenceHost], coordination: Coordination) -> None:
        self.hosts = tuple(hosts)
        self.coordination = coordination
        self._host_of: dict[str, ReferenceHost] = {}

    def open(self, names: Sequence[str]) -> None:
        for i, name in enumerate(names):
            host = self.hosts[i % len(self.hosts)]
            host.open_root(name)
            self._host_of[name] = host

    def tool(self, name: str, tool: str = "schedule_create") -> ToolHandler:
        return self._host_of[name].agents[name].tools[tool][1]

    def renew_leases(self) -> None:
        for host in self.hosts:
            host.plugin.renew_leases()

    def close(self) -> None:
        for host in self.hosts:
            host.close()


def open_agents(rt: Runtime, plan: Plan, names: Sequence[str], *, recording: bool = False,
                on_delivery: Callable[[str, Delivery], None] | None = None,
                settings: Settings | None = None) -> Hosts:
    """New sessions, opened as root agents of ``plan.hosts`` new hosts (each install leases
    the agent and enqueues its first wake); waits until those wakes ran."""
    now = wall_clock_ms()
    for name in names:
        write_session(rt.store, name, [], created_at_ms=now, durable=False)
    os.sync()
    settings = rt.settings if settings is None else settings
    coordination = Coordination(rt.client, settings)
    if recording:
        coordination.followups = RecordingFollowups(rt.client, coordination.keys)
    hosts = Hosts([ReferenceHost(rt.store, coordination, settings, on_delivery=on_delivery)
                   for _ in range(plan.hosts)], coordination)
    hosts.open(names)
    rt.run_until(lambda: queue_is_idle(rt, settings.queue), 120.0)
    return hosts


def timed_calls(op: Callable[[int], bool], count: int, threads: int,
                progress: Progress | None = None) -> OpResult:
    """Run ``op(0..count-1)`` on ``threads`` threads (thread t takes i = t mod threads);
    returns the latencies in ms, the wall seconds and the number of failed calls."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    failures = [0] * threads

    def work(t: int) -> None:
        for i in range(t, count, threads):
            start = time.perf_counter()
            ok = op(i)
            lat[t].append((time.perf_counter() - start) * 1000)
            failures[t] += not ok
            if t == 0 and progress is not None:
                progress.tick(f"{i + 1}/{count}")

    watch = Stopwatch()
    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return [x for part in lat for x in part], watch.seconds(), sum(failures)



def create_args(i: int, seconds: int) -> dict[str, Any]:
    return {"prompt": f"load reminder {i}", "after_seconds": seconds}



def queue_is_idle(rt: Runtime, queue: str) -> bool:
    return queue_idle(rt.client, Queue(queue, connection=rt.client))

