"""The ``dsh-schedule`` parser and ``main`` (docs/architecture.md#processes-and-cli); the
options many subcommands share: ``cli/options.py``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from dsh_schedule.cli.commands import (
    cmd_call,
    cmd_catalog,
    cmd_check,
    cmd_fold,
    cmd_host,
    cmd_present,
    cmd_rebuild,
    cmd_scheduler,
    cmd_session,
    cmd_worker,
)
from dsh_schedule.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CLOSED_OUTPUT,
    ONE_SHOT_REDIS_WAIT_S,
    CommandError,
    count_arg,
    instant_arg,
    port_arg,
    session_id_arg,
)
from dsh_schedule.cli.ops import cmd_health, cmd_status, cmd_web
from dsh_schedule.cli.options import (
    CONNECTION_GROUP,
    SESSIONS_HELP,
    STORE_HELP,
    common_options,
    logging_flags,
    metrics_flags,
    option_group,
    positive_seconds_arg,
    sessions_file_arg,
    verbose_flag,
)
from dsh_schedule.cli.reminders import add_arguments as reminders_arguments
from dsh_schedule.cli.store import add_store_commands
from dsh_schedule.shared.settings import LogSettings, SettingsError

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
    verbose_flag(parser, top=True)
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("check", help="check session logs against the v1 invariant")
    verbose_flag(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("fold", help="print the schedule_list value of a log")
    verbose_flag(p)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--now", type=instant_arg, metavar="INSTANT",
                   help="an RFC 3339 instant with an offset, such as 2030-01-01T00:00:00Z "
                   "(default: the wall clock)")
    p.set_defaults(func=cmd_fold)
    p = sub.add_parser("present", help="print the receipt of a dispatch event (null for "
                       "an event that is no dispatch)")
    verbose_flag(p)
    p.add_argument("file", metavar="FILE")
    p.add_argument("seq", type=int, metavar="SEQ")
    p.set_defaults(func=cmd_present)
    p = sub.add_parser(
        "catalog", help="print the tool definitions",
        description="Print the tools' definitions. With DSH_SCHEDULE_CALENDAR=on, the "
                    "variant with calendar rules (schedule_create with cron; "
                    "docs/decisions.md#calendar-rules); with DSH_SCHEDULE_LIFECYCLE=on, "
                    "the one with schedule_update (docs/decisions.md#lifecycle-editing-"
                    "pausing-and-ending-reminders).")
    verbose_flag(p)
    p.add_argument("--format", choices=["catalog", "openai", "anthropic"], default="catalog",
                   help="the project's catalog, or the tools in the OpenAI or Anthropic "
                   "format (default: catalog)")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("session", help="create or fork JSONL sessions")
    common_options(p, redis=False)
    session_sub = p.add_subparsers(dest="session_command", required=True)
    c = session_sub.add_parser("create")
    c.add_argument("id", type=session_id_arg, metavar="ID",
                   help="the new session's id (docs/architecture.md#session-logs)")
    c.add_argument("--time-zone", metavar="ZONE",
                   help="the session's IANA time zone, e.g. Europe/Berlin (default: none)")
    f = session_sub.add_parser("fork")
    f.add_argument("parent", type=session_id_arg, metavar="PARENT",
                   help="the session to fork")
    f.add_argument("child", type=session_id_arg, metavar="CHILD",
                   help="the new session's id")
    for subparser in (c, f):
        verbose_flag(subparser)
        # Accepted after the subcommand too, without overriding one given before it.
        group = option_group(subparser, CONNECTION_GROUP)
        group.add_argument("--sessions", type=Path, default=argparse.SUPPRESS, metavar="DIR",
                           help=SESSIONS_HELP)
        group.add_argument("--store", default=argparse.SUPPRESS, metavar="DIR|URL",
                           help=STORE_HELP)
    p.set_defaults(func=cmd_session)

    p = sub.add_parser("call", help="run one tool call as the host would")
    common_options(p, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.add_argument("session", type=session_id_arg, metavar="SESSION",
                   help="the session (the agent's root session id) the call is made in")
    p.add_argument("tool", metavar="TOOL", help="a tool name that `dsh-schedule catalog` lists")
    p.add_argument("args_json", nargs="?", metavar="ARGS_JSON",
                   help="the tool's arguments as a JSON object (default: {})")
    p.set_defaults(func=cmd_call)

    p = sub.add_parser("reminders", help="list the active reminders of every session, "
                       "read from the session logs")
    common_options(p, redis=False)
    reminders_arguments(p)

    p = sub.add_parser("worker", help="serve wakes (rq SimpleWorker)")
    common_options(p)
    metrics_flags(p)
    p.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("scheduler", help="move due wakes; rebuild and reconcile")
    common_options(p)
    metrics_flags(p)
    p.set_defaults(func=cmd_scheduler)
    p = sub.add_parser(
        "rebuild", help="wake every agent that holds a lease, once",
        description="Enqueue a wake for every agent that holds a lease, and retire the "
        "agents whose lease ended; prints {\"woken\":[...],\"retired\":[...]}. "
        "After Redis lost its keys (a flush, a restart without persistence) it is not "
        "needed and wakes nothing at first: each host finds the generation marker gone "
        "within a second (DSH_SCHEDULE_GENERATION_CHECK) and installs its agents anew, "
        "every new lease wakes its agent, and the scheduler rebuilds by itself once Redis is back. "
        "Run it when Redis kept the leases but lost wakes (a queue emptied or keys "
        "deleted by hand, an older snapshot restored). See docs/decisions.md, "
        "\"What rebuild is for\".")
    common_options(p, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.set_defaults(func=cmd_rebuild)

    for name, helptext in (
        ("demo", "the whole system on embedded defaults, as a timeline"),
        ("loadtest", "load test on the embedded Redis or a real one"),
    ):
        p = sub.add_parser(name, help=helptext)
        verbose_flag(p)
        logging_flags(p)
        if name == command:
            module = importlib.import_module(_ELSEWHERE[name])
            module.add_arguments(p)
            p.set_defaults(func=module.run)

    add_store_commands(sub, common_options, session_id_arg)

    p = sub.add_parser("host", help="run the reference host for sessions")
    common_options(p)
    metrics_flags(p)
    p.add_argument("sessions_to_host", nargs="*", type=session_id_arg, metavar="SESSION",
                   help="the sessions (root session ids) to serve")
    p.add_argument("--sessions-file", type=sessions_file_arg, default=[], metavar="FILE",
                   help="also serve the sessions listed in FILE, one id a line (no command "
                   "line limit: docs/architecture.md#leases; default: none)")
    p.add_argument("--all-sessions", action="store_true",
                   help="serve every session of the store on demand: load one when its "
                   "reminder falls due, let it go when idle (turns wake_unloaded on; "
                   "docs/architecture.md#unloaded-sessions)")
    p.add_argument("--unload-after", type=positive_seconds_arg, default=None, metavar="SECONDS",
                   help="with --all-sessions, let a session go after this many idle "
                   "seconds (default: DSH_SCHEDULE_UNLOAD_AFTER, else 300)")
    p.set_defaults(func=cmd_host)

    p = sub.add_parser("web", help="the web console: watch and drive reminders in a browser "
                       "(embedded without a Redis URL)")
    common_options(p, sessions_help="session log directory (default: DSH_SCHEDULE_SESSIONS; "
            "embedded without either: a scratch directory removed at exit)")
    p.add_argument("--port", type=port_arg, default=8321, metavar="PORT",
                   help="the port to listen on (default: 8321; 0: any free port)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="the address to listen on (default: 127.0.0.1); one that is not "
                   "loopback needs --token or --allow-remote (docs/web.md#access)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a name (NAME or NAME:PORT) the Host header may carry besides the "
                   "loopback names and the bound address, e.g. the name a proxy or DNS "
                   "gives the console; repeatable. Any other Host is answered 421 "
                   "(default: none)")
    p.add_argument("--token", metavar="TOKEN",
                   help="require this token (16 characters at least) on every request: "
                   "'Authorization: Bearer TOKEN', or the cookie signing in at /login sets "
                   "(default: DSH_SCHEDULE_WEB_TOKEN, which keeps it out of the process "
                   "list; none: no token)")
    p.add_argument("--allow-remote", action="store_true",
                   help="serve a non-loopback --bind without a token: everyone who can "
                   "reach it reads and drives every session")
    p.set_defaults(func=cmd_web)

    p = sub.add_parser("status", help="live agents, wakes, followups, workers and the "
                       "scheduler heartbeat")
    common_options(p, sessions=False, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--next", type=count_arg, default=5, metavar="N",
                   help="how many of the next scheduled wakes to show (default: 5)")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("health", help="exit 0 when the scheduler heartbeat is fresh and "
                       "every queue with live agents (and the one --queue names) has a "
                       "worker, else 1 saying why")
    common_options(p, sessions=False, redis_wait_s=ONE_SHOT_REDIS_WAIT_S)
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
    """Run the command ``argv`` names; its exit status. Output cut short by a reader that
    went away (``dsh-schedule status | head -1``) ends the command quietly with
    ``EXIT_CLOSED_OUTPUT``, whatever the command, ``--help`` included."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, not at exit, where a closed pipe is a traceback
    except BrokenPipeError:
        # Whatever is still buffered goes nowhere; the interpreter's last flush succeeds.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_OUTPUT


def _run(argv: Sequence[str] | None) -> int:
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
