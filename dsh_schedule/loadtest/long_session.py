"""Management-call cost against session log length (issue 3's benchmark).

For each length a session is pre-filled with that many events of ordinary agent work and a
few hundred ``schedule/change``s, then ``schedule_create`` runs on it, one call after the
other, with the JSONL store and the runtime's Redis. The first call on a session reads the
whole file (the store's cache is cold) and is reported on its own; the rest is what a live
host pays. The bare counterpart is one fsynced line append to a file of the same size.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.loadtest import baseline as bare
from dsh_schedule.loadtest.agents import FAR_S, Plan, create_args, timed_calls
from dsh_schedule.loadtest.figures import LongSessionFigure, SessionSize
from dsh_schedule.loadtest.runtime import Runtime
from dsh_schedule.loadtest.sessions import DAY_MS, conversation, write_session
from dsh_schedule.loadtest.stats import Latency, Progress, cost_ratio, latency, per_second
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import Event
from dsh_schedule.shared.store.codec import encode_event


def measure_long_session(rt: Runtime, plan: Plan, progress: Progress) -> LongSessionFigure:
    progress.phase("long session", f"{plan.session_calls} creates on sessions of "
                   + ", ".join(f"{n:,}" for n in plan.session_sizes) + " events")
    coord = Coordination(rt.client, rt.settings)
    tools = ScheduleTools(rt.store, coord, rt.settings, wall_clock_ms)
    sizes: list[SessionSize] = []
    errors = 0
    for length in plan.session_sizes:
        size, failed = _measure_size(rt, coord, tools, plan, length)
        sizes.append(size)
        errors += failed
        progress.note(f"{length:,} events: {size.per_s}/s, p50 {size.latency.p50_ms} ms, "
                      f"first call {size.first_call_ms} ms")
    fresh, longest = _ends(sizes)
    return LongSessionFigure(
        calls=plan.session_calls, errors=errors, sizes=sizes,
        ratio=cost_ratio(longest.latency.mean_ms, fresh.latency.mean_ms),
        ratio_p50=cost_ratio(longest.latency.p50_ms, fresh.latency.p50_ms),
        ratio_p99=cost_ratio(longest.latency.p99_ms, fresh.latency.p99_ms),
        bare_ratio=cost_ratio(longest.bare_latency.mean_ms, fresh.bare_latency.mean_ms),
    )


def _ends(sizes: Sequence[SessionSize]) -> tuple[SessionSize, SessionSize]:
    ordered = sorted(sizes, key=lambda s: s.events)
    return ordered[0], ordered[-1]


def _measure_size(rt: Runtime, coord: Coordination, tools: ScheduleTools, plan: Plan,
                  length: int) -> tuple[SessionSize, int]:
    agent = f"{plan.tag}-s{length}"
    start_ms = wall_clock_ms() - length * 1000 - DAY_MS
    events = conversation(length, start_ms=start_ms)
    write_session(rt.store, agent, events, created_at_ms=start_ms)
    file_bytes = rt.store.path(agent).stat().st_size
    coord.leases.grant(agent, rt.settings.queue, now_ms=wall_clock_ms(),
                       ttl_s=rt.settings.lease_ttl_s)
    started = time.perf_counter()
    first = tools.call(agent, "schedule_create", create_args(0, FAR_S))
    first_ms = (time.perf_counter() - started) * 1000

    def create(i: int) -> bool:
        return not tools.call(agent, "schedule_create", create_args(i, FAR_S + i)).is_error

    ours, seconds, failed = timed_calls(create, plan.session_calls, 1)
    coord.wakes.cancel([agent])
    coord.leases.drop([agent])
    bare_lat, bare_seconds = _bare_appends(rt.store.root / f"{agent}.bare", events,
                                           plan.session_calls)
    return SessionSize(
        events=length, file_bytes=file_bytes,
        first_call_ms=None if first.is_error else round(first_ms, 3),
        per_s=per_second(plan.session_calls - failed, seconds), latency=latency(ours),
        bare_per_s=per_second(plan.session_calls, bare_seconds), bare_latency=bare_lat,
    ), failed + first.is_error


def _bare_appends(path: Path, events: Sequence[Event], calls: int) -> tuple[Latency, float]:
    with path.open("wb") as file:
        file.write(b"".join(encode_event(e) for e in events))
    line = b'{"type":"bare","seq":0,"time":0,"data":{"operation":"create"}}\n'

    def append(i: int) -> bool:
        bare.fsynced_append(path, line)
        return True

    lat, seconds, _ = timed_calls(append, calls, 1)
    return latency(lat), seconds
