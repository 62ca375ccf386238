"""The bare libraries alone: what rq, rq-scheduler and an fsynced append cost without us.

The jobs here run inside real ``dsh-schedule worker`` processes (rq imports them by path),
beside the wakes, so every figure of the load test has a bare counterpart measured on the
same machine, Redis and workers:

- a create: one rq-scheduler ``enqueue_at`` plus one fsynced JSONL line append;
- a dispatch: one no-op job run by a ``SimpleWorker``;
- a delivery: a job scheduled at a whole second, moved by the same mover loop, that marks
  when it ran;
- a re-arm: a job whose only work is one ``enqueue_at``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from rq import get_current_job

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.mover import PrefixedScheduler
from dsh_schedule.shared.core.instant import to_datetime

NOOP: Final = "dsh_schedule.loadtest.baseline.noop"
MARK: Final = "dsh_schedule.loadtest.baseline.mark"
REARM: Final = "dsh_schedule.loadtest.baseline.rearm"
JOB_TIMEOUT_S: Final = 120

_schedulers: dict[str, PrefixedScheduler] = {}


def noop() -> None:
    """The bare dispatch: a job that does nothing."""


def mark(stream: str, due_ms: int) -> None:
    """The bare delivery: note in a stream (server time in the entry id) when the job ran."""
    job = get_current_job()
    assert job is not None
    job.connection.xadd(stream, {"due": str(due_ms)})


def rearm(prefix: str, queue: str, job_id: str, target_ms: int) -> None:
    """The bare re-arm: schedule one no-op job with rq-scheduler."""
    job = get_current_job()
    assert job is not None
    scheduler_for(prefix, job.connection).enqueue_at(
        to_datetime(target_ms), NOOP, job_id=job_id, job_result_ttl=0, job_ttl=None,
        timeout=JOB_TIMEOUT_S, queue_name=queue,
    )


def scheduler_for(prefix: str, connection: object) -> PrefixedScheduler:
    """One rq-scheduler per prefix and process (as the wake projection keeps one)."""
    scheduler = _schedulers.get(prefix)
    if scheduler is None:
        scheduler = PrefixedScheduler(Keys(prefix), connection=connection)
        _schedulers[prefix] = scheduler
    return scheduler


def fsynced_append(path: Path, line: bytes) -> None:
    """The bare durable log write: open, append one line, fsync, close."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def bare_create(scheduler: PrefixedScheduler, queue: str, path: Path, job_id: str,
                target_ms: int) -> None:
    """What a create costs the libraries alone: ``enqueue_at`` plus one fsynced append."""
    scheduler.enqueue_at(
        to_datetime(target_ms), NOOP, job_id=job_id, job_result_ttl=0, job_ttl=None,
        timeout=JOB_TIMEOUT_S, queue_name=queue,
    )
    fsynced_append(path, b'{"type":"bare","job":"%s"}\n' % job_id.encode())
