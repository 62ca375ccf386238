"""All tunables in one frozen object, built from flags and the environment
(docs/architecture.md#timings)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.requests import DEFAULT_MAX_PROMPT_BYTES

# The reconcile pass's sweep reaches every live agent within this many seconds at most.
MAX_SWEEP_PERIOD_S = 30 * 86_400.0
# The prompt limit a deployment may set, at most: many prompts go out in one reminder
# batch's line, which a session log bounds (docs/architecture.md#session-logs).
MAX_PROMPT_BYTES_CEILING: Final = 1024 * 1024
# The cap a deployment may set on a session's active records, at most.
MAX_ACTIVE_CEILING: Final = 1_000_000
_MAX_ACTIVE_RANGE: Final = f"max_active must be a whole number from 1 to {MAX_ACTIVE_CEILING}"
_PROMPT_LIMIT_RANGE: Final = (
    f"max_prompt_bytes must be a whole number of bytes from 1 to {MAX_PROMPT_BYTES_CEILING}")


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    redis_url: str | None = None
    sessions: Path = Path("sessions")
    # The session store: a directory (the JSONL store; then ``sessions`` is that directory)
    # or a ``postgresql://`` URL (docs/architecture.md#session-logs); None: ``sessions``.
    store: str | None = None
    prefix: str = "dsh-schedule:"
    queue: str = "dsh-schedule"
    lock_ttl_s: float = 30.0
    tool_lock_wait_s: float = 10.0
    wake_lock_wait_s: float = 2.0
    maintenance_ttl_s: float = 30.0
    turn_ttl_s: float = 60.0
    turn_renew_s: float = 20.0
    lease_ttl_s: float = 60.0
    lease_renew_s: float = 20.0
    mover_interval_s: float = 1.0
    reconcile_interval_s: float = 30.0
    early_sleep_s: float = 2.0
    # What one JSONL store keeps of the sessions it served, in MiB of accounted bytes.
    cache_mb: int = 256
    # Confirm a batch of session files with one file system sync where it can be trusted.
    syncfs: bool = True
    sweep_period_s: float = 7 * 86_400.0
    followup_stale_s: float = 30.0
    # ``health`` fails once a job has waited in a queue with live agents this long
    # (docs/architecture.md#operations).
    wake_wait_alarm_s: float = 60.0
    # Prometheus metrics of the worker, scheduler and host processes: off unless a port is
    # set (docs/architecture.md#operations).
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    # The longest prompt schedule_create accepts, in bytes of UTF-8 after trimming; logs
    # holding longer ones still replay (docs/decisions.md#tool-arguments).
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    # Offer calendar rules (the cron selector) to schedule_create; reading them never
    # needs it (docs/decisions.md#calendar-rules).
    calendar: bool = False
    # Offer the lifecycle (schedule_update, pause and resume, end conditions, the cap per
    # session); reading its records never needs it
    # (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders).
    lifecycle: bool = False
    # With the lifecycle on: the most active records a session may hold; a create past it
    # answers limit_exceeded.
    max_active: int = 100
    # How often a host checks the generation marker and retries owed re-arms
    # (docs/architecture.md#the-generation-marker).
    generation_check_s: float = 1.0
    # A process whose wall clock is further than this off Redis's says so once (log,
    # metric, health); its decisions read Redis's clock whatever it says
    # (docs/decisions.md#one-clock-for-every-decision).
    max_clock_skew_s: float = 1.0
    # A host's watchdog looks at an agent whose due moment passed this long ago and repairs
    # what Redis lost of it when something is still overdue
    # (docs/architecture.md#repairing-lost-keys).
    repair_after_s: float = 120.0
    # Sessions no host has loaded keep a timer, and a host group is asked to load one
    # whose timer falls due (docs/architecture.md#unloaded-sessions). Off: the specified
    # session-local delivery, byte for byte.
    wake_unloaded: bool = False
    # How many sessions one host loads at once on request.
    load_concurrency: int = 8
    # A load request no host answered is announced again after this, doubling each time
    # up to ``load_retry_max_s``.
    load_retry_s: float = 10.0
    load_retry_max_s: float = 600.0
    # A host serving every session disposes of one idle this long.
    unload_after_s: float = 300.0

    def __post_init__(self) -> None:
        if self.store is not None and not _is_database_url(self.store):
            msgspec.structs.force_setattr(self, "sessions", Path(self.store))
        if not 1 <= self.max_prompt_bytes <= MAX_PROMPT_BYTES_CEILING:
            raise ValueError(_PROMPT_LIMIT_RANGE + f", got {self.max_prompt_bytes!r}")
        if not 1 <= self.max_active <= MAX_ACTIVE_CEILING:
            raise ValueError(_MAX_ACTIVE_RANGE + f", got {self.max_active!r}")
        if self.load_concurrency < 1:
            raise ValueError(f"load_concurrency must be a whole number >= 1, "
                             f"got {self.load_concurrency!r}")
        if self.sweep_period_s > MAX_SWEEP_PERIOD_S:
            raise ValueError(
                f"sweep_period_s must be at most {MAX_SWEEP_PERIOD_S:g} seconds, "
                f"got {self.sweep_period_s!r}"
            )

    @property
    def store_name(self) -> str:
        """The session store: its ``postgresql://`` URL, or the JSONL directory."""
        return self.store if self.store is not None else str(self.sessions)

    @property
    def store_shown(self) -> str:
        """``store_name`` as a message may show it: a URL without its password."""
        name = self.store_name
        if not _is_database_url(name):
            return name
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(name)
        host = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username
        netloc = f"{user}@{host}" if user else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Defaults, then the ``DSH_SCHEDULE_*`` variables (one per field,
        ``environment_name``), then explicit non-None overrides."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for field, var in environment_names().items():
            if env.get(var):
                values[field] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "sessions" in values:
            values["sessions"] = Path(str(values["sessions"]))
        try:
            typed: dict[str, Any] = {k: _typed(k, v) for k, v in values.items()}
            return cls(**typed)
        except (TypeError, ValueError) as exc:
            raise SettingsError(str(exc)) from None


ENV_PREFIX: Final = "DSH_SCHEDULE_"


def _is_database_url(name: str) -> bool:
    return name.startswith(("postgresql://", "postgres://"))


def environment_name(field: str) -> str:
    """The variable a ``Settings`` field is read from: ``DSH_SCHEDULE_`` and the field's
    name in capitals, without its ``_s`` unit (``lease_ttl_s``: ``DSH_SCHEDULE_LEASE_TTL``)."""
    return ENV_PREFIX + field.removesuffix("_s").upper()


def environment_names() -> dict[str, str]:
    """Every ``Settings`` field and the variable it is read from, in field order."""
    return {field.name: environment_name(field.name)
            for field in msgspec.structs.fields(Settings)}


def calendar_from_env(env: Mapping[str, str] | None = None) -> bool:
    """``DSH_SCHEDULE_CALENDAR`` alone, for a command that needs no other setting (such as
    ``catalog``); SettingsError when it is not on or off."""
    return _switch_from_env("calendar", env)


def lifecycle_from_env(env: Mapping[str, str] | None = None) -> bool:
    """``DSH_SCHEDULE_LIFECYCLE`` alone, as ``calendar_from_env`` reads its switch."""
    return _switch_from_env("lifecycle", env)


def _switch_from_env(field: str, env: Mapping[str, str] | None) -> bool:
    env = os.environ if env is None else env
    name = environment_name(field)
    if not env.get(name):
        return False
    try:
        return bool(_typed(field, env[name]))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


_SWITCH: Final = {"on": True, "true": True, "1": True, "yes": True,
                  "off": False, "false": False, "0": False, "no": False}


class SettingsError(ValueError):
    """A setting from a flag or the environment has the wrong form."""


def _typed(field: str, value: object) -> object:
    if field == "metrics_port":
        text = str(value).strip()
        if not (text.isdigit() and 1 <= int(text) <= 65535):
            raise ValueError(f"metrics_port must be a TCP port from 1 to 65535, got {value!r}")
        return int(text)
    if field in ("syncfs", "calendar", "lifecycle", "wake_unloaded"):
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word not in _SWITCH:
            raise ValueError(f"{field} must be on or off, got {value!r}")
        return _SWITCH[word]
    if field == "max_prompt_bytes":
        text = str(value).strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(_PROMPT_LIMIT_RANGE + f", got {value!r}")
        return int(text)
    if field == "max_active":
        text = str(value).strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(_MAX_ACTIVE_RANGE + f", got {value!r}")
        return int(text)
    if field == "load_concurrency":
        text = str(value).strip()
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            raise ValueError(f"load_concurrency must be a whole number >= 1, got {value!r}")
        return int(text)
    if field == "cache_mb":
        text = str(value).strip()
        if not text.isdigit():
            raise ValueError(f"cache_mb must be a whole number of MiB >= 0, got {value!r}")
        return int(text)
    if field.endswith("_s"):
        try:
            number = float(str(value))
        except ValueError:
            number = float("nan")
        if not number > 0:
            raise ValueError(f"{field} must be a positive number of seconds, got {value!r}")
        return number
    return value


LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How a command logs (docs/architecture.md#operations): the line format, the level
    of our own loggers, and the level of rq's and rq-scheduler's loggers (None: the same
    level). Read apart from ``Settings`` so that a command which needs no other setting
    is not stopped by an unrelated malformed variable."""

    format: str = "text"
    level: str = "INFO"
    rq_level: str | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, **overrides: str | None
    ) -> LogSettings:
        """Defaults, then ``DSH_SCHEDULE_LOG_FORMAT``, ``DSH_SCHEDULE_LOG_LEVEL`` and
        ``DSH_SCHEDULE_RQ_LOG_LEVEL``, then explicit non-None overrides; SettingsError
        for an unknown format or level."""
        env = os.environ if env is None else env
        values: dict[str, str] = {}
        names = {
            "DSH_SCHEDULE_LOG_FORMAT": "format",
            "DSH_SCHEDULE_LOG_LEVEL": "level",
            "DSH_SCHEDULE_RQ_LOG_LEVEL": "rq_level",
        }
        for var, field in names.items():
            if env.get(var):
                values[field] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        fmt = values.get("format", "text").strip().lower()
        if fmt not in LOG_FORMATS:
            raise SettingsError(
                f"log format must be one of {', '.join(LOG_FORMATS)}, got {values['format']!r}"
            )
        level = _level(values.get("level", "INFO"), "log level")
        rq_level = values.get("rq_level")
        return cls(
            format=fmt,
            level=level,
            rq_level=None if rq_level is None else _level(rq_level, "rq log level"),
        )


def _level(value: str, what: str) -> str:
    name = value.strip().upper()
    if name == "WARN":
        name = "WARNING"
    if name not in LOG_LEVELS:
        raise SettingsError(f"{what} must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return name
