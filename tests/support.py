"""Small test helpers shared by the integration tests, and a harness of real
``dsh-schedule`` processes for the outage and chaos tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import Followups, Pair
from dsh_schedule.shared.coordination.phase import AgentPhase
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, SessionHeader
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.store.port import SessionStore
from tests import switched
from tests.redis_server import free_port

T0 = parse_instant("2026-12-01T12:00:00.000Z")


class FakeClock:
    """An injectable wall clock in epoch milliseconds."""

    def __init__(self, now_ms: int = T0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        self.now_ms += int(seconds * 1000)


def new_session(store: SessionStore, session_id: str = "s1", time_zone: str | None = None) -> str:
    store.create(SessionHeader(id=session_id, createdAt=T0, timeZone=time_zone))
    return session_id


def value(content: str) -> Any:
    return json.loads(content)


def append_raw_line(path: Path, obj: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(obj) + "\n")


def reminder_messages(store: SessionStore, session: str) -> list[dict[str, Any]]:
    """The data of every reminder ``user/message`` delivered into the session."""
    return [
        e.data for e in store.read(session).events
        if e.type == USER_MESSAGE and e.data["source"].get("plugin") == "tool-schedule"
    ]


def reminder_texts(store: SessionStore, session: str) -> list[str]:
    """The framing text of every reminder delivered into the session."""
    return [m["content"][0]["text"] for m in reminder_messages(store, session)]


def dispatch_records(store: SessionStore, session: str) -> list[dict[str, Any]]:
    """Every ``schedule/change`` dispatch record in the session log."""
    return [
        e.data for e in store.read(session).events
        if e.type == SCHEDULE_CHANGE and e.data["operation"] == "dispatch"
    ]


# -- real dsh-schedule processes (outage and chaos tests) --------------------------------


def delivered_counts(store: SessionStore, session: str) -> Counter[str]:
    """How many delivered reminder ``user/message`` events name each schedule id."""
    return Counter(
        pair["scheduleId"]
        for message in reminder_messages(store, session)
        for pair in message["source"].get("reminders") or []
    )


def dispatch_counts(store: SessionStore, session: str) -> Counter[str]:
    """How many dispatch records each schedule id has in the session log."""
    return Counter(record["id"] for record in dispatch_records(store, session))


def wait_until(condition: Callable[[], bool], timeout: float = 20.0,
               interval: float = 0.1) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def process_env(redis_url: str, sessions: Path, **settings: str) -> dict[str, str]:
    """The environment of ``dsh-schedule`` processes: this Redis and sessions directory,
    then ``DSH_SCHEDULE_<NAME>`` for each keyword (``LEASE_TTL="6"`` and so on). A run with
    the lifecycle on (tests/switched.py) passes its switch on unless a keyword names it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env.update(DSH_SCHEDULE_REDIS_URL=redis_url, DSH_SCHEDULE_SESSIONS=str(sessions))
    if switched.lifecycle_suite():
        env[switched.SWITCH] = "on"
    env.update({f"DSH_SCHEDULE_{name.upper()}": value for name, value in settings.items()})
    return env


class Processes:
    """Named ``dsh-schedule`` subprocesses of one test, each logging to its own file.

    A name keeps its command, so ``restart`` runs it again (with a fresh log file) after a
    kill. ``close`` resumes stopped processes and ends all of them.
    """

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, list[str]] = {}
        self.extra_env: dict[str, dict[str, str]] = {}
        self.logs: dict[str, list[Path]] = {}

    def spawn(self, name: str, *args: str,
              env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``dsh-schedule <args>`` as ``name``; ``env`` adds to the shared
        environment for this name (kept for ``restart``)."""
        self.commands[name] = list(args)
        if env is not None:
            self.extra_env[name] = env
        logs = self.logs.setdefault(name, [])
        log_path = self.root / f"{name}-{len(logs)}.log"
        logs.append(log_path)
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dsh_schedule", *args],
                env={**self.env, **self.extra_env.get(name, {})}, stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[name] = proc
        return proc

    def restart(self, name: str) -> subprocess.Popen[bytes]:
        self.kill(name)
        return self.spawn(name, *self.commands[name])

    def kill(self, name: str) -> None:
        """SIGKILL (a crash); waits for the process to be gone."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def send(self, name: str, sig: signal.Signals) -> None:
        """Send a signal (SIGSTOP, SIGCONT, ...) to a running process."""
        if self.procs[name].poll() is None:
            self.procs[name].send_signal(sig)

    def run(self, *args: str, timeout: float = 60.0,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """One ``dsh-schedule`` command to completion, output captured; ``env`` adds to
        the shared environment."""
        return subprocess.run([sys.executable, "-m", "dsh_schedule", *args],
                              env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    def dead(self) -> dict[str, int]:
        """The exit code of every named process that is no longer running."""
        return {name: code for name, proc in self.procs.items()
                if (code := proc.poll()) is not None}

    def log_tail(self, name: str, lines: int = 30) -> str:
        text = self.logs[name][-1].read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def log_summary(self, name: str, lines: int = 6) -> str:
        """The project's own traceback frames and the last lines of a process's log."""
        text = self.logs[name][-1].read_text(encoding="utf-8", errors="replace").splitlines()
        own = list(dict.fromkeys(  # each of the project's frames once, in order
            line.strip() for line in text if line.lstrip().startswith('File "')
            and "site-packages" not in line and "/lib/python3" not in line))
        return "\n".join([*(f"  at {frame}" for frame in own[-16:]), *text[-lines:]])

    def describe_dead(self) -> str:
        """The exit code and log summary of each process that died, for assertion messages."""
        return "\n".join(f"--- {name} exited {code}:\n{self.log_summary(name)}"
                         for name, code in self.dead().items())

    def describe(self) -> str:
        """The state and log summary of every process, for assertion messages."""
        parts = []
        for name, proc in self.procs.items():
            code = proc.poll()
            state = "running" if code is None else f"exited {code}"
            parts.append(f"--- {name} ({state}, {len(self.logs[name])} start(s)):\n"
                         f"{self.log_summary(name)}")
        return "\n".join(parts)

    def close(self) -> dict[str, int | None]:
        """SIGTERM every process (resuming stopped ones); exit codes, None if killed."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[name] = None
        return codes

    def check(self, sessions: Path) -> subprocess.CompletedProcess[str]:
        """``dsh-schedule check`` on every session log under ``sessions``."""
        return self.run("check", *sorted(str(p) for p in sessions.glob("*.jsonl")))


def refuse_writes(client: redis.Redis, how: str) -> Callable[[], None]:
    """Make the test's own Redis refuse writes the way ``how`` names (``OOM``,
    ``NOREPLICAS``, ``READONLY``); returns the undo."""
    if how == "OOM":
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        return lambda: client.config_set("maxmemory", 0)
    if how == "NOREPLICAS":
        client.config_set("min-replicas-to-write", 1)
        return lambda: client.config_set("min-replicas-to-write", 0)
    if how == "READONLY":  # a failover made it a replica of a master that is not there
        client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        return lambda: client.execute_command("REPLICAOF", "NO", "ONE")
    raise ValueError(how)


def add_followup(followups: Followups, agent: str, text: str, pairs: Sequence[Pair]) -> str:
    """A followup written as a worker writes it: the entry, then the agent announced on
    the ready stream of the queue its lease names. The entry id."""
    entry_id = followups.add([(agent, text, pairs)])[0]
    followups.announce([agent])
    return entry_id


def phase_holder(phase: AgentPhase, agent: str) -> str | None:
    """Who holds the agent's phase (``<kind>:<token>``; None: free), read from Redis."""
    value = phase._client.get(phase._keys.phase(agent))
    return value.decode() if isinstance(value, bytes) else None


def unloaded_timer(coord: Coordination, queue: str, session: str) -> int | None:
    """The session's timer on ``queue`` in epoch ms (None: none), read from Redis."""
    score = coord.client.zscore(coord.keys.unloaded(queue), session)
    return None if score is None else round(float(score))
