"""``dsh-schedule loadtest``: N hosts x M agents x K reminders, beside the bare libraries.

Phases create, session, due, lateness and rebuild run N reference hosts in this process
(``--hosts``), each holding its share of the agents. Without ``--redis`` everything runs in
this process on the embedded Redis. With a Redis URL the load test spawns real
``dsh-schedule worker`` (and, for delivery lateness, ``scheduler``) processes under a
prefix and queue of its own, runs the hosts in this process, and deletes only the keys it
wrote. Phases idle, burst and memory need ``--redis``: every part of the system runs in a
process of its own there (workers, scheduler, and a ``dsh-schedule host`` process), and
their figures are read from /proc, Redis INFO and the session logs. The run is bounded in
count by its flags and in time by ``--max-seconds``; progress goes to stderr, a summary
table to stdout, and every figure to a JSON file.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
import redis

from dsh_schedule.loadtest.agents import Plan
from dsh_schedule.loadtest.creates import measure_create
from dsh_schedule.loadtest.figures import Figures, PeerBurst, PeerIdle, peers_figure
from dsh_schedule.loadtest.long_session import measure_long_session
from dsh_schedule.loadtest.peers import peers_burst, peers_idle
from dsh_schedule.loadtest.phases import measure_due, measure_lateness
from dsh_schedule.loadtest.process_idle import cpu_window, measure_idle
from dsh_schedule.loadtest.process_phases import (
    RuntimeFactory,
    measure_burst,
    measure_process_memory,
)
from dsh_schedule.loadtest.process_runtime import RedisRuntime, with_db
from dsh_schedule.loadtest.rebuild import measure_rebuild
from dsh_schedule.loadtest.report import Result, render_table, targets
from dsh_schedule.loadtest.runtime import InProcessRuntime, LoadtestError, Runtime
from dsh_schedule.loadtest.stats import Progress, Stopwatch, machine
from dsh_schedule.loadtest.unloaded import measure_unloaded
from dsh_schedule.shared.settings import Settings

PHASES: Final = ("create", "session", "due", "lateness", "rebuild", "idle", "burst", "memory",
                  "unloaded")
# Phases where every part is a process of its own: with --redis only.
PROCESS_PHASES: Final = ("idle", "burst", "memory", "unloaded")

# (flag, Plan field, full run, embedded run, smoke run, upper bound); the sizes of the
# process phases have no embedded column of their own (they need --redis).
_SIZES: Final = (
    ("--hosts", "hosts", 2, 1, 1, 64),
    ("--workers", "workers", 2, 1, 1, 16),
    ("--threads", "threads", 4, 2, 2, 32),
    ("--create-agents", "create_agents", 64, 16, 4, 10_000),
    ("--creates", "creates", 3000, 600, 40, 200_000),
    ("--session-calls", "session_calls", 300, 100, 10, 10_000),
    ("--due-agents", "due_agents", 2000, 300, 12, 100_000),
    ("--late-agents", "late_agents", 200, 40, 4, 10_000),
    ("--late-reminders", "late_reminders", 400, 80, 8, 20_000),
    ("--window", "window_s", 12, 5, 2, 120),  # seconds
    ("--rebuild-agents", "rebuild_agents", 10_000, 1000, 12, 200_000),
    ("--rebuild-records", "rebuild_records", 10, 10, 3, 100),
    ("--idle-agents", "idle_agents", 20_000, 20_000, 20, 200_000),
    ("--idle-window", "idle_window_s", 60, 60, 2, 3600),  # seconds
    ("--idle-warmup", "idle_warmup_s", 10, 10, 1, 600),  # seconds
    ("--burst-agents", "burst_agents", 10_000, 10_000, 20, 100_000),
    ("--memory-sessions", "memory_sessions", 1000, 1000, 3, 10_000),
    ("--memory-events", "memory_events", 10_000, 10_000, 1000, 1_000_000),
    ("--unloaded-sessions", "unloaded_sessions", 1_000_000, 1_000_000, 20, 2_000_000),
    ("--unloaded-burst", "unloaded_burst", 10_000, 10_000, 10, 100_000),
)
_PROCESS_SIZES: Final = frozenset({"idle_agents", "idle_window_s", "idle_warmup_s",
                                   "burst_agents", "memory_sessions", "memory_events",
                                   "unloaded_sessions", "unloaded_burst"})
_SESSION_SIZES: Final = {
    "full": (0, 100, 1_000, 10_000, 100_000),
    "embedded": (0, 100, 1_000, 10_000, 100_000),
    "smoke": (0, 100, 1_000),
}
MAX_SESSION_EVENTS: Final = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.replace("``", "") if __doc__ else None
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--redis", metavar="URL",
                        help="a real Redis (default: the embedded one, in this process); "
                        "only keys under a prefix and queue of this run are written and "
                        "deleted, except in the --rebuild-db database")
    parser.add_argument("--rebuild-db", type=int, default=15, metavar="N",
                        help="with --redis: the database of the same server that the "
                        "rebuild-after-flush figure uses and FLUSHES; it must be empty at "
                        "the start (default: 15)")
    parser.add_argument("--sessions", type=Path, metavar="DIR",
                        help="session directory (default: a temporary one, removed after)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="results file (default: bench-results/loadtest-<timestamp>.json)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run that finishes in seconds (on the embedded Redis "
                        "unless --redis is given)")
    parser.add_argument("--phases",
                        help="comma-separated subset of " + ",".join(PHASES) + " (default: "
                        "all; " + ",".join(PROCESS_PHASES) + " only with --redis)")
    parser.add_argument("--session-sizes", metavar="N,N,...",
                        help="session lengths in events for the long-session figure")
    parser.add_argument("--max-seconds", type=float, default=3600.0, metavar="S",
                        help="time bound: no phase starts after it and every wait gives "
                        "up at it (default: 3600)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--peers", action="store_true",
                        help="with --redis: run the idle and burst phases' N also through arq "
                             "deferred jobs and rq's own scheduler (rq worker --with-scheduler, "
                             "Worker and SimpleWorker), each with --workers worker processes, "
                             "and report them beside ours (arq: the [bench] extra, or "
                             "--arq-path)")
    parser.add_argument("--arq-path", type=Path, metavar="DIR",
                        help="with --peers: a directory holding arq, first on the arq "
                             "processes' path (pip install --target DIR 'arq>=0.26,<0.29'; "
                             "arq pins redis<6, so it may live beside the project's "
                             "environment; default: this interpreter's own)")
    for flag, field, full, embedded, smoke, bound in _SIZES:
        if field in _PROCESS_SIZES:
            unit = " seconds" if field.endswith("_s") else ""
            text = f"default {full}{unit}, {smoke} with --smoke (at most {bound})"
        else:
            text = (f"default {full} with --redis, {embedded} embedded, {smoke} with --smoke "
                    f"(at most {bound})")
        parser.add_argument(flag, type=int, dest=field, metavar="N", help=text)


def build_plan(args: argparse.Namespace, tag: str) -> Plan:
    scale = "smoke" if args.smoke else ("full" if args.redis else "embedded")
    column = {"full": 2, "embedded": 3, "smoke": 4}[scale]
    sizes: dict[str, Any] = {}
    for row in _SIZES:
        flag, field, bound = row[0], row[1], row[5]
        value = getattr(args, field)
        value = row[column] if value is None else value
        if not 1 <= int(value) <= int(bound):
            raise SystemExit(f"loadtest: {flag} must be between 1 and {bound}")
        sizes[field] = int(value)
    # Each create thread keeps to its own agents, so none waits for another's agent lock.
    threads, agents = sizes["threads"], sizes["create_agents"]
    sizes["create_agents"] = max(threads, agents - agents % threads)
    return Plan(tag=tag, session_sizes=_session_sizes(args, scale), lead_s=3 if scale != "smoke"
                else 1, rebuild_db=args.rebuild_db, max_seconds=args.max_seconds, **sizes)


def _session_sizes(args: argparse.Namespace, scale: str) -> tuple[int, ...]:
    if not args.session_sizes:
        return _SESSION_SIZES[scale]
    try:
        sizes = tuple(sorted({int(n) for n in args.session_sizes.split(",")}))
    except ValueError:
        raise SystemExit("loadtest: --session-sizes takes numbers, e.g. 0,1000,100000") from None
    if not sizes or sizes[0] < 0 or sizes[-1] > MAX_SESSION_EVENTS:
        raise SystemExit(f"loadtest: session sizes lie in 0..{MAX_SESSION_EVENTS}")
    return sizes


def select_phases(text: str | None, *, redis: bool) -> list[str]:
    """The phases to run, in their order: all by default (the process phases only with a
    Redis); SystemExit for an unknown one, or a process phase asked for without a Redis."""
    if text is None:
        return [p for p in PHASES if redis or p not in PROCESS_PHASES]
    asked = {p.strip() for p in text.split(",") if p.strip()}
    if unknown := sorted(asked - set(PHASES)):
        raise SystemExit(f"loadtest: unknown phase(s) {', '.join(unknown)}")
    if not redis and (need := [p for p in PROCESS_PHASES if p in asked]):
        raise SystemExit(f"loadtest: phase(s) {', '.join(need)} run real processes and "
                         "need --redis URL")
    if not asked:
        raise SystemExit("loadtest: --phases names no phase")
    return [p for p in PHASES if p in asked]


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "verbose", False):
        logging.getLogger().setLevel(logging.WARNING)
    phases = select_phases(args.phases, redis=bool(args.redis))
    if args.peers and not args.redis:
        raise SystemExit("loadtest: --peers runs real processes and needs --redis URL")
    if args.peers and not {"idle", "burst"} & set(phases):
        raise SystemExit("loadtest: --peers measures the idle and burst phases; name one")
    tag = f"lt{uuid.uuid4().hex[:8]}"
    plan = build_plan(args, tag)
    progress = Progress(quiet=args.quiet)
    started = datetime.now(UTC)
    temp = None if args.sessions else Path(tempfile.mkdtemp(prefix="dsh-loadtest-"))
    root = args.sessions if args.sessions else temp
    assert root is not None
    try:
        result = _run_phases(args, plan, phases, root, progress, started)
    except (LoadtestError, redis.RedisError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        if temp is not None and not any(temp.glob("*-logs")):
            shutil.rmtree(temp, ignore_errors=True)  # else kept: the processes' logs
        return 1
    if temp is not None:
        shutil.rmtree(temp, ignore_errors=True)
    print(render_table(result))
    path = args.json or Path("bench-results") / f"loadtest-{started:%Y%m%dT%H%M%SZ}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2) + b"\n")
    print(f"results: {path}")
    return 0


def _run_phases(args: argparse.Namespace, plan: Plan, phases: list[str], root: Path,
                progress: Progress, started: datetime) -> Result:
    watch = Stopwatch()
    figures = Figures()
    notes: list[str] = []
    sessions = root / plan.tag
    mode = "redis" if args.redis else "embedded"

    def budget_left(name: str) -> bool:
        if watch.seconds() < plan.max_seconds:
            return True
        notes.append(f"phase {name} skipped: --max-seconds {plan.max_seconds:g} reached")
        return False

    if args.redis and "rebuild" in phases:
        _check_rebuild_db(args.redis, plan.rebuild_db)
    version = _redis_version(args.redis)
    deadline = time.monotonic() + plan.max_seconds
    in_process = [p for p in phases if p not in PROCESS_PHASES]
    if in_process:
        _in_process_phases(args, plan, in_process, sessions, figures, progress, budget_left,
                           deadline)

    def open_runtime(suffix: str, workers: int) -> RedisRuntime:
        return _phase_runtime(args.redis, plan, sessions, suffix, workers, deadline)

    process_steps: list[tuple[str, Callable[[RuntimeFactory], None]]] = [
        ("idle", lambda f: setattr(figures, "idle", measure_idle(f, plan, progress))),
        ("burst", lambda f: setattr(figures, "burst", measure_burst(f, plan, progress))),
        ("memory", lambda f: setattr(figures, "process_memory",
                                     measure_process_memory(f, plan, progress))),
        ("unloaded", lambda f: setattr(figures, "unloaded", measure_unloaded(f, plan, progress))),
    ]
    peer_idle: list[PeerIdle] = []
    peer_burst: list[PeerBurst] = []
    peer_dir = sessions.parent / f"{plan.tag}-peers"
    for name, process_step in process_steps:
        if name in phases and budget_left(name):
            process_step(open_runtime)
            if args.peers and name == "idle":
                peer_idle = peers_idle(open_runtime, plan.idle_agents, plan.workers,
                                       plan.idle_warmup_s, plan.idle_window_s, peer_dir,
                                       cpu_window, progress, args.arq_path)
            if args.peers and name == "burst":
                peer_burst = peers_burst(open_runtime, plan.burst_agents, plan.workers,
                                         plan.lead_s, peer_dir, progress,
                                         60 + plan.burst_agents / 20, args.arq_path)
    shutil.rmtree(peer_dir, ignore_errors=True)
    if peer_idle or peer_burst:
        figures.peers = peers_figure(figures.idle, figures.burst, peer_idle, peer_burst)
    if mode == "embedded":
        notes.append("embedded Redis: one process, one in-process worker; Redis memory is "
                     "not measured, the targets (set for real Redis) are not judged, and "
                     "phases " + ", ".join(PROCESS_PHASES) + " (real processes) need --redis")
    if figures.process_memory is not None and figures.process_memory.note:
        notes.append(f"memory: {figures.process_memory.note}")
    if args.smoke:
        notes.append("smoke run: sizes far below the targets' scale; figures are indicative")
    return Result(
        version=1, mode=mode, started_at=started.isoformat(timespec="seconds"),
        seconds=round(watch.seconds(), 1), command=["dsh-schedule", *sys.argv[1:]],
        machine=machine(version),
        plan=msgspec.to_builtins(plan), figures=figures,
        targets=targets(figures, real_redis=mode == "redis"), notes=notes,
    )


def _in_process_phases(args: argparse.Namespace, plan: Plan, phases: list[str],
                       sessions: Path, figures: Figures, progress: Progress,
                       budget_left: Callable[[str], bool], deadline: float) -> None:
    """The phases with the hosts in this process (create, session, due, lateness, rebuild)."""
    main = _runtime(args, plan, sessions, plan.workers)
    main.deadline = deadline
    try:
        steps: list[tuple[str, Callable[[Runtime], None]]] = [
            ("create", lambda rt: setattr(figures, "create", measure_create(rt, plan, progress))),
            ("session", lambda rt: setattr(figures, "long_session",
                                           measure_long_session(rt, plan, progress))),
            ("due", lambda rt: setattr(figures, "due", measure_due(rt, plan, progress))),
            ("lateness", lambda rt: setattr(figures, "lateness",
                                            measure_lateness(rt, plan, progress))),
        ]
        for name, step in steps:
            if name in phases and budget_left(name):
                step(main)
        if "rebuild" in phases and budget_left("rebuild"):
            _rebuild_phase(args, plan, sessions, main, figures, progress)
    finally:
        main.close()


def _phase_runtime(url: str, plan: Plan, sessions: Path, suffix: str, workers: int,
                   deadline: float) -> RedisRuntime:
    """A runtime of its own for a process phase: prefix, queue and keys under
    ``<run tag>-<suffix>``, deleted when it closes; its workers are not started yet."""
    tag = f"{plan.tag}-{suffix}"
    runtime = RedisRuntime(url, sessions, prefix=f"dsh-loadtest-{tag}:",
                           queue=f"dsh-loadtest-{tag}", workers=workers,
                           logs=sessions.parent / f"{plan.tag}-logs",
                           tags=(tag, tag.encode().hex()))
    runtime.deadline = deadline
    return runtime


def _runtime(args: argparse.Namespace, plan: Plan, sessions: Path, workers: int) -> Runtime:
    settings = Settings.from_env({}, sessions=sessions, prefix=f"dsh-loadtest-{plan.tag}:",
                                 queue=f"dsh-loadtest-{plan.tag}")
    if not args.redis:
        return InProcessRuntime(sessions, settings)
    runtime = RedisRuntime(args.redis, sessions, prefix=settings.prefix, queue=settings.queue,
                           workers=workers, logs=sessions.parent / f"{plan.tag}-logs",
                           tags=(plan.tag, plan.tag.encode().hex()))
    runtime.start_workers()
    return runtime


def _rebuild_phase(args: argparse.Namespace, plan: Plan, sessions: Path, main: Runtime,
                   figures: Figures, progress: Progress) -> None:
    if not args.redis:
        assert isinstance(main, InProcessRuntime)
        figures.rebuild, figures.memory = measure_rebuild(
            main, plan, progress, flush=main.client.flushall, db=None)
        return
    if isinstance(main, RedisRuntime):
        main.close()  # its workers stop; the rebuild database gets workers of its own
    rebuild_rt = RedisRuntime(with_db(args.redis, plan.rebuild_db), sessions,
                              prefix=f"dsh-loadtest-{plan.tag}-r:",
                              queue=f"dsh-loadtest-{plan.tag}-r", workers=plan.workers,
                              logs=sessions.parent / f"{plan.tag}-logs",
                              tags=(plan.tag,), owns_db=True)
    rebuild_rt.deadline = main.deadline
    try:
        rebuild_rt.start_workers()
        figures.rebuild, figures.memory = measure_rebuild(
            rebuild_rt, plan, progress, flush=rebuild_rt.client.flushdb, db=plan.rebuild_db)
    finally:
        rebuild_rt.close()


def _check_rebuild_db(url: str, db: int) -> None:
    """Refuse, before anything runs, a rebuild database that is not empty or not separate."""
    main = redis.Redis.from_url(url)
    rebuild = redis.Redis.from_url(with_db(url, db))
    try:
        if main.connection_pool.connection_kwargs.get("db", 0) == db:
            raise LoadtestError(f"--rebuild-db {db} is the database of --redis; the rebuild "
                                "figure flushes its database, so it needs another one")
        if rebuild.dbsize():
            raise LoadtestError(f"Redis database {db} is not empty; the rebuild figure "
                                "flushes a database of its own (choose one with --rebuild-db)")
    except redis.RedisError as exc:
        raise LoadtestError(f"cannot use Redis at {url}: {exc}") from None
    finally:
        main.close()
        rebuild.close()


def _redis_version(url: str | None) -> str | None:
    if not url:
        return None
    client = redis.Redis.from_url(url)
    try:
        info: Any = client.info("server")
        return str(info.get("redis_version"))
    except redis.RedisError as exc:
        raise LoadtestError(f"cannot use Redis at {url}: {exc}") from None
    finally:
        client.close()
