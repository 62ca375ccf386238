"""The load test's result: the figures (``figures``), the targets they are judged
against, and the summary table printed at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from dsh_schedule.loadtest.figures import (
    CpuWindow,
    Figures,
    PeersFigure,
)
from dsh_schedule.loadtest.stats import Latency, Machine, rate_ratio


class Target(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    target: str
    measured: float | None
    met: bool | None


class Result(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    mode: str
    started_at: str
    seconds: float
    command: list[str]
    machine: Machine
    plan: dict[str, Any]
    figures: Figures
    targets: list[Target]
    notes: list[str]


def _at_most(limit: float) -> Callable[[float], bool]:
    return lambda v: v <= limit


def _at_least(limit: float) -> Callable[[float], bool]:
    return lambda v: v >= limit


REBUILD_AGENTS, REBUILD_RECORDS = 10_000, 10
IDLE_AGENTS = 20_000
BURST_AGENTS = 10_000
LATE_REMINDERS = 400
MEMORY_SESSIONS, MEMORY_EVENTS = 1_000, 10_000
MIB = 2**20


def _at_scale(ok: Callable[[float], bool], at_scale: bool) -> Callable[[float], bool | None]:
    return ok if at_scale else _unjudged


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def targets(f: Figures, *, real_redis: bool) -> list[Target]:
    """The figures the issue asks for, each against its target (measured, never asserted).

    The targets are for a run with real Redis, each at its own scale at least (the
    rebuild's 10 000 agents x 10 reminders, the idle figure's 20 000 agents, the burst's
    10 000, the steady lateness's 400 reminders, the memory figure's 1 000 sessions x
    10 000 events): anywhere else ``met`` is None, neither met nor missed.
    """
    c, late, r, d, m, s = f.create, f.lateness, f.rebuild, f.due, f.memory, f.long_session
    idle, burst, pm = f.idle, f.burst, f.process_memory
    memory_scale = (pm is not None and pm.sessions >= MEMORY_SESSIONS
                    and pm.events_per_session >= MEMORY_EVENTS and pm.served == pm.sessions)
    rows: list[tuple[str, str, float | None, Callable[[float], bool | None]]] = [
        ("creates/s per host process", ">= 500", c.per_s if c else None, _at_least(500)),
        ("create cost vs bare", "<= 3x", c.ratio_per_s if c else None, _at_most(3)),
        ("cron creates vs every_seconds creates", "<= 1.1x",
         c.cron_vs_every if c else None, _at_most(1.1)),
        ("lifecycle on: creates/s vs off", ">= 0.9x",
         c.lifecycle_create_vs_off if c else None, _at_least(0.9)),
        ("lifecycle on: updates/s vs creates/s off", ">= 0.9x",
         c.lifecycle_update_vs_off if c else None, _at_least(0.9)),
        ("lateness due->followup p99 ms", "<= 500",
         late.followup.p99_ms if late else None, _at_most(500)),
        ("rebuild seconds (10 000 agents x 10)", "<= 5", r.seconds if r else None,
         _at_most(5) if r and r.agents >= REBUILD_AGENTS
         and r.records_per_agent >= REBUILD_RECORDS else _unjudged),
        ("due transactions/s per worker", ">= 300", d.per_worker_per_s if d else None,
         _at_least(300)),
        ("Redis bytes per live agent", "<= 2048", m.bytes_per_agent if m else None,
         _at_most(2048)),
        ("longest session cost vs fresh", "<= 1.5x", s.ratio if s else None, _at_most(1.5)),
        ("lateness due->session p99 ms (400 reminders)", "<= 100",
         late.session.p99_ms if late else None,
         _at_scale(_at_most(100), late is not None and late.reminders >= LATE_REMINDERS)),
        ("idle cores per 1 000 agents, all processes (20 000 agents)", "<= 0.002",
         idle.ours.cores_per_1000_agents if idle else None,
         _at_scale(_at_most(0.002), idle is not None and idle.agents >= IDLE_AGENTS)),
        ("burst due->followup p99 ms (10 000 agents)", "<= 1000",
         burst.followup.p99_ms if burst else None,
         _at_scale(_at_most(1000), burst is not None and burst.agents >= BURST_AGENTS)),
        ("burst due->session p99 ms (10 000 agents)", "<= 5000",
         burst.session.p99_ms if burst else None,
         _at_scale(_at_most(5000), burst is not None and burst.agents >= BURST_AGENTS)),
        ("worker RSS MiB after 1 000 x 10 000", "<= 300",
         _mib(pm.worker_rss_bytes) if pm else None, _at_scale(_at_most(300), memory_scale)),
        ("host RSS MiB after 1 000 x 10 000", "<= 300",
         _mib(pm.host_rss_bytes) if pm else None, _at_scale(_at_most(300), memory_scale)),
    ]
    return [
        Target(name=name, target=goal, measured=value,
               met=None if value is None or not real_redis else ok(value))
        for name, goal, value, ok in rows
    ]


def _unjudged(value: float) -> bool | None:
    return None


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif 0 < abs(value) < 0.1:
        text = f"{value:.2g}"  # two significant digits: 0.0021, not 0.00
    else:
        text = f"{value:,.2f}"
    return text + unit


def _cores(window: CpuWindow) -> str:
    parts: dict[str, float] = {}
    for name, cores in window.processes.items():
        role = "workers" if name.startswith("worker-") else name
        parts[role] = parts.get(role, 0.0) + (cores or 0.0)
    return ", ".join(f"{role} {_fmt(c)}" for role, c in parts.items())


def _cpu(seconds: dict[str, float | None]) -> str:
    parts: dict[str, float] = {}
    for name, spent in seconds.items():
        role = "workers" if name.startswith("worker-") else name
        parts[role] = parts.get(role, 0.0) + (spent or 0.0)
    return ", ".join(f"{role} {_fmt(round(c, 2))}" for role, c in parts.items())


def _busiest(window: CpuWindow, count: int = 4) -> str:
    top = list(window.commands_by_type.items())[:count]
    return ", ".join(f"{name} {_fmt(rate)}" for name, rate in top) or "-"


def _rss(rss: int | None, peak: int | None) -> str:
    return f"{_fmt(_mib(rss))} MiB (peak {_fmt(_mib(peak))})"


def _lat(lat: Latency) -> str:
    return f"p50 {_fmt(lat.p50_ms)} / p99 {_fmt(lat.p99_ms)} / max {_fmt(lat.max_ms)} ms"


def _peer_workers(p: PeersFigure) -> int:
    return (p.burst or p.idle)[0].workers if (p.burst or p.idle) else 0


def summary_rows(f: Figures) -> list[tuple[str, str, str, str]]:
    """(figure, ours, bare libraries, cost ratio) rows of the summary table."""
    rows: list[tuple[str, str, str, str]] = []
    if (c := f.create) is not None:
        rows.append(("creates/s", _fmt(c.per_s), _fmt(c.bare_per_s), _fmt(c.ratio_per_s, "x")))
        rows.append(("create latency", _lat(c.latency), _lat(c.bare_latency),
                     _fmt(c.ratio_p99, "x p99")))
        if c.cron_per_s is not None or c.every_per_s is not None:
            rows.append(("creates/s cron | every_seconds",
                         f"{_fmt(c.cron_per_s)} | {_fmt(c.every_per_s)}", "",
                         _fmt(c.cron_vs_every, "x")))
        if c.lifecycle_off_per_s is not None:
            rows.append(("lifecycle on: creates/s | updates/s (vs off)",
                         f"{_fmt(c.lifecycle_create_per_s)} | {_fmt(c.lifecycle_update_per_s)}",
                         f"off {_fmt(c.lifecycle_off_per_s)}",
                         f"{_fmt(c.lifecycle_create_vs_off, 'x')} | "
                         f"{_fmt(c.lifecycle_update_vs_off, 'x')}"))
    if (s := f.long_session) is not None:
        for size in s.sizes:
            rows.append((f"create on {size.events:,}-event session",
                         f"{_fmt(size.per_s)}/s, {_lat(size.latency)}",
                         f"{_fmt(size.bare_per_s)}/s", ""))
        rows.append(("longest vs fresh session", _fmt(s.ratio, "x"), _fmt(s.bare_ratio, "x"), ""))
    if (d := f.due) is not None:
        rows.append(("due tx/s, one worker", _fmt(d.per_worker_per_s),
                     _fmt(d.bare_per_worker_per_s), _fmt(d.ratio, "x")))
        if d.workers > 1:
            rows.append((f"due tx/s, {d.workers} workers", _fmt(d.all_workers_per_s),
                         _fmt(d.bare_all_workers_per_s),
                         _fmt(rate_ratio(d.all_workers_per_s, d.bare_all_workers_per_s), "x")))
    if (late := f.lateness) is not None:
        rows.append(("lateness due->followup", _lat(late.followup), _lat(late.bare),
                     _fmt(late.ratio_p99, "x p99")))
        rows.append(("lateness due->session", _lat(late.session), "", ""))
    if (r := f.rebuild) is not None:
        rows.append((f"rebuild {r.agents:,} x {r.records_per_agent} (s)", _fmt(r.seconds),
                     _fmt(r.bare_seconds), _fmt(r.ratio, "x")))
    if (m := f.memory) is not None:
        rows.append(("Redis bytes per live agent", _fmt(m.bytes_per_agent) if m.note is None
                     else m.note, _fmt(m.bare_bytes_per_job), _fmt(m.ratio, "x")))
    if (i := f.idle) is not None:
        rows.append((f"idle cores per 1,000 agents ({i.agents:,} agents)",
                     _fmt(i.ours.cores_per_1000_agents), _fmt(i.bare.cores_per_1000_agents),
                     _fmt(i.ratio, "x")))
        rows.append(("idle cores by process", _cores(i.ours), _cores(i.bare), ""))
        rows.append(("idle Redis commands/s", _fmt(i.ours.commands_per_s),
                     _fmt(i.bare.commands_per_s), _fmt(i.ratio_commands, "x")))
        rows.append(("idle busiest Redis commands/s", _busiest(i.ours), _busiest(i.bare), ""))
        rows.append(("idle Redis bytes per agent / job", _fmt(i.bytes_per_agent), "", ""))
        if i.bytes_by_key:
            rows.append(("idle Redis bytes per agent by key", ", ".join(
                f"{kind} {size:g}" for kind, size in i.bytes_by_key.items()), "", ""))
        rows.append(("idle time to arm every agent, s", _fmt(i.ready_seconds), "", ""))
        rows.append(("idle flush -> every wake back, s", _fmt(i.flush_recovery_seconds),
                     "", ""))
        for what, curve in (("", i.arming), (" after the flush", i.flush_arming)):
            if curve is not None:
                rows.append((f"idle arming{what}, agents/s first / last tenth",
                             f"{_fmt(curve.first_tenth_per_s)} / "
                             f"{_fmt(curve.last_tenth_per_s)}", "", ""))
        rows.append(("idle host / worker RSS, MiB",
                     f"{_fmt(i.host_rss_mib)} / {_fmt(i.worker_rss_mib)}", "", ""))
    if (b := f.burst) is not None:
        rows.append((f"burst due->followup ({b.agents:,} agents)", _lat(b.followup),
                     _lat(b.bare), _fmt(b.ratio_p99, "x p99")))
        rows.append(("burst due->session", _lat(b.session), "", ""))
        if b.cpu_s:
            rows.append(("burst CPU seconds, due->last delivery", _cpu(b.cpu_s), "", ""))
    if (p := f.process_memory) is not None:
        scale = f"{p.sessions:,} x {p.events_per_session:,}"
        rows.append((f"worker RSS after {scale}", _rss(p.worker_rss_bytes, p.worker_hwm_bytes),
                     f"{_fmt(_mib(p.bare_worker_rss_bytes))} MiB (idle rq worker)", ""))
        rows.append((f"host RSS after {scale}", _rss(p.host_rss_bytes, p.host_hwm_bytes), "",
                     ""))
    return rows


def peer_cells(f: Figures) -> dict[str, tuple[str, ...]]:
    """The peer columns (one per peer, then our ratio to the best peer) of the summary
    rows they belong to, by the row's figure name."""
    p = f.peers
    if p is None:
        return {}
    cells: dict[str, tuple[str, ...]] = {}
    if (i := f.idle) is not None and p.idle:
        cells[f"idle cores per 1,000 agents ({i.agents:,} agents)"] = (
            *(_fmt(x.ours.cores_per_1000_agents) for x in p.idle), _fmt(p.ratio_idle_cores, "x"))
        cells["idle cores by process"] = (*(_cores(x.ours) for x in p.idle), "")
        cells["idle Redis commands/s"] = (*(_fmt(x.ours.commands_per_s) for x in p.idle),
                                          _fmt(p.ratio_idle_commands, "x"))
        cells["idle busiest Redis commands/s"] = (*(_busiest(x.ours) for x in p.idle), "")
        cells["idle Redis bytes per agent / job"] = (*(_fmt(x.bytes_per_job) for x in p.idle),
                                                     _fmt(p.ratio_idle_bytes, "x"))
    if (b := f.burst) is not None and p.burst:
        cells[f"burst due->followup ({b.agents:,} agents)"] = (
            *(_lat(x.latency) for x in p.burst),
            f"{_fmt(p.ratio_burst_p50, 'x')} p50 / {_fmt(p.ratio_burst_p99, 'x')} p99")
    return cells


def render_table(result: Result) -> str:
    header: tuple[str, ...] = ("figure", "ours", "bare libraries", "cost ratio")
    base = summary_rows(result.figures)
    cells = peer_cells(result.figures)
    rows: list[tuple[str, ...]]
    if cells:
        p = result.figures.peers
        assert p is not None
        names = [x.peer for x in (p.burst or p.idle)]
        header = (*header, *(f"peer {n} ({_peer_workers(p)} workers)" for n in names),
                  "ours vs best peer")
        blank = ("",) * (len(names) + 1)
        rows = [header, *((*row, *cells.get(row[0], blank)) for row in base)]
    else:
        rows = [header, *base]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for t in result.targets:
        verdict = "n/a" if t.met is None else ("met" if t.met else "MISSED")
        lines.append(f"target {t.name} {t.target}: {_fmt(t.measured)} {verdict}")
    lines.extend(f"note: {n}" for n in result.notes)
    if (load := result.machine.load_average) is not None:
        lines.append(f"machine: {result.machine.cpus} CPUs, load average at the end "
                     f"{' / '.join(f'{x:.2f}' for x in load)} (1 / 5 / 15 min)")
    return "\n".join(lines)
