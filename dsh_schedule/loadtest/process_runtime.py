"""The load test on a real Redis (``RedisRuntime``): real ``dsh-schedule worker`` and
``scheduler`` subprocesses under a prefix and queue of its own, with the hosts in this
process or in a host process of their own (``start_host``), and, for the bare-library
figures, a plain rq-scheduler process and stock rq workers. It deletes only what it wrote
(its prefixed keys, the rq keys of its queues and its jobs), except in a database it
verified empty and owns.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import msgspec
import redis
from rq import Queue

from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.loadtest.baseline import NOOP, scheduler_for
from dsh_schedule.loadtest.process_costs import memory
from dsh_schedule.loadtest.runtime import HOST_POLL_S, POLL_S, LoadtestError, until
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.jsonl import JsonlStore

# A host process forgets its agents in Redis when it stops (a thousand at a time, well
# under a second for 10,000); the run deletes its keys anyway, so a host that takes
# longer than this is killed.
HOST_STOP_S: Final = 10.0


class RedisRuntime:
    """Real worker (and, when asked, scheduler) processes on a real Redis."""

    mode = "redis"

    def __init__(self, url: str, sessions: Path, *, prefix: str, queue: str, workers: int,
                 logs: Path, tags: tuple[str, ...], owns_db: bool = False,
                 store: str | None = None) -> None:
        """``store``: the session store the settings and child processes name
        (``DSH_SCHEDULE_STORE``, such as a ``postgresql://`` URL) in place of ``sessions``;
        ``self.store``, which the phases write directly, stays the JSONL store there."""
        self.settings = Settings.from_env({}, redis_url=url, sessions=sessions,
                                          prefix=prefix, queue=queue, store=store)
        self.store = JsonlStore(sessions)
        self.client = redis.Redis.from_url(url)
        self.url = url
        self.workers = workers
        self.deadline = math.inf
        self._logs = logs
        self._tags = tags
        self._owns_db = owns_db
        self._env = _child_env(url, sessions, prefix, queue)
        if store is not None:
            self._env["DSH_SCHEDULE_STORE"] = store
        self._workers: list[subprocess.Popen[bytes]] = []
        self._pools: list[subprocess.Popen[bytes]] = []
        self._queues = [queue]
        self._scheduler: subprocess.Popen[bytes] | None = None
        # Processes started by role (a host, a bare scheduler), and stock rq workers.
        self._named: dict[str, subprocess.Popen[bytes]] = {}
        self._bare_workers: list[subprocess.Popen[bytes]] = []
        self._bare_queue: str | None = None
        self._spawned = 0
        self._closed = False
        if owns_db and self.client.dbsize():
            raise LoadtestError(
                f"Redis database {self.client.connection_pool.connection_kwargs.get('db')} "
                "is not empty; the rebuild figure flushes a database of its own "
                "(choose another with --rebuild-db)")

    # -- processes ------------------------------------------------------------------

    def start_workers(self) -> None:
        for _ in range(self.workers):
            self._workers.append(self._spawn("worker", self.settings.queue))
        self._await_workers(self.settings.queue, self.workers)

    def _await_workers(self, queue: str, count: int, timeout_s: float = 60.0) -> None:
        registered = f"rq:workers:{queue}"
        if not self._wait(lambda: int(self.client.scard(registered)) >= count, timeout_s):
            raise LoadtestError("the worker processes did not start; see " + str(self._logs))

    def _stop_workers(self, queue: str, procs: list[subprocess.Popen[bytes]]) -> None:
        """Stop worker processes and delete the registrations rq leaves to expire."""
        keys = [k.decode() if isinstance(k, bytes) else k
                for k in self.client.smembers(f"rq:workers:{queue}")]
        for proc in procs:
            _stop(proc)
            if proc in self._pools:
                self._pools.remove(proc)
        if keys:
            self.client.delete(*keys)

    def start_mover(self, timeout_s: float = 60.0) -> None:
        """Start the ``scheduler`` process; returns once it moved a probe job."""
        if self._scheduler is not None and self._scheduler.poll() is None:
            return
        self._scheduler = self._spawn("scheduler", self.settings.queue)
        self._await_probe(self.settings.prefix, self.settings.queue, timeout_s,
                          "the scheduler process")

    def stop_mover(self) -> None:
        self.stop_scheduler()

    def stop_scheduler(self) -> None:
        if self._scheduler is not None:
            _stop(self._scheduler)
            self._scheduler = None

    def _spawn(self, command: str, queue: str) -> subprocess.Popen[bytes]:
        """A ``dsh-schedule <command>`` process on ``queue``."""
        return self._launch(command, ["-m", "dsh_schedule", command], queue)

    def _launch(self, name: str, args: Sequence[str], queue: str,
                env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        self._logs.mkdir(parents=True, exist_ok=True)
        self._spawned += 1
        with (self._logs / f"{name}-{self._spawned}.log").open("ab") as log:
            return subprocess.Popen([sys.executable, *args],
                                    env={**self._env, "DSH_SCHEDULE_QUEUE": queue,
                                         **(env or {})},
                                    stdout=log, stderr=subprocess.STDOUT)

    def start_host(self, sessions: Sequence[str]) -> None:
        """Start the ``dsh-schedule host`` command for ``sessions`` in a process of its own
        (through ``dsh_schedule.loadtest.host``, which reads the ids from a file: a command
        line holds only so many)."""
        self._logs.mkdir(parents=True, exist_ok=True)
        ids = self._logs / f"host-{self._spawned + 1}-sessions.txt"
        ids.write_text("".join(f"{s}\n" for s in sessions), encoding="utf-8")
        self._named["host"] = self._launch(
            "host", ["-m", "dsh_schedule.loadtest.host", str(ids)], self.settings.queue)

    def start_named(self, role: str, args: Sequence[str],
                    env: Mapping[str, str] | None = None) -> None:
        """Start ``python <args>`` (with ``env`` added to the children's environment) as
        the process in ``role`` (see ``pids``), stopped when the runtime closes: the peers'
        worker processes."""
        self._named[role] = self._launch(role, args, self.settings.queue, env)

    def wake_unloaded(self) -> None:
        """Turn ``DSH_SCHEDULE_WAKE_UNLOADED`` on here and in the processes started next."""
        self._env["DSH_SCHEDULE_WAKE_UNLOADED"] = "on"
        self.settings = msgspec.structs.replace(self.settings, wake_unloaded=True)

    def child_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of this runtime's child processes, with ``extra``."""
        return {**self._env, "DSH_SCHEDULE_QUEUE": self.settings.queue, **(extra or {})}

    def start_bare_scheduler(self, prefix: str, queue: str, timeout_s: float = 60.0) -> None:
        """Start rq-scheduler's own loop (``Scheduler.run``, no code of ours) with its keys
        under ``prefix``, at the mover interval, moving jobs onto ``queue``; returns once it
        moved a probe job (run by whatever serves ``queue``)."""
        self._named["scheduler"] = self._launch(
            "bare-scheduler", ["-m", "dsh_schedule.loadtest.bare_scheduler", prefix,
                               str(self.settings.mover_interval_s)], queue)
        self._await_probe(prefix, queue, timeout_s, "the bare rq-scheduler process")

    def start_bare_workers(self, queue: str, count: int) -> None:
        """``count`` stock rq ``SimpleWorker`` processes (``python -m rq.cli worker``)."""
        if self._bare_queue is not None or self._workers:
            raise LoadtestError("stock rq workers run in a runtime of their own")
        self._queues.append(queue)
        self._bare_queue = queue
        url = self._env["DSH_SCHEDULE_REDIS_URL"]
        for _ in range(count):
            self._bare_workers.append(self._launch(
                "bare-worker", ["-m", "rq.cli", "worker", "--url", url, "--worker-class",
                                "rq.worker.SimpleWorker", "--logging_level", "WARNING",
                                queue], queue))
        self._await_workers(queue, count)

    def pids(self) -> dict[str, int]:
        """Every process this runtime runs now, by role: host, worker-N, scheduler."""
        return {role: proc.pid for role, proc in self._by_role().items()}

    def exited(self) -> dict[str, int]:
        """The exit code of each process of ``pids`` that is no longer running: what a
        measurement on this runtime reports beside its figures (``tests/bench/store_burst``,
        whose figures docs/benchmarks.md cites)."""
        return {role: code for role, proc in self._by_role().items()
                if (code := proc.poll()) is not None}

    def _by_role(self) -> dict[str, subprocess.Popen[bytes]]:
        named: dict[str, subprocess.Popen[bytes]] = {}
        if "host" in self._named:
            named["host"] = self._named["host"]
        for i, proc in enumerate([*self._workers, *self._bare_workers]):
            named[f"worker-{i + 1}"] = proc
        if self._scheduler is not None:
            named["scheduler"] = self._scheduler
        for name, proc in self._named.items():
            named.setdefault(name, proc)
        return named

    def rss(self, role: str) -> tuple[int | None, int | None]:
        """(VmRSS, VmHWM) in bytes of the process in ``role`` (see ``pids``)."""
        pid = self.pids().get(role)
        if pid is None:
            return None, None
        found = memory(pid)
        return found.rss_bytes, found.hwm_bytes

    def stop(self, role: str) -> None:
        """Stop a process started by name (a host gets ``HOST_STOP_S``, then is killed)."""
        proc = self._named.pop(role, None)
        if proc is not None:
            _stop(proc, HOST_STOP_S if role == "host" else 15.0)

    def sleep(self, seconds: float) -> None:
        """Wait, checking only that the child processes still run (no Redis command)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._check_processes()
            time.sleep(min(0.5, left))

    def wait(self, done: Callable[[], bool], timeout_s: float,
             status: Callable[[], None] | None = None, poll_s: float = 0.5) -> bool:
        """``done()`` every ``poll_s`` until it is true (False at timeout or deadline)."""
        deadline = until(timeout_s, self.deadline)
        while not done():
            self._check_processes()
            if time.monotonic() > deadline:
                return False
            if status is not None:
                status()
            time.sleep(poll_s)
        return True

    def _await_probe(self, prefix: str, queue: str, timeout_s: float, what: str) -> None:
        probe = f"{self._tags[0]}-probe-{time.monotonic_ns()}"
        scheduler = scheduler_for(prefix, self.client)
        scheduler.enqueue_at(datetime.now(UTC) - timedelta(seconds=2), NOOP, job_id=probe,
                             job_result_ttl=0, queue_name=queue)
        key = scheduler.scheduled_jobs_key
        if not self._wait(lambda: self.client.zscore(key, probe) is None, timeout_s):
            raise LoadtestError(f"{what} did not start; see {self._logs}")

    def _check_processes(self) -> None:
        running = [*self._workers, *self._pools, *([self._scheduler] if self._scheduler else []),
                   *self._named.values(), *self._bare_workers]
        for proc in running:
            if proc.poll() is not None:
                raise LoadtestError(f"a child process exited ({proc.returncode}); "
                                    f"see {self._logs}")

    # -- running --------------------------------------------------------------------

    @contextmanager
    def pool(self, workers: int) -> Iterator[str]:
        if workers == self.workers:
            yield self.settings.queue
            return
        queue = f"{self.settings.queue}-w{workers}"
        self._queues.append(queue)
        procs = [self._spawn("worker", queue) for _ in range(workers)]
        self._pools.extend(procs)
        try:
            self._await_workers(queue, workers)
            yield queue
        finally:
            self._stop_workers(queue, procs)

    def move_due(self) -> int:
        from dsh_schedule.shared.coordination.agents import Coordination

        return Coordination(self.client, self.settings).wakes.move_due()

    def run_until(self, done: Callable[[], bool], timeout_s: float, *,
                  hosts: Sequence[ReferenceHost] = (),
                  status: Callable[[], None] | None = None) -> bool:
        stop = threading.Event()
        threads = [threading.Thread(target=host.run, args=(stop,),
                                    kwargs={"poll_s": HOST_POLL_S}, daemon=True)
                   for host in hosts]
        for thread in threads:
            thread.start()
        try:
            return self._wait(done, timeout_s, status)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)

    def _wait(self, done: Callable[[], bool], timeout_s: float,
              status: Callable[[], None] | None = None) -> bool:
        """``wait`` at the short poll the phases' own waits use."""
        return self.wait(done, timeout_s, status, poll_s=POLL_S)

    # -- cleaning up ----------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if "host" in self._named:  # first: a host would lease its agents again
            self.stop("host")
        for role in list(self._named):
            self.stop(role)
        self.stop_mover()
        self._stop_workers(self.settings.queue, self._workers)
        self._workers.clear()
        if self._bare_queue is not None:
            self._stop_workers(self._bare_queue, self._bare_workers)
            self._bare_workers.clear()
        if self._owns_db:
            self.client.flushdb()
        else:
            self.delete_own_keys()
        self.client.close()

    def delete_own_keys(self, *, at_once: bool = False) -> int:
        """Delete every key this run wrote: its prefix, its queues' rq keys, its jobs (those
        with ids of its own, and those rq named that are still in its queues or their
        registries, such as wakes a host triggered just before the end). ``at_once``: in
        one transaction, as a flush loses them (no process sees half of them gone)."""
        queues = [Queue(name, connection=self.client) for name in self._queues]
        jobs = {i for queue in queues for i in _job_ids(self.client, queue)}
        keys: set[bytes] = set()
        for tag in (self.settings.prefix, self.settings.queue, *self._tags):
            keys.update(self.client.scan_iter(match=f"*{_glob_escape(tag)}*", count=1000))
        for job_id in jobs:
            keys.update(k.encode() for k in (f"rq:job:{job_id}", f"rq:executions:{job_id}",
                                             f"rq:results:{job_id}"))
        with self.client.pipeline(transaction=at_once) as pipe:
            for batch in _batches(sorted(keys), 500):
                pipe.delete(*batch)
            pipe.srem("rq:queues", *(queue.key for queue in queues))
            pipe.execute()
        return len(keys)


def _job_ids(client: redis.Redis, queue: Queue) -> set[str]:
    """Ids of every job in ``queue``: waiting, between dequeue and start, or in one of its
    registries (read without rq's cleanup, which would move jobs between them)."""
    ids: set[str] = set(queue.get_job_ids())
    ids.update(_text(i) for i in client.lrange(queue.intermediate_queue_key, 0, -1))
    for registry in (queue.started_job_registry, queue.finished_job_registry,
                     queue.failed_job_registry, queue.deferred_job_registry,
                     queue.scheduled_job_registry, queue.canceled_job_registry):
        ids.update(registry.get_job_ids(cleanup=False))
    return ids


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value



def _child_env(url: str, sessions: Path, prefix: str, queue: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env.update(DSH_SCHEDULE_REDIS_URL=url, DSH_SCHEDULE_SESSIONS=str(sessions),
               DSH_SCHEDULE_PREFIX=prefix, DSH_SCHEDULE_QUEUE=queue)
    return env


def _stop(proc: subprocess.Popen[bytes], wait_s: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` of the same server."""
    parts = urlsplit(url)
    query = [q for q in parts.query.split("&") if q and not q.startswith("db=")]
    if parts.scheme == "unix":  # the path is the socket's; the database goes in the query
        return f"unix://{parts.netloc}{parts.path}?" + "&".join([*query, f"db={db}"])
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "&".join(query), ""))


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _batches(items: list[bytes], size: int) -> list[list[bytes]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
