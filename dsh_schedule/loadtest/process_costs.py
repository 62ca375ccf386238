"""What processes cost, read from ``/proc``: CPU time and resident memory of a pid, and the
redis-server's pid and counters from ``INFO``.

CPU time is ``utime + stime`` of ``/proc/<pid>/stat`` (every thread of the process, in
clock ticks); memory is ``VmRSS`` (resident now) and ``VmHWM`` (the peak resident size)
of ``/proc/<pid>/status``. The redis-server is found by ``INFO server`` ``process_id``;
when that pid is not a redis-server on this machine (a Redis elsewhere), its CPU time is
read from ``INFO cpu`` instead, and the figure says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import redis

PROC: Final = Path("/proc")
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ProcessMemory(msgspec.Struct, frozen=True, kw_only=True):
    rss_bytes: int | None
    hwm_bytes: int | None


def parse_stat_cpu_ticks(text: str) -> int:
    """``utime + stime`` (clock ticks) of a ``/proc/<pid>/stat`` line.

    The command name (field 2) is in parentheses and may hold spaces or parentheses, so
    the fields are counted from the last ``)``: utime and stime are fields 14 and 15.
    ValueError when the line has no such fields.
    """
    close = text.rfind(")")
    if close < 0:
        raise ValueError("not a /proc/<pid>/stat line")
    fields = text[close + 1:].split()
    # fields[0] is field 3 (state): utime is field 14, stime field 15.
    if len(fields) < 13:
        raise ValueError("a /proc/<pid>/stat line too short")
    return int(fields[11]) + int(fields[12])


def parse_status_memory(text: str) -> ProcessMemory:
    """``VmRSS`` and ``VmHWM`` of a ``/proc/<pid>/status`` text, in bytes (None when the
    process has no such line, as a zombie has not)."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            parts = value.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else "kb"
                found[name] = int(parts[0]) * (1024 if unit == "kb" else 1)
    return ProcessMemory(rss_bytes=found.get("VmRSS"), hwm_bytes=found.get("VmHWM"))


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds the process has used so far (user + system, every thread); None when
    it is gone or not readable."""
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
        return parse_stat_cpu_ticks(text) / CLOCK_TICKS
    except (OSError, ValueError):
        return None


def memory(pid: int) -> ProcessMemory:
    try:
        text = (PROC / str(pid) / "status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return ProcessMemory(rss_bytes=None, hwm_bytes=None)
    return parse_status_memory(text)


def command_name(pid: int) -> str | None:
    try:
        return (PROC / str(pid) / "comm").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def redis_server_pid(client: redis.Redis) -> int | None:
    """The pid of the redis-server behind ``client`` when it runs on this machine (its
    ``INFO server`` ``process_id`` names a process called redis-server here), else None."""
    info: Any = client.info("server")
    pid = info.get("process_id")
    if not isinstance(pid, int):
        return None
    name = command_name(pid)
    return pid if name is not None and name.startswith("redis-server") else None


def redis_info_cpu_seconds(client: redis.Redis) -> float:
    """The server's own CPU seconds (``INFO cpu``: ``used_cpu_sys + used_cpu_user``)."""
    info: Any = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def redis_commands(client: redis.Redis) -> int:
    """``INFO stats`` ``total_commands_processed``: every command the server ran so far."""
    info: Any = client.info("stats")
    return int(info["total_commands_processed"])


def redis_command_calls(client: redis.Redis) -> dict[str, int]:
    """``INFO commandstats``: calls so far of each command (lower case, subcommands as
    ``xinfo|stream``)."""
    info: Any = client.info("commandstats")
    return parse_commandstats(info)


def parse_commandstats(info: Mapping[str, Any]) -> dict[str, int]:
    """Calls per command of a parsed ``INFO commandstats`` (``cmdstat_<name>`` entries)."""
    calls: dict[str, int] = {}
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, Mapping) and "calls" in value:
            calls[key.removeprefix("cmdstat_")] = int(value["calls"])
    return calls


class CpuReading(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    """``time.monotonic()`` of the reading."""
    cpu_s: dict[str, float | None]
    redis_cpu_s: float | None
    redis_commands: int
    own_commands: int
    """Commands this reading sent before its ``INFO stats`` (``INFO cpu``, or none)."""
    calls: dict[str, int] = msgspec.field(default_factory=dict)
    """Calls of each command so far (``INFO commandstats``, sent after ``INFO stats``)."""


class CpuWindowResult(msgspec.Struct, frozen=True, kw_only=True):
    seconds: float
    cores: dict[str, float | None]
    """CPU seconds per second of each process (``redis-server`` included)."""
    commands_per_s: float
    commands_by_type: dict[str, float]
    """Calls per second of each command, busiest first (the readings' ``INFO`` left out)."""


def cores_between(first: CpuReading, last: CpuReading) -> CpuWindowResult:
    """CPU seconds per second of every process between two readings, and Redis commands
    per second (the readings' own two INFO calls are not counted)."""
    seconds = last.at - first.at
    if seconds <= 0:
        raise ValueError("the second reading must come after the first")
    cores: dict[str, float | None] = {}
    for name, before in first.cpu_s.items():
        after = last.cpu_s.get(name)
        cores[name] = (None if before is None or after is None
                       else round(max(0.0, after - before) / seconds, 6))
    if first.redis_cpu_s is not None and last.redis_cpu_s is not None:
        cores["redis-server"] = round(max(0.0, last.redis_cpu_s - first.redis_cpu_s) / seconds,
                                      6)
    else:
        cores["redis-server"] = None
    # Not counted: the first reading's INFO stats and INFO commandstats (when it read
    # them), and what the last sent before its own INFO stats.
    own = 1 + (1 if first.calls else 0) + last.own_commands
    commands = max(0, last.redis_commands - first.redis_commands - own)
    by_type = {name: round((n - first.calls.get(name, 0)) / seconds, 2)
               for name, n in last.calls.items()
               if name != "info" and n > first.calls.get(name, 0)}
    return CpuWindowResult(seconds=round(seconds, 3), cores=cores,
                           commands_per_s=round(commands / seconds, 2),
                           commands_by_type=dict(sorted(by_type.items(),
                                                        key=lambda kv: (-kv[1], kv[0]))))


class CpuSampler:
    """Readings of the CPU time of named processes and of the redis-server."""

    def __init__(self, client: redis.Redis, pids: Mapping[str, int]) -> None:
        self._client = client
        self._pids = dict(pids)
        self.redis_pid = redis_server_pid(client)
        self.redis_source = "proc" if self.redis_pid is not None else "info"

    def read(self) -> CpuReading:
        cpu = {name: cpu_seconds(pid) for name, pid in self._pids.items()}
        if self.redis_pid is not None:
            redis_cpu, own = cpu_seconds(self.redis_pid), 0
        else:
            redis_cpu, own = redis_info_cpu_seconds(self._client), 1
        commands = redis_commands(self._client)
        return CpuReading(at=time.monotonic(), cpu_s=cpu, redis_cpu_s=redis_cpu,
                          redis_commands=commands, own_commands=own,
                          calls=redis_command_calls(self._client))
