"""What every ``dsh-schedule`` subcommand shares: exit codes, the error that is one line
on stderr, settings from the arguments, waiting for Redis, and the argument types
(docs/architecture.md#processes-and-cli).

Imports neither Redis nor rq at module level: the commands that need them import them
when they run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from dsh_schedule.shared.settings import Settings

if TYPE_CHECKING:
    pass

EXIT_UNHEALTHY: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_TOOL_ERROR: Final = 3
EXIT_CLOSED_OUTPUT: Final = 141  # as a shell reports a command SIGPIPE ended: 128 + 13
ONE_SHOT_REDIS_WAIT_S: Final = 5.0
REDIS_PROBE_TIMEOUT_S: Final = 1.0
OPS_SOCKET_TIMEOUT_S: Final = 5.0


class CommandError(Exception):
    """Input or an environment the command cannot use: one line on stderr, exit 2."""


def settings_of(args: argparse.Namespace) -> Settings:
    sessions = getattr(args, "sessions", None)
    return Settings.from_env(
        redis_url=getattr(args, "redis", None),
        # --sessions DIR is --store DIR: an explicit one wins over DSH_SCHEDULE_STORE.
        store=getattr(args, "store", None) or (None if sessions is None else str(sessions)),
        sessions=sessions,
        queue=getattr(args, "queue", None),
        prefix=getattr(args, "prefix", None),
        metrics_port=getattr(args, "metrics_port", None),
        metrics_addr=getattr(args, "metrics_addr", None),
    )


def serve_metrics(settings: Settings, command: str) -> None:
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


def require_redis(settings: Settings, command: str) -> str:
    if not settings.redis_url:
        raise CommandError(
            f"{command}: a Redis URL is required (--redis or DSH_SCHEDULE_REDIS_URL); "
            "an embedded Redis is private to one process"
        )
    return settings.redis_url


def await_redis(url: str, wait_s: float | None, *, verbose: bool) -> None:
    """Return once Redis at ``url`` answers; CommandError when it did not within
    ``wait_s`` seconds (None waits for ever). A bounded wait is quiet unless verbose."""
    from dsh_schedule.shared.coordination import outage
    from dsh_schedule.shared.coordination.connection import connect, location

    try:
        client = connect(
            url,
            socket_connect_timeout=REDIS_PROBE_TIMEOUT_S,
            socket_timeout=REDIS_PROBE_TIMEOUT_S,
        )
        where = location(url)
    except ValueError:
        raise CommandError(
            "the Redis URL is not usable (it starts with redis://, rediss://, unix:// or "
            "redis+sentinel:// and names a numeric port and database)"
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
            f"Redis at {where} did not answer within {exc.waited_s:g} s "
            "(--redis-wait)"
        ) from None
    except outage.RedisAuthFailed:
        raise CommandError(
            f"Redis at {where}: authentication failed ({outage.AUTH_HINT})"
        ) from None
    finally:
        startup_log.removeFilter(drop)
        client.close()


def dump(value: Any) -> None:
    """``value`` as one line of compact JSON, safe to print (ids from Redis may hold what
    JSON leaves raw: ``terminal_json``)."""
    from dsh_schedule.terminal import terminal_json

    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    sys.stdout.write(terminal_json(text) + "\n")


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


def instant_arg(text: str) -> int:
    try:
        return rfc3339_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} {exc}") from None


def seconds_arg(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return seconds


def port_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port from 0 to 65535")
    return int(text)


def count_arg(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 10_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 0 to 10000")
    return int(text)


SHOWN_ID_CHARS: Final = 40  # how much of a refused id an error line repeats


def session_id_rule() -> str:
    """The store's one rule for a session id (``shared/store/ids.py``), in words."""
    from dsh_schedule.shared.store.ids import MAX_ESCAPED_LENGTH

    return (f"a session id is a non-empty UTF-8 string that fits one file name: at most "
            f"{MAX_ESCAPED_LENGTH} bytes once each byte other than a-z, 0-9, '_' and '-' "
            "is written as 3 (docs/architecture.md#session-logs)")


def shown_id(text: str) -> str:
    """An id as an error line repeats it: escaped for the terminal, quoted, and cut
    short when long."""
    from dsh_schedule.terminal import terminal_text

    cut = text if len(text) <= SHOWN_ID_CHARS else text[:SHOWN_ID_CHARS]
    more = "" if cut is text else f"… ({len(text)} characters)"
    return f"'{terminal_text(cut)}'{more}"


def session_id_arg(text: str) -> str:
    """A session id the store accepts: the one rule every subcommand taking an id goes
    through, so a bad one is an argument error (one line, exit 2) before anything runs."""
    from dsh_schedule.shared.store.ids import escape_session_id

    try:
        escape_session_id(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{shown_id(text)} is not a session id: {session_id_rule()}"
        ) from None
    return text


def tool_args(text: str | None) -> Any:
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
