"""``dsh-schedule``: one command with subcommands (docs/architecture.md#processes-and-cli).
Thin: parse, build, run."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsh_schedule.shared.settings import Settings

log = logging.getLogger("dsh_schedule")

EXIT_TOOL_ERROR = 3


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        redis_url=getattr(args, "redis", None),
        sessions=getattr(args, "sessions", None),
        queue=getattr(args, "queue", None),
        prefix=getattr(args, "prefix", None),
    )


def _require_redis(settings: Settings, command: str) -> None:
    if not settings.redis_url:
        raise SystemExit(
            f"dsh-schedule {command}: a Redis URL is required (--redis or "
            "DSH_SCHEDULE_REDIS_URL); an embedded Redis is private to one process"
        )


def _dump(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n")


# -- read-only commands on the pure core ----------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
    from dsh_schedule.shared.core.fold import fold
    from dsh_schedule.shared.store.jsonl import read_session_file

    status = 0
    for name in args.files:
        try:
            session = read_session_file(Path(name))
            fold(session.events, session.seed_length)
        except (ScheduleLogError, PersistenceError, ValueError) as exc:
            print(f"{name}: {exc}")
            status = 1
        else:
            print(f"{name}: ok")
    return status


def cmd_fold(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.fold import fold
    from dsh_schedule.shared.core.instant import parse_instant
    from dsh_schedule.shared.core.views import list_value, render
    from dsh_schedule.shared.store.jsonl import read_session_file

    session = read_session_file(Path(args.file))
    now = parse_instant(args.now) if args.now else _wall_ms()
    print(render(list_value(fold(session.events, session.seed_length), now)))
    return 0


def cmd_present(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.presentation import receipt_value, reminder_presentation
    from dsh_schedule.shared.core.views import render
    from dsh_schedule.shared.store.jsonl import read_session_file

    session = read_session_file(Path(args.file))
    shown = reminder_presentation(session.events, args.seq, session.seed_length)
    print(render(None if shown is None else receipt_value(shown)))
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core import catalog

    exporters = {
        "catalog": catalog.catalog_json,
        "openai": catalog.openai_tools,
        "anthropic": catalog.anthropic_tools,
    }
    print(json.dumps(exporters[args.format](), ensure_ascii=False, indent=2))
    return 0


# -- sessions and tools ---------------------------------------------------------------


def cmd_session(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.events import SessionHeader
    from dsh_schedule.shared.core.timesel import load_zone
    from dsh_schedule.shared.store.jsonl import JsonlStore

    settings = _settings(args)
    store = JsonlStore(settings.sessions)
    if args.session_command == "create":
        if args.time_zone is not None:
            load_zone(args.time_zone)
        store.create(SessionHeader(id=args.id, createdAt=_wall_ms(), timeZone=args.time_zone))
        print(args.id)
    else:
        header = store.fork(args.parent, args.child, created_at_ms=_wall_ms())
        print(f"{header.id} (seedLength {header.seedLength})")
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    from dsh_schedule.host.tools import ScheduleTools
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.coordination.connection import connect
    from dsh_schedule.shared.store.jsonl import JsonlStore

    settings = _settings(args)
    tool_args = json.loads(args.args_json) if args.args_json else {}
    if not settings.redis_url:
        print("dsh-schedule call: no Redis URL; using an embedded Redis, no wake is armed",
              file=sys.stderr)
    coordination = Coordination(connect(settings.redis_url), settings)
    tools = ScheduleTools(JsonlStore(settings.sessions), coordination, _wall_ms)
    result = tools.call(args.session, args.tool, tool_args)
    print(result.content)
    return EXIT_TOOL_ERROR if result.is_error else 0


# -- long-running processes -----------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    from dsh_schedule.worker.process import run_worker

    settings = _settings(args)
    _require_redis(settings, "worker")
    return run_worker(settings, burst=args.burst)


def cmd_scheduler(args: argparse.Namespace) -> int:
    from dsh_schedule.scheduler.process import run_scheduler

    settings = _settings(args)
    _require_redis(settings, "scheduler")
    return run_scheduler(settings)


def cmd_rebuild(args: argparse.Namespace) -> int:
    import redis

    from dsh_schedule.scheduler.process import rebuild
    from dsh_schedule.shared.coordination.agents import Coordination

    settings = _settings(args)
    _require_redis(settings, "rebuild")
    assert settings.redis_url
    coordination = Coordination(redis.Redis.from_url(settings.redis_url), settings)
    report = rebuild(coordination, now_ms=_wall_ms())
    _dump({"woken": list(report.woken), "retired": list(report.retired)})
    return 0


def cmd_host(args: argparse.Namespace) -> int:
    import redis

    from dsh_schedule.host.reference import ReferenceHost
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.store.jsonl import JsonlStore

    settings = _settings(args)
    _require_redis(settings, "host")
    assert settings.redis_url
    coordination = Coordination(redis.Redis.from_url(settings.redis_url), settings)
    host = ReferenceHost(
        JsonlStore(settings.sessions),
        coordination,
        on_delivery=lambda session, d: print(f"{session}: delivered {d.text!r}", flush=True),
    )
    for session_id in args.sessions_to_host:
        host.open_root(session_id)
    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        host.run(stop)
    finally:
        host.close()
    return 0


def _stop_on_signals(stop: threading.Event) -> None:
    import signal

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _wall_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


# -- parser ---------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, *, redis: bool = True) -> None:
    parser.add_argument("--sessions", type=Path, help="session log directory")
    if redis:
        parser.add_argument("--redis", help="Redis URL (default: DSH_SCHEDULE_REDIS_URL)")
        parser.add_argument("--queue", help="rq queue name")
        parser.add_argument("--prefix", help="Redis key prefix")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsh-schedule", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check", help="check session logs against the v1 invariant")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("fold", help="print the schedule_list value of a log")
    p.add_argument("file")
    p.add_argument("--now", help="canonical UTC instant (default: the wall clock)")
    p.set_defaults(func=cmd_fold)
    p = sub.add_parser("present", help="print the receipt of a dispatch event")
    p.add_argument("file")
    p.add_argument("seq", type=int)
    p.set_defaults(func=cmd_present)
    p = sub.add_parser("catalog", help="print the tool definitions")
    p.add_argument("--format", choices=["catalog", "openai", "anthropic"], default="catalog")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("session", help="create or fork JSONL sessions")
    _common(p, redis=False)
    session_sub = p.add_subparsers(dest="session_command", required=True)
    c = session_sub.add_parser("create")
    c.add_argument("id")
    c.add_argument("--time-zone")
    f = session_sub.add_parser("fork")
    f.add_argument("parent")
    f.add_argument("child")
    for subparser in (c, f):
        # Accepted after the subcommand too, without overriding one given before it.
        subparser.add_argument("--sessions", type=Path, default=argparse.SUPPRESS,
                               help="session log directory")
    p.set_defaults(func=cmd_session)

    p = sub.add_parser("call", help="run one tool call as the host would")
    _common(p)
    p.add_argument("session")
    p.add_argument("tool", choices=["schedule_create", "schedule_list", "schedule_delete"])
    p.add_argument("args_json", nargs="?")
    p.set_defaults(func=cmd_call)

    for name, func, helptext in (
        ("worker", cmd_worker, "serve wakes (rq SimpleWorker)"),
        ("scheduler", cmd_scheduler, "move due wakes; rebuild and reconcile"),
        ("rebuild", cmd_rebuild, "one rebuild pass"),
    ):
        p = sub.add_parser(name, help=helptext)
        _common(p)
        if name == "worker":
            p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
        p.set_defaults(func=func)
    from dsh_schedule import demo
    from dsh_schedule.loadtest import command as loadtest

    p = sub.add_parser("demo", help="the whole system on embedded defaults, as a timeline")
    demo.add_arguments(p)
    p.set_defaults(func=demo.run)
    p = sub.add_parser("loadtest", help="load test on the embedded Redis or a real one")
    loadtest.add_arguments(p)
    p.set_defaults(func=loadtest.run)
    p = sub.add_parser("host", help="run the reference host for sessions")
    _common(p)
    p.add_argument("sessions_to_host", nargs="+", metavar="SESSION")
    p.set_defaults(func=cmd_host)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError, ToolError
    from dsh_schedule.shared.settings import SettingsError

    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except SettingsError as exc:
        print(f"dsh-schedule: bad setting: {exc}", file=sys.stderr)
        return 2
    except json.JSONDecodeError:
        print("dsh-schedule: ARGS_JSON is not valid JSON", file=sys.stderr)
        return 2
    except ToolError as exc:
        print(f"dsh-schedule: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    except (ScheduleLogError, PersistenceError) as exc:
        print(f"dsh-schedule: {exc}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
