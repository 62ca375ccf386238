"""Log lines as text or JSON, with the agent, schedule and wake they concern
(docs/architecture.md#operations).

``configure`` installs one handler on the root logger, so our loggers and rq's and
rq-scheduler's all go through the same formatter; rq's loggers get their own level
(``LogSettings.rq_level``), so their per-job lines can be quieted without quieting ours.

``log_context(agent=…, wake_id=…)`` names what the code in its block works on;
``add_log_context(schedule_id=…)`` adds to it once known. The names live in a context
variable (per thread), and every line logged meanwhile carries them: as JSON keys, or as a
``[agent=… wake_id=…]`` suffix of a text line. The due transaction binds ``agent`` and the
rq job id as ``wake_id``, the tool calls ``agent`` (and ``schedule_id`` once decided), the
host bridge ``agent`` while it delivers.

Imports no Redis or rq: the CLI configures logging for every command.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import Final, TextIO

import msgspec

from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.settings import LogSettings

CONTEXT_FIELDS: Final = ("agent", "schedule_id", "wake_id")
RQ_LOGGERS: Final = ("rq", "rq.worker", "rq.job", "rq.queue", "rq_scheduler")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# logging's own rendering of ``asctime``: ``2026-12-01 09:10:00,123``, local time.
_TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"
_MSEC_FORMAT: Final = "%s,%03d"

# Every value of a JSON line is a string.
_LINE_ENCODER: Final = msgspec.json.Encoder()

_EMPTY: Final[Mapping[str, str]] = {}
_context: ContextVar[Mapping[str, str]] = ContextVar("dsh_schedule_log_context", default=_EMPTY)


class log_context:  # noqa: N801 (used as a function: ``with log_context(agent=…):``)
    """Lines logged in this block (in this thread) carry ``fields`` (None values are left
    out), besides what an enclosing block set. A plain class, not a generator: it is
    entered once per tool call and per wake."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: str | None) -> None:
        self._fields = fields
        self._token: Token[Mapping[str, str]] | None = None

    def __enter__(self) -> None:
        fields = {k: v for k, v in self._fields.items() if v}
        self._token = _context.set({**_context.get(), **fields})

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _context.reset(self._token)
            self._token = None


def add_log_context(**fields: str | None) -> None:
    """Add ``fields`` to the innermost ``log_context`` block, until it ends."""
    _context.set({**_context.get(), **{k: v for k, v in fields.items() if v}})


class JsonFormatter(logging.Formatter):
    """One compact JSON object per line: ``time`` (UTC, to the millisecond), ``level``,
    ``logger``, ``message``, then ``agent``, ``schedule_id`` and ``wake_id`` where known,
    and ``exception`` (the traceback text) when the line carries one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": format_instant(int(record.created) * 1000 + int(record.msecs)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        try:
            return _LINE_ENCODER.encode(line).decode()
        except UnicodeEncodeError:
            # A lone surrogate (a name decoded with surrogateescape, say) is not UTF-8:
            # the standard library writes it as it is, for the stream's error handler.
            return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """The plain line, with `` [agent=… schedule_id=… wake_id=…]`` where known."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        """logging's own local time (``2026-12-01 09:10:00,123``), its date and time
        rendered once per second: a busy worker logs a line per dispatch."""
        whole = int(record.created)
        second, text = self._second
        if second != whole:
            text = time.strftime(_TIME_FORMAT, self.converter(whole))
            self._second = (whole, text)
        return _MSEC_FORMAT % (text, record.msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        text = super().formatMessage(record)
        fields = _fields(record)
        if not fields:
            return text
        return text + " [" + " ".join(f"{k}={v}" for k, v in fields.items()) + "]"


def _fields(record: logging.LogRecord) -> dict[str, str]:
    """The context of a line: what its block bound, or what it was given as ``extra``."""
    context = _context.get()
    found: dict[str, str] = {}
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None) or context.get(name)
        if value:
            found[name] = str(value)
    return found


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the handler ``configure`` installed, so a second call replaces it."""


def configure(options: LogSettings, *, level: str | None = None,
              stream: TextIO | None = None) -> None:
    """Send every log line to ``stream`` (default stderr) in ``options.format``, our
    loggers at ``level`` (default ``options.level``), rq's at ``options.rq_level`` (default
    the same). Replaces a handler an earlier call installed.

    No line of this process's formats names its caller, thread or process, so records
    are made without looking those up (the logging HOWTO's "Optimization"): a worker
    logs a line per dispatch and a host one per delivery (docs/decisions.md#logging)."""
    logging._srcfile = None  # no findCaller
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _Handler):
            root.removeHandler(handler)
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if options.format == "json" else TextFormatter())
    root.addHandler(handler)
    level = level or options.level
    root.setLevel(level)
    for name in RQ_LOGGERS:
        logging.getLogger(name).setLevel(options.rq_level or level)


def rq_level_name() -> str:
    """The level rq's worker logger is set to (what ``worker.work`` should keep)."""
    return logging.getLevelName(logging.getLogger("rq.worker").getEffectiveLevel())
