"""``dsh-schedule``: one command with subcommands (docs/architecture.md#processes-and-cli).

Thin: parse the arguments, build the settings, configure logging, run. Each subcommand
imports what it needs when it runs, so ``check``, ``fold``, ``present``, ``catalog`` and
``--version`` load neither Redis nor rq. Input the command cannot use is one line on
stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.settings import LOG_LEVELS, LogSettings, Settings, SettingsError

if TYPE_CHECKING:
    import redis

    from dsh_schedule.shared.store.jsonl import JsonlStore

EXIT_UNHEALTHY: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_TOOL_ERROR: Final = 3
ONE_SHOT_REDIS_WAIT_S: Final = 5.0
REDIS_PROBE_TIMEOUT_S: Final = 1.0
OPS_SOCKET_TIMEOUT_S: Final = 5.0


class CommandError(Exception):
    """Input or an environment the command cannot use: one line on stderr, exit 2."""


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        redis_url=getattr(args, "redis", None),
        sessions=getattr(args, "sessions", None),
        queue=getattr(args, "queue", None),
        prefix=getattr(args, "prefix", None),
        metrics_port=getattr(args, "metrics_port", None),
        metrics_addr=getattr(args, "metrics_addr", None),
    )


def _serve_metrics(settings: Settings, command: str) -> None:
    """Serve Prometheus metrics when a port is set (docs/architecture.md#operations);
    CommandError when the port cannot be bound."""
    if settings.metrics_port is None:
        return
    from dsh_schedule.shared import metrics

    try:
        server = metrics.serve(settings.metrics_port, settings.metrics_addr)
    except OSError as exc:
        raise CommandError(
            f"{command}: cannot serve metrics on {settings.metrics_addr}:"
            f"{settings.metrics_port} ({exc.strerror or exc})"
        ) from None
    logging.getLogger(__name__).info(
        "%s: metrics at http://%s:%d/metrics", command, settings.metrics_addr, server.port
    )


def _require_redis(settings: Settings, command: str) -> str:
    if not settings.redis_url:
        raise CommandError(
            f"{command}: a Redis URL is required (--redis or DSH_SCHEDULE_REDIS_URL); "
            "an embedded Redis is private to one process"
        )
    return settings.redis_url


def _await_redis(url: str, wait_s: float | None, *, verbose: bool) -> None:
    """Return once Redis at ``url`` answers; CommandError when it did not within
    ``wait_s`` seconds (None waits for ever). A bounded wait is quiet unless verbose."""
    import redis

    from dsh_schedule.shared.coordination import outage

    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=REDIS_PROBE_TIMEOUT_S,
            socket_timeout=REDIS_PROBE_TIMEOUT_S,
        )
    except ValueError:
        raise CommandError(
            "the Redis URL is not usable (it starts with redis://, rediss:// or unix:// "
            "and names a numeric port and database)"
        ) from None
    startup_log = logging.getLogger(outage.__name__)
    quiet = wait_s is not None and not verbose

    def drop(record: logging.LogRecord) -> bool:
        return False

    if quiet:
        startup_log.addFilter(drop)
    try:
        outage.wait_for_redis(client, wait_s=wait_s)
    except outage.RedisUnavailable as exc:
        raise CommandError(
            f"Redis at {_where(client)} did not answer within {exc.waited_s:g} s "
            "(--redis-wait)"
        ) from None
    finally:
        startup_log.removeFilter(drop)
        client.close()


def _where(client: redis.Redis) -> str:
    """Where a client points, without credentials."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']} db {kwargs.get('db', 0)}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def _dump(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n")


# -- argument types ---------------------------------------------------------------------

_RFC3339: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


def rfc3339_ms(text: str) -> int:
    """Epoch milliseconds of an RFC 3339 instant with an offset (``Z``, ``z`` or
    ``±HH:MM``, any number of fraction digits; those past the millisecond are dropped).
    ValueError, naming the problem, for anything else."""
    from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, to_ms

    match = _RFC3339.fullmatch(text)
    if match is None:
        raise ValueError(
            "is not an RFC 3339 instant with an offset, such as 2030-01-01T00:00:00Z "
            "or 2030-01-01T02:00:00.250+02:00"
        )
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, offset = match[7] or "", match[8]
    try:
        wall = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        raise ValueError("names no real date and time") from None
    east_ms = 0
    if offset not in ("Z", "z"):
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError("has an offset beyond 23:59")
        east_ms = (hours * 60 + minutes) * 60_000 * (-1 if offset[0] == "-" else 1)
    ms = to_ms(wall) + int(fraction[:3].ljust(3, "0")) - east_ms
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError("lies outside the years 0001-9999 in UTC")
    return ms


def _instant_arg(text: str) -> int:
    try:
        return rfc3339_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None


def _seconds_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return seconds


def _port_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 0 to 65535")
    return int(text)


def _count_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 10_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 0 to 10000")
    return int(text)


def _tool_args(text: str | None) -> Any:
    """ARGS_JSON as a value; CommandError naming what keeps it from being read."""
    if not text:
        return {}
    try:
        return json.loads(text)
    except RecursionError:
        raise CommandError("ARGS_JSON is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"ARGS_JSON is not valid JSON ({exc.msg} at character {exc.pos})"
        ) from None
    except ValueError:  # an integer past the interpreter's digit limit
        raise CommandError("ARGS_JSON holds a number with too many digits") from None


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
    from dsh_schedule.shared.core.views import list_value, render
    from dsh_schedule.shared.store.jsonl import read_session_file

    session = read_session_file(Path(args.file))
    now = wall_clock_ms() if args.now is None else args.now
    print(render(list_value(fold(session.events, session.seed_length), now)))
    return 0


def cmd_present(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.presentation import receipt_value, reminder_presentation
    from dsh_schedule.shared.core.views import render
    from dsh_schedule.shared.store.jsonl import read_session_file

    session = read_session_file(Path(args.file))
    shown = reminder_presentation(session.events, args.seq, session.seed_length)
    # An event that is no dispatch has no receipt: its receipt value is null.
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
    store = JsonlStore.from_settings(settings)
    if args.session_command == "create":
        if args.time_zone is not None:
            load_zone(args.time_zone)
        store.create(
            SessionHeader(id=args.id, createdAt=wall_clock_ms(), timeZone=args.time_zone)
        )
        print(args.id)
    else:
        header = store.fork(args.parent, args.child, created_at_ms=wall_clock_ms())
        print(f"{header.id} (seedLength {header.seedLength})")
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.catalog import tool_definitions
    from dsh_schedule.shared.store.jsonl import JsonlStore

    settings = _settings(args)
    names = [tool.name for tool in tool_definitions()]
    if args.tool not in names:
        raise CommandError(f"call: unknown tool {args.tool!r} (one of {', '.join(names)})")
    tool_args = _tool_args(args.args_json)
    store = JsonlStore.from_settings(settings)
    if not store.exists(args.session):
        raise CommandError(
            f"call: session {args.session!r} does not exist in {str(settings.sessions)!r}"
        )
    if settings.redis_url:
        _await_redis(settings.redis_url, args.redis_wait, verbose=args.verbose)
    else:
        print("dsh-schedule call: no Redis URL; using an embedded Redis, no wake is armed",
              file=sys.stderr)

    from dsh_schedule.host.tools import ScheduleTools
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.coordination.connection import connect

    coordination = Coordination(connect(settings.redis_url), settings)
    tools = ScheduleTools(store, coordination, settings=settings, clock=wall_clock_ms)
    result = tools.call(args.session, args.tool, tool_args)
    print(result.content)
    return EXIT_TOOL_ERROR if result.is_error else 0


# -- long-running processes -----------------------------------------------------------


def _stop_while_starting() -> None:
    """A SIGTERM or SIGINT before the process's own loop has taken over (while it imports
    or waits for Redis) ends it cleanly: exit 0, as a stop during the loop would."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def cmd_worker(args: argparse.Namespace) -> int:
    _stop_while_starting()
    settings = _settings(args)
    _serve_metrics(settings, "worker")
    _await_redis(_require_redis(settings, "worker"), args.redis_wait, verbose=args.verbose)
    from dsh_schedule.worker.process import run_worker

    return run_worker(settings, burst=args.burst)


def cmd_scheduler(args: argparse.Namespace) -> int:
    _stop_while_starting()
    settings = _settings(args)
    _serve_metrics(settings, "scheduler")
    _await_redis(_require_redis(settings, "scheduler"), args.redis_wait, verbose=args.verbose)
    from dsh_schedule.scheduler.process import run_scheduler

    return run_scheduler(settings)


def cmd_rebuild(args: argparse.Namespace) -> int:
    settings = _settings(args)
    url = _require_redis(settings, "rebuild")
    _await_redis(url, args.redis_wait, verbose=args.verbose)
    import redis

    from dsh_schedule.scheduler.process import rebuild
    from dsh_schedule.shared.coordination.agents import Coordination

    coordination = Coordination(redis.Redis.from_url(url), settings)
    report = rebuild(coordination, settings, now_ms=wall_clock_ms())
    _dump({"woken": list(report.woken), "retired": list(report.retired)})
    return 0


def cmd_host(args: argparse.Namespace) -> int:
    _stop_while_starting()
    settings = _settings(args)
    url = _require_redis(settings, "host")
    from dsh_schedule.shared.store.jsonl import JsonlStore

    store = JsonlStore.from_settings(settings)
    _require_sessions(store, args.sessions_to_host)
    _serve_metrics(settings, "host")
    _await_redis(url, args.redis_wait, verbose=args.verbose)
    import threading

    import redis

    from dsh_schedule.host.reference import ReferenceHost
    from dsh_schedule.shared.coordination.agents import Coordination

    coordination = Coordination(redis.Redis.from_url(url), settings)
    host = ReferenceHost(
        store,
        coordination,
        settings,
        on_delivery=lambda session, d: print(f"{session}: delivered {d.text!r}", flush=True),
    )
    host.open_roots(args.sessions_to_host)
    from dsh_schedule.shared.collector import tune_for_service

    tune_for_service()
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    import signal

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    try:
        host.run(stop)
    finally:
        host.close()
    return 0


def _require_sessions(store: JsonlStore, sessions: Sequence[str]) -> None:
    """A host serves only sessions that exist: one that does not is a mistyped id or the
    wrong directory, and serving nothing for it would hide that."""
    missing: list[str] = []
    for session_id in sessions:
        try:
            if not store.exists(session_id):
                missing.append(session_id)
        except ValueError:
            raise CommandError(f"host: {session_id!r} is not a valid session id") from None
    if missing:
        shown = ", ".join(repr(m) for m in missing[:3]) + (" and more" if len(missing) > 3 else "")
        raise CommandError(f"host: {len(missing)} session(s) do not exist in "
                           f"{str(store.root)!r}: {shown} (create them with "
                           "'dsh-schedule session create ID')")


# -- the web console --------------------------------------------------------------------

WEB_MODULES: Final = ("fastapi", "starlette", "uvicorn", "jinja2")


def cmd_web(args: argparse.Namespace) -> int:
    """The web console (docs/web.md): embedded without a Redis URL, else a host of the
    deployment that Redis coordinates."""
    import os
    import tempfile

    _stop_while_starting()
    settings = _settings(args)
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if settings.redis_url:
        _await_redis(settings.redis_url, args.redis_wait, verbose=args.verbose)
    elif args.sessions is None and "DSH_SCHEDULE_SESSIONS" not in os.environ:
        # Embedded and no directory named: the sessions live as long as the console.
        scratch = tempfile.TemporaryDirectory(prefix="dsh-web-")
        args.sessions = Path(scratch.name) / "sessions"
        settings = _settings(args)
    try:
        from dsh_schedule.web.console import Console
        from dsh_schedule.web.server import WebServer
    except ModuleNotFoundError as exc:
        if exc.name not in WEB_MODULES:
            raise
        raise CommandError(
            f"web: needs the web extra ({exc.name} is missing): "
            "pip install 'dsh-tool-schedule[web]'"
        ) from None
    try:
        server = WebServer(Console(settings), host=args.bind, port=args.port)
    except OSError as exc:
        raise CommandError(
            f"web: cannot listen on {args.bind}:{args.port} ({exc.strerror or exc})"
        ) from None
    where = (f"a host on Redis {_where_url(settings.redis_url)}, queue {settings.queue!r}"
             if settings.redis_url else "embedded Redis, worker and mover in this process")
    print(f"dsh-schedule web: {server.url} ({where}; sessions in {settings.sessions})",
          flush=True)
    try:
        server.serve()
    finally:
        if scratch is not None:
            scratch.cleanup()
    return 0


def _where_url(url: str) -> str:
    import redis

    return _where(redis.Redis.from_url(url))


# -- operations -----------------------------------------------------------------------


def _ops_client(args: argparse.Namespace, command: str) -> tuple[Settings, redis.Redis]:
    """Settings and a client with bounded socket waits, once Redis answers."""
    settings = _settings(args)
    url = _require_redis(settings, command)
    _await_redis(url, args.redis_wait, verbose=args.verbose)
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=OPS_SOCKET_TIMEOUT_S, socket_timeout=OPS_SOCKET_TIMEOUT_S
    )
    return settings, client


def cmd_status(args: argparse.Namespace) -> int:
    import msgspec
    import redis

    from dsh_schedule import status

    settings, client = _ops_client(args, "status")
    try:
        report = status.read_status(client, settings, now_ms=wall_clock_ms(),
                                    next_count=args.next)
    except redis.RedisError as exc:
        raise CommandError(f"status: Redis failed while reading ({type(exc).__name__})") from None
    finally:
        client.close()
    if args.json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        print(status.render_status(report))
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when healthy, 1 (with one line saying why) when not, Redis unreachable
    included; 2 only for input the command cannot use."""
    import msgspec
    import redis

    from dsh_schedule import status
    from dsh_schedule.shared.coordination.agents import Coordination

    try:
        settings, client = _ops_client(args, "health")
    except CommandError as exc:
        if "did not answer" not in str(exc):
            raise
        health = status.Health(ok=False, reason=str(exc))
    else:
        try:
            # An explicit --queue must have a worker even without live agents.
            health = status.check_health(
                Coordination(client, settings), now_ms=wall_clock_ms(),
                also=[args.queue] if args.queue else [],
            )
        except redis.RedisError as exc:
            health = status.Health(ok=False,
                                   reason=f"Redis failed while checking ({type(exc).__name__})")
        finally:
            client.close()
    if args.json:
        sys.stdout.write(msgspec.json.encode(health).decode() + "\n")
    else:
        print(f"{'ok' if health.ok else 'unhealthy'}: {health.reason}")
    return 0 if health.ok else EXIT_UNHEALTHY


# -- parser ---------------------------------------------------------------------------

# Subcommands whose arguments are defined by a module that loads Redis and rq on import:
# that module is imported only when its subcommand is the one being run.
_ELSEWHERE: Final = {
    "demo": "dsh_schedule.demo",
    "loadtest": "dsh_schedule.loadtest.command",
}


class _Parser(argparse.ArgumentParser):
    """An argument error is one line on stderr too, and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"dsh-schedule: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """``--version``: the installed distribution's version, read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default,
                         nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        from dsh_schedule import __version__

        sys.stdout.write(f"dsh-schedule {__version__}\n")
        parser.exit()


def _verbose(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    # After a subcommand the flag is accepted too, without resetting one given before it.
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging",
                        default=False if top else argparse.SUPPRESS)


def _level_arg(text: str) -> str:
    name = text.strip().upper()
    name = "WARNING" if name == "WARN" else name
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level (one of {', '.join(LOG_LEVELS)})"
        )
    return name


def _logging_flags(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, ``--log-level`` and ``--rq-log-level`` (over the
    ``DSH_SCHEDULE_LOG_*`` variables; docs/architecture.md#operations)."""
    parser.add_argument("--log-format", choices=["text", "json"],
                        help="log lines as text or as one JSON object each "
                        "(default: DSH_SCHEDULE_LOG_FORMAT, else text)")
    parser.add_argument("--log-level", type=_level_arg, metavar="LEVEL",
                        help="DEBUG, INFO, WARNING, ERROR or CRITICAL "
                        "(default: DSH_SCHEDULE_LOG_LEVEL, else INFO; -v is DEBUG)")
    parser.add_argument("--rq-log-level", type=_level_arg, metavar="LEVEL",
                        help="the level of rq's own lines, e.g. WARNING to drop its lines "
                        "per job (default: DSH_SCHEDULE_RQ_LOG_LEVEL, else --log-level)")


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics at /metrics on this port "
                        "(default: DSH_SCHEDULE_METRICS_PORT, else off)")
    parser.add_argument("--metrics-addr", metavar="ADDR",
                        help="the address the metrics endpoint binds "
                        "(default: DSH_SCHEDULE_METRICS_ADDR, else 0.0.0.0)")


def _common(parser: argparse.ArgumentParser, *, redis: bool = True,
            redis_wait_s: float | None = None) -> None:
    _verbose(parser)
    if redis:
        _logging_flags(parser)
    parser.add_argument("--sessions", type=Path, help="session log directory")
    if redis:
        parser.add_argument("--redis", help="Redis URL (default: DSH_SCHEDULE_REDIS_URL)")
        parser.add_argument("--queue", help="rq queue name")
        parser.add_argument("--prefix", help="Redis key prefix")
        parser.add_argument(
            "--redis-wait", type=_seconds_arg, default=redis_wait_s, metavar="SECONDS",
            help="how long to wait at start-up for Redis to answer before exiting 2 "
            f"(default: {'for ever' if redis_wait_s is None else f'{redis_wait_s:g} s'})",
        )


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand in ``argv``: the first word that is no option (the top-level
    options take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for ``argv``; the arguments of ``demo`` and ``loadtest`` are defined
    only when ``argv`` runs one of them."""
    command = _command_of(argv)
    parser = _Parser(
        prog="dsh-schedule",
        description="Durable reminder tools for LLM agents: inspect session logs, run tool "
        "calls, and run the worker, scheduler and reference host "
        "(docs/architecture.md#processes-and-cli).",
    )
    _verbose(parser, top=True)
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("check", help="check session logs against the v1 invariant")
    _verbose(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("fold", help="print the schedule_list value of a log")
    _verbose(p)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--now", type=_instant_arg, metavar="INSTANT",
                   help="an RFC 3339 instant with an offset, such as 2030-01-01T00:00:00Z "
                   "(default: the wall clock)")
    p.set_defaults(func=cmd_fold)
    p = sub.add_parser("present", help="print the receipt of a dispatch event (null for "
                       "an event that is no dispatch)")
    _verbose(p)
    p.add_argument("file", metavar="FILE")
    p.add_argument("seq", type=int, metavar="SEQ")
    p.set_defaults(func=cmd_present)
    p = sub.add_parser("catalog", help="print the tool definitions")
    _verbose(p)
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
        _verbose(subparser)
        # Accepted after the subcommand too, without overriding one given before it.
        subparser.add_argument("--sessions", type=Path, default=argparse.SUPPRESS,
                               help="session log directory")
    p.set_defaults(func=cmd_session)

    p = sub.add_parser("call", help="run one tool call as the host would")
    _common(p, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.add_argument("session", metavar="SESSION")
    p.add_argument("tool", metavar="TOOL", help="a tool name that `dsh-schedule catalog` lists")
    p.add_argument("args_json", nargs="?", metavar="ARGS_JSON",
                   help="the tool's arguments as a JSON object (default: {})")
    p.set_defaults(func=cmd_call)

    p = sub.add_parser("worker", help="serve wakes (rq SimpleWorker)")
    _common(p)
    _metrics_flags(p)
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("scheduler", help="move due wakes; rebuild and reconcile")
    _common(p)
    _metrics_flags(p)
    p.set_defaults(func=cmd_scheduler)
    p = sub.add_parser("rebuild", help="one rebuild pass")
    _common(p, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.set_defaults(func=cmd_rebuild)

    for name, helptext in (
        ("demo", "the whole system on embedded defaults, as a timeline"),
        ("loadtest", "load test on the embedded Redis or a real one"),
    ):
        p = sub.add_parser(name, help=helptext)
        _verbose(p)
        _logging_flags(p)
        if name == command:
            module = importlib.import_module(_ELSEWHERE[name])
            module.add_arguments(p)
            p.set_defaults(func=module.run)

    p = sub.add_parser("host", help="run the reference host for sessions")
    _common(p)
    _metrics_flags(p)
    p.add_argument("sessions_to_host", nargs="+", metavar="SESSION")
    p.set_defaults(func=cmd_host)

    p = sub.add_parser("web", help="the web console: watch and drive reminders in a browser "
                       "(embedded without a Redis URL)")
    _common(p)
    p.add_argument("--port", type=_port_arg, default=8321, metavar="PORT",
                   help="the port to listen on (default: 8321; 0: any free port)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on (default: 127.0.0.1)")
    p.set_defaults(func=cmd_web)

    p = sub.add_parser("status", help="live agents, wakes, followups, workers and the "
                       "scheduler heartbeat")
    _common(p, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--next", type=_count_arg, default=5, metavar="N",
                   help="how many of the next scheduled wakes to show (default: 5)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("health", help="exit 0 when the scheduler heartbeat is fresh and "
                       "every queue with live agents (and the one --queue names) has a "
                       "worker, else 1 saying why")
    _common(p, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.add_argument("--json", action="store_true", help='{"ok":…,"reason":…}')
    p.set_defaults(func=cmd_health)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    """Flags over ``-v`` over the ``DSH_SCHEDULE_LOG_*`` variables; SettingsError for a
    variable that names no format or level."""
    from dsh_schedule.shared.logging_setup import configure

    level_flag = getattr(args, "log_level", None)
    options = LogSettings.from_env(
        format=getattr(args, "log_format", None),
        level=level_flag,
        rq_level=getattr(args, "rq_log_level", None),
    )
    configure(options, level="DEBUG" if args.verbose and level_flag is None else None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    try:
        _configure_logging(args)
    except SettingsError as exc:
        print(f"dsh-schedule: bad setting: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError, ToolError

    try:
        result: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except CommandError as exc:
        print(f"dsh-schedule: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SettingsError as exc:
        print(f"dsh-schedule: bad setting: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ToolError as exc:
        print(f"dsh-schedule: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ScheduleLogError, PersistenceError) as exc:
        print(f"dsh-schedule: {exc}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
