"""The options many ``dsh-schedule`` subcommands share (dsh_schedule/cli/parser.py): logging,
metrics, the session store and Redis, each in its titled group, and the argument types
they read."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from dsh_schedule.cli.common import seconds_arg, session_id_arg
from dsh_schedule.shared.settings import LOG_LEVELS

# Each subcommand's --help lists its own options first, under "options", and the options
# many subcommands share once each, in these titled groups after them.
LOGGING_GROUP: Final = "logging (shared by the commands)"
CONNECTION_GROUP: Final = "sessions and Redis (shared by the commands)"


def option_group(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The parser's argument group titled ``title``, made on first use."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def verbose_flag(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    # After a subcommand the flag is accepted too, without resetting one given before it.
    target = parser if top else option_group(parser, LOGGING_GROUP)
    target.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging (same as --log-level DEBUG)",
                        default=False if top else argparse.SUPPRESS)


def _level_arg(text: str) -> str:
    name = text.strip().upper()
    name = "WARNING" if name == "WARN" else name
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a log level (one of {', '.join(LOG_LEVELS)})"
        )
    return name


def logging_flags(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, ``--log-level`` and ``--rq-log-level`` (over the
    ``DSH_SCHEDULE_LOG_*`` variables; docs/architecture.md#operations)."""
    group = option_group(parser, LOGGING_GROUP)
    group.add_argument("--log-format", choices=["text", "json"],
                       help="log lines as text or as one JSON object each "
                       "(default: DSH_SCHEDULE_LOG_FORMAT, else text)")
    group.add_argument("--log-level", type=_level_arg, metavar="LEVEL",
                       help="DEBUG, INFO, WARNING, ERROR or CRITICAL "
                       "(default: DSH_SCHEDULE_LOG_LEVEL, else INFO; -v is DEBUG)")
    group.add_argument("--rq-log-level", type=_level_arg, metavar="LEVEL",
                       help="the level of rq's own lines, e.g. WARNING to drop its lines "
                       "per job (default: DSH_SCHEDULE_RQ_LOG_LEVEL, else --log-level)")


def metrics_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics at /metrics on this port "
                        "(default: DSH_SCHEDULE_METRICS_PORT, else off)")
    parser.add_argument("--metrics-addr", metavar="ADDR",
                        help="the address the metrics endpoint binds "
                        "(default: DSH_SCHEDULE_METRICS_ADDR, else 0.0.0.0)")


STORE_HELP: Final = ("the session store: a directory (as --sessions) or a postgresql:// URL "
                     "(default: DSH_SCHEDULE_STORE, else the sessions directory)")
SESSIONS_HELP: Final = "session log directory (default: DSH_SCHEDULE_SESSIONS, else ./sessions)"


def common_options(parser: argparse.ArgumentParser, *, redis: bool = True, sessions: bool = True,
            redis_wait_s: float | None = None, sessions_help: str = SESSIONS_HELP) -> None:
    """The shared options, in the titled groups: logging, and the session directory
    (``sessions``) and Redis connection (``redis``) the command uses."""
    verbose_flag(parser)
    if redis:
        logging_flags(parser)
    group = option_group(parser, CONNECTION_GROUP)
    if sessions:
        group.add_argument("--sessions", type=Path, metavar="DIR", help=sessions_help)
        group.add_argument("--store", metavar="DIR|URL", help=STORE_HELP)
    if redis:
        group.add_argument("--redis", metavar="URL",
                           help="Redis URL (default: DSH_SCHEDULE_REDIS_URL)")
        group.add_argument("--queue", metavar="NAME",
                           help="rq queue name (default: DSH_SCHEDULE_QUEUE, else dsh-schedule)")
        group.add_argument("--prefix", metavar="PREFIX",
                           help="Redis key prefix (default: DSH_SCHEDULE_PREFIX, "
                           "else dsh-schedule:)")
        group.add_argument(
            "--redis-wait", type=seconds_arg, default=redis_wait_s, metavar="SECONDS",
            help="how long to wait at start-up for Redis to answer before exiting 2 "
            f"(default: {'for ever' if redis_wait_s is None else f'{redis_wait_s:g} s'})",
        )


def positive_seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def sessions_file_arg(path: str) -> list[str]:
    """The session ids of a file, one a line (blank lines skipped), each checked as a
    SESSION argument is."""
    try:
        with open(path, encoding="utf-8") as lines:
            return [session_id_arg(line.strip()) for line in lines if line.strip()]
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
