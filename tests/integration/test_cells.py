"""Two cells on one machine (docs/scale-out.md#cells): each a redis-server this test starts
with its own ``dsh-schedule host``, ``worker`` and ``scheduler`` processes and its own
sessions directory, configured alike but for the Redis URL and the host group's queue.

Each cell delivers its own reminders exactly once, and nothing of one cell reaches the
other's Redis: a reader of each server's MONITOR feed records every command the server
runs, and no command on one server names an agent or the queue of the other cell. Then
one agent moves from cell A to cell B the way
docs/scale-out.md#moving-an-agent-to-another-cell says: its host crashes with a reminder
dispatched and not yet delivered (or, on a slow machine, due and not yet dispatched), its
lease in A runs out, its log moves to B's directory, and a host of B opens it. Every
reminder of that agent is delivered exactly once, the undelivered one by cell B; cell B
heard of it only from the move on, and cell A ends up holding nothing of it.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis

from dsh_schedule.shared.core.events import SessionHeader
from dsh_schedule.shared.store.jsonl import JsonlStore
from tests.redis_server import RedisServer
from tests.support import (
    Processes,
    delivered_counts,
    dispatch_counts,
    process_env,
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROAMER = "roamer"  # the agent that moves from cell A to cell B
OWN = {"a": ("cell-a-0", "cell-a-1"), "b": ("cell-b-0", "cell-b-1")}
TIMINGS = {
    "LEASE_TTL": "4",
    "LEASE_RENEW": "1",
    "LOCK_TTL": "2",
    "MAINTENANCE_TTL": "2",
    "MOVER_INTERVAL": "0.1",
    "RECONCILE_INTERVAL": "1",
}
HOSTS = b"dsh-schedule:hosts"  # the default prefix, the same in both cells
AGENT_HOST = b"dsh-schedule:agent-host"
LEASE_QUEUE = b"dsh-schedule:lease-queue"
DUPLICATE_WATCH_S = 2.0  # a second delivery would show up in this time
WAIT_S = 30.0


def _needles(name: str) -> tuple[bytes, bytes]:
    """How a command can name an agent or a queue: as text, or hex-encoded in a wake id."""
    return name.encode(), name.encode().hex().encode()


class Monitor:
    """Every command one redis-server runs, as its MONITOR feed gives them: lines of
    ``+<server time> [<db> <client>] "<command>" "<arg>" ...``."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.sendall(b"MONITOR\r\n")
        self._sock.settimeout(0.2)
        self.lines: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = b""
        while not self._stop.is_set():
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            *whole, pending = (pending + chunk).split(b"\r\n")
            self.lines.extend(line for line in whole if line != b"+OK")

    def drain(self, client: redis.Redis) -> bool:
        """Wait until every command the server ran so far has been read: until a marker
        sent now comes back through the feed."""
        marker = f"monitor-drain-{uuid.uuid4().hex}"
        client.echo(marker)
        return wait_until(lambda: any(marker.encode() in line for line in self.lines[-50:]),
                          timeout=10)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def naming(self, name: str, *, before: float | None = None) -> list[bytes]:
        """The commands that name ``name`` (run before ``before``, server time, if given)."""
        needles = _needles(name)
        return [line for line in self.lines
                if any(needle in line for needle in needles)
                and (before is None or float(line[1:].split(b" ", 1)[0]) < before)]


class Cell:
    """One cell: its Redis, its sessions directory and its processes."""

    def __init__(self, name: str, server: RedisServer, root: Path) -> None:
        self.name = name
        self.queue = f"cell-{name}"
        self.server = server
        self.client: redis.Redis = server.client()
        self.sessions = root / "sessions"
        self.sessions.mkdir(parents=True)
        self.store = JsonlStore(self.sessions)
        self.procs = Processes(root, process_env(server.url(), self.sessions,
                                                 queue=self.queue, **TIMINGS))
        self.monitor = Monitor(server.port or 0)

    def create_sessions(self, *session_ids: str) -> None:
        for session_id in session_ids:
            self.store.create(SessionHeader(id=session_id, createdAt=time.time_ns() // 10**6))

    def start(self, *sessions: str) -> None:
        self.procs.spawn("worker", "worker")
        self.procs.spawn("scheduler", "scheduler")
        self.procs.spawn("host", "host", *sessions)

    def live(self) -> set[str]:
        """The agents served by a host whose lease this cell's Redis holds, unexpired by
        the wall clock (the clock the hosts grant leases by and the workers check them
        with; docs/architecture.md#leases)."""
        now_ms = time.time_ns() // 10**6
        hosts = {member for member in
                 self.client.zrangebyscore(HOSTS, f"({now_ms}", "+inf")}
        return {agent.decode() for agent, host in self.client.hgetall(AGENT_HOST).items()
                if host in hosts}

    def holds_anything_of(self, agent: str) -> bool:
        """Whether any key name, or a lease (the agent-host hash, a host's served set, the
        lease-queue hash), names ``agent``."""
        needles = _needles(agent)
        named = any(needle in key for key in self.client.scan_iter(count=1000)
                    for needle in needles)
        leased = bool(self.client.hexists(AGENT_HOST, agent)) or any(
            self.client.sismember(key, agent)
            for key in self.client.scan_iter(match=b"dsh-schedule:served:*"))
        return named or leased or bool(self.client.hexists(LEASE_QUEUE, agent))

    def remind(self, session: str, after_seconds: int, prompt: str) -> dict[str, Any]:
        """``schedule_create`` through ``dsh-schedule call`` on this cell."""
        args = {"prompt": prompt, "after_seconds": after_seconds}
        result = self.procs.run("call", session, "schedule_create", json.dumps(args))
        assert result.returncode == 0, result.stdout + result.stderr
        answer: dict[str, Any] = json.loads(result.stdout)
        assert "scheduledAt" in answer, answer
        return answer

    def delivered(self, session: str) -> Counter[str]:
        return delivered_counts(self.store, session)

    def dispatched(self, session: str) -> Counter[str]:
        return dispatch_counts(self.store, session)

    def close(self) -> None:
        self.procs.close()
        self.monitor.close()
        self.client.close()
        self.store.close()


@pytest.fixture
def cells(tmp_path: Path) -> Iterator[dict[str, Cell]]:
    with RedisServer() as redis_a, RedisServer() as redis_b:
        made: dict[str, Cell] = {}
        try:
            for name, server in (("a", redis_a), ("b", redis_b)):
                made[name] = Cell(name, server, tmp_path / f"cell-{name}")
            yield made
        finally:
            for cell in made.values():
                cell.close()


def _describe(*cells: Cell) -> str:
    return "\n".join(f"=== cell {cell.name}\n{cell.procs.describe()}" for cell in cells)


def test_two_cells_deliver_their_own_reminders_and_an_agent_moves_between_them(
    cells: dict[str, Cell],
) -> None:
    a, b = cells["a"], cells["b"]
    # given two cells, each serving its own agents (A also the roamer) with its processes
    a.create_sessions(*OWN["a"], ROAMER)
    b.create_sessions(*OWN["b"])
    a.start(*OWN["a"], ROAMER)
    b.start(*OWN["b"])
    assert wait_until(lambda: a.live() == {*OWN["a"], ROAMER} and b.live() == set(OWN["b"]),
                      timeout=WAIT_S), _describe(a, b)

    # when every agent is given a reminder through its own cell
    asks = [(a, session) for session in (*OWN["a"], ROAMER)] + [(b, s) for s in OWN["b"]]
    with ThreadPoolExecutor(len(asks)) as pool:
        list(pool.map(lambda ask: ask[0].remind(ask[1], 2, f"first for {ask[1]}"), asks))

    # then each cell delivers its own, exactly once
    once = Counter({"schedule-1": 1})
    assert wait_until(lambda: all(cell.delivered(s) == once for cell, s in asks),
                      timeout=WAIT_S), _describe(a, b)

    # when the roamer's host crashes with its next reminder dispatched (or about to be)
    # and not delivered ...
    a.remind(ROAMER, 3, "second for the roamer")
    a.procs.send("host", signal.SIGSTOP)
    assert wait_until(lambda: a.dispatched(ROAMER)["schedule-2"] == 1
                      or ROAMER not in a.live(), timeout=WAIT_S), _describe(a)
    a.procs.kill("host")
    # ... its lease in A runs out, A's host comes back without it ...
    assert wait_until(lambda: ROAMER not in a.live(), timeout=WAIT_S), _describe(a)
    a.procs.spawn("host", "host", *OWN["a"])
    # ... its log moves to B's sessions directory, and a host of B opens it
    a.store.path(ROAMER).rename(b.store.path(ROAMER))
    b.procs.procs["host"].send_signal(signal.SIGTERM)
    assert b.procs.procs["host"].wait(15) == 0, _describe(b)
    opened_in_b = time.time()
    b.procs.spawn("host", "host", *OWN["b"], ROAMER)

    # then cell B delivers the reminder A had left undelivered, exactly once ...
    assert wait_until(lambda: b.delivered(ROAMER)["schedule-2"] == 1,
                      timeout=WAIT_S), _describe(a, b)
    # ... and the reminders made in B from now on
    b.remind(ROAMER, 1, "third for the roamer")
    assert wait_until(lambda: b.delivered(ROAMER)["schedule-3"] == 1,
                      timeout=WAIT_S), _describe(a, b)
    # and cell A lets go of everything it held for the roamer
    assert wait_until(lambda: not a.holds_anything_of(ROAMER), timeout=WAIT_S), _describe(a)
    time.sleep(DUPLICATE_WATCH_S)
    every = Counter({"schedule-1": 1, "schedule-2": 1, "schedule-3": 1})
    assert b.delivered(ROAMER) == b.dispatched(ROAMER) == every
    for cell, session in asks:
        if session != ROAMER:
            assert cell.delivered(session) == cell.dispatched(session) == once, session
    assert a.live() == set(OWN["a"]) and b.live() == {*OWN["b"], ROAMER}
    assert not a.procs.dead() and not b.procs.dead(), _describe(a, b)
    # (every process stops cleanly, and each feed is read up to the last command)
    for cell in (a, b):
        assert set(cell.procs.close().values()) == {0}, _describe(cell)
        assert cell.monitor.drain(cell.client), f"cell {cell.name}'s MONITOR feed stalled"

    # and no command on either Redis named an agent or the queue of the other cell; the
    # roamer reached B's Redis only once a host of B opened it
    for here, there in ((a, b), (b, a)):
        for name in (*OWN[there.name], there.queue):
            assert here.monitor.naming(name) == [], f"cell {here.name}'s Redis saw {name}"
        for name in (*OWN[here.name], here.queue):  # while it saw its own
            assert here.monitor.naming(name), f"cell {here.name}'s Redis never saw {name}"
        assert not any(here.holds_anything_of(name) for name in OWN[there.name])
    assert b.monitor.naming(ROAMER, before=opened_in_b) == []
    assert b.monitor.naming(ROAMER), "cell B's Redis never saw the roamer"
    for cell in (a, b):
        assert cell.procs.check(cell.sessions).returncode == 0
