"""The peers a user would pick instead (``loadtest --peers``): arq deferred jobs and rq's own
scheduler, on the same Redis server, with as many worker processes as ours, in the same run.

Each peer runs in a runtime of its own (its queue and key names carry the runtime's tag,
so its keys are deleted when it closes):

- ``arq``: ``--workers`` stock arq worker processes (``loadtest.peer_arq``), jobs enqueued
  with ``_defer_until``;
- ``rq Worker`` / ``rq SimpleWorker``: ``--workers`` ``rq worker --with-scheduler``
  processes of the forking ``Worker`` class or of ``SimpleWorker``, jobs enqueued with
  rq's own ``Queue.enqueue_at`` (no rq-scheduler).

Every peer's job appends one fsynced line to a per-agent file (``delivered_line``): the
minimum durable delivery, like for like with ours. The burst figure is due -> job ran
(the job's wall clock, before its fsync); the idle figure is the CPU of the workers and of
the redis-server over a window (from ``/proc``), Redis commands per second, and Redis
bytes per pending job (``INFO memory`` ``used_memory`` after enqueuing N jobs less
before, over N).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
from rq import Queue

from dsh_schedule.loadtest.baseline import JOB_TIMEOUT_S, fsynced_append
from dsh_schedule.loadtest.figures import CpuWindow, PeerBurst, PeerIdle
from dsh_schedule.loadtest.process_runtime import RedisRuntime
from dsh_schedule.loadtest.runtime import LoadtestError
from dsh_schedule.loadtest.stats import Latency, Progress, latency
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.core.instant import to_datetime

RQ_APPEND: Final = "dsh_schedule.loadtest.peers.rq_append"
ARQ_SCRIPT: Final = Path(__file__).with_name("peer_arq.py")
_ARQ_HINT: Final = ("arq is the [bench] extra; it pins redis<6, so it may be installed "
                    "beside the project instead: pip install --target DIR 'arq>=0.26,<0.29' "
                    "and --arq-path DIR")
DAY_MS: Final = 86_400_000
PROBE_S: Final = 60.0
# The peers, in the order they run: (name, how their jobs are scheduled and run).
PEERS: Final = ("arq", "rq Worker", "rq SimpleWorker")
_RQ_CLASSES: Final = {"rq Worker": "rq.worker.Worker", "rq SimpleWorker": "rq.worker.SimpleWorker"}


class _Line(msgspec.Struct, frozen=True):
    due: int
    ran: int


def delivered_line(directory: str, agent: str, due_ms: int) -> None:
    """The peers' delivery: one fsynced line ``{"due": .., "ran": ..}`` appended to
    ``<directory>/<agent>.jsonl`` (``ran`` is the wall clock before the write)."""
    line = msgspec.json.encode(_Line(due=due_ms, ran=wall_clock_ms())) + b"\n"
    fsynced_append(Path(directory) / f"{agent}.jsonl", line)


def rq_append(directory: str, agent: str, due_ms: int) -> None:
    """The rq peers' job (rq imports it by path)."""
    delivered_line(directory, agent, due_ms)


def read_lines(directory: Path) -> list[int]:
    """Due -> ran (ms) of every line under ``directory``, probes left out."""
    found: list[int] = []
    for path in directory.glob("*.jsonl"):
        if path.name.startswith("probe"):
            continue
        for raw in path.read_bytes().splitlines():
            if raw.strip():
                line = msgspec.json.decode(raw, type=_Line)
                found.append(line.ran - line.due)
    return found


def _delivered(directory: Path) -> int:
    with os.scandir(directory) as entries:
        return sum(1 for e in entries if e.name.endswith(".jsonl")
                   and not e.name.startswith("probe"))


class Peer:
    """One peer on one runtime: its worker processes, and how it schedules a job."""

    def __init__(self, name: str, rt: RedisRuntime, workers: int, directory: Path,
                 arq_path: Path | None) -> None:
        self.name = name
        self.rt = rt
        self.workers = workers
        self.directory = directory
        self.queue = rt.settings.queue
        self.url = rt.url
        directory.mkdir(parents=True, exist_ok=True)
        self._rq = Queue(self.queue, connection=rt.client) if name != "arq" else None
        # The arq processes run peer_arq.py as a script, with arq_path first on their path.
        self._arq_env = {"PYTHONPATH": os.pathsep.join(
            [str(arq_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            } if arq_path is not None else {}
        self._jobs = 0

    def start(self) -> None:
        """Start the worker processes; returns once they ran a probe job due now."""
        for i in range(self.workers):
            if self.name == "arq":
                self.rt.start_named(f"worker-{i + 1}",
                                    ["-P", str(ARQ_SCRIPT), "worker", self.queue], self._arq_env)
            else:
                self.rt.start_named(f"worker-{i + 1}", [
                    "-m", "rq.cli", "worker", "--url", self.url, "--worker-class",
                    _RQ_CLASSES[self.name], "--with-scheduler", "--logging_level", "WARNING",
                    "--name", f"{self.queue}-{i + 1}", self.queue])
        probe = f"probe-{time.monotonic_ns()}"
        self.schedule([(probe, wall_clock_ms() - 1000)])
        if not self.rt.wait(lambda: (self.directory / f"{probe}.jsonl").exists(), PROBE_S,
                            poll_s=0.1):
            raise LoadtestError(f"the {self.name} workers did not run a probe job")

    def schedule(self, jobs: list[tuple[str, int]]) -> None:
        """Schedule one delivery job per (agent, due ms)."""
        if self._rq is not None:
            queue = self._rq
            for agent, due in jobs:
                queue.enqueue_at(to_datetime(due), RQ_APPEND, str(self.directory), agent, due,
                                 job_id=f"{self.queue}-{agent}", result_ttl=0, ttl=None,
                                 job_timeout=JOB_TIMEOUT_S)
            return
        self._jobs += 1
        listing = self.directory.parent / f"{self.directory.name}-jobs-{self._jobs}.tsv"
        listing.write_text("".join(f"{self.queue}-{agent}\t{self.directory}\t{agent}\t{due}\n"
                                   for agent, due in jobs), encoding="utf-8")
        done = subprocess.run([sys.executable, "-P", str(ARQ_SCRIPT), "schedule", self.queue,
                               str(listing)], env=self.rt.child_env(self._arq_env),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise LoadtestError(f"arq could not schedule the jobs ({_ARQ_HINT}): "
                                f"{done.stderr.strip()[-2000:]}")


PeerFactory = Callable[[str, int], RedisRuntime]


def _used_memory(rt: RedisRuntime) -> int:
    info: Any = rt.client.info("memory")
    return int(info["used_memory"])


def peers_idle(open_runtime: PeerFactory, n: int, workers: int, warmup_s: float,
               window_s: float, directory: Path, cpu_window: Callable[[RedisRuntime, float, int],
                                                                      CpuWindow],
               progress: Progress, arq_path: Path | None) -> list[PeerIdle]:
    """N far-future delivery jobs on each peer: bytes per pending job, then the cost of
    its workers and of Redis per second over a window after a warm-up."""
    found: list[PeerIdle] = []
    for i, name in enumerate(PEERS):
        progress.note(f"peer {name}: {n:,} far-future jobs, {workers} worker(s)")
        rt = open_runtime(f"pidle{i}", 0)
        try:
            peer = Peer(name, rt, workers, directory / f"idle-{i}", arq_path)
            base = wall_clock_ms() + DAY_MS
            before = _used_memory(rt)
            peer.schedule([(f"a{k}", base + (k % 3600) * 1000) for k in range(n)])
            after = _used_memory(rt)
            peer.start()
            rt.sleep(warmup_s)
            window = cpu_window(rt, window_s, n)
        finally:
            rt.close()
        found.append(PeerIdle(peer=name, jobs=n, workers=workers, ours=window,
                              bytes_per_job=round((after - before) / n, 1)))
        progress.note(f"peer {name}: {window.total_cores} cores, "
                      f"{window.commands_per_s:,.0f} Redis commands/s")
    return found


def _wait_delivered(rt: RedisRuntime, directory: Path, n: int, timeout_s: float,
                    progress: Progress) -> None:
    rt.wait(lambda: _delivered(directory) >= n, timeout_s, poll_s=0.2,
            status=lambda: progress.tick(f"{_delivered(directory):,}/{n:,} ran"))


def peers_burst(open_runtime: PeerFactory, n: int, workers: int, lead_s: float,
                directory: Path, progress: Progress, deadline_s: float,
                arq_path: Path | None) -> list[PeerBurst]:
    """N delivery jobs due in the same second on each peer: due -> job ran."""
    found: list[PeerBurst] = []
    for i, name in enumerate(PEERS):
        progress.note(f"peer {name}: {n:,} jobs due at once, {workers} worker(s)")
        rt = open_runtime(f"pburst{i}", 0)
        here = directory / f"burst-{i}"
        try:
            peer = Peer(name, rt, workers, here, arq_path)
            peer.start()
            watch = time.monotonic()
            probe_k = min(n, 200)
            far = wall_clock_ms() + DAY_MS
            peer.schedule([(f"p{k}", far) for k in range(probe_k)])
            per_s = probe_k / max(time.monotonic() - watch, 1e-3)
            due = (int((wall_clock_ms() + (lead_s + 1.5 * n / per_s) * 1000) // 1000) + 1) * 1000
            peer.schedule([(f"a{k}", due) for k in range(n)])
            slack_s = (due - wall_clock_ms()) / 1000
            _wait_delivered(rt, here, n, max(0.0, slack_s) + deadline_s, progress)
            ran = read_lines(here)
        finally:
            rt.close()
        lat: Latency = latency(ran)
        found.append(PeerBurst(peer=name, jobs=n, workers=workers, ran=len(ran),
                               slack_s=round(slack_s, 3), latency=lat))
        progress.note(f"peer {name}: p50 {lat.p50_ms} / p99 {lat.p99_ms} ms")
    return found
