"""The arq peer's processes (``loadtest --peers``), run as a script: ``python peer_arq.py``.

    DSH_SCHEDULE_REDIS_URL=... python peer_arq.py worker QUEUE
    DSH_SCHEDULE_REDIS_URL=... python peer_arq.py schedule QUEUE JOBS

``worker``: a stock ``arq.worker.Worker`` (its defaults: ``max_jobs`` 10, ``poll_delay``
0.5 s) on the arq queue ``QUEUE``, running one function, ``append``: one fsynced line
``{"due": .., "ran": ..}`` in a per-agent file, the same minimum durable delivery as the
rq peers' job (``dsh_schedule.loadtest.peers.delivered_line``). Results are not kept;
SIGTERM stops it (arq's own handler). ``schedule``: enqueue one ``append`` job per line of
the file ``JOBS`` (``job id, directory, agent, due ms`` separated by tabs) with
``_defer_until`` the due instant, and exit.

This file imports nothing of the project, only the standard library and arq: arq pins
``redis<6``, so it may live beside, not in, the project's environment (the load test's
``--arq-path``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# arq is optional (the [bench] extra) and may be missing where the project is type-checked.
from arq.connections import (  # type: ignore[import-not-found, unused-ignore]
    RedisSettings,
    create_pool,
)
from arq.worker import Worker, func  # type: ignore[import-not-found, unused-ignore]

BATCH = 500


async def append(ctx: dict[str, Any], directory: str, agent: str, due_ms: int) -> None:
    """The peer's delivery: one fsynced line in ``<directory>/<agent>.jsonl``."""
    line = json.dumps({"due": due_ms, "ran": time.time_ns() // 1_000_000},
                      separators=(",", ":")).encode() + b"\n"
    fd = os.open(Path(directory) / f"{agent}.jsonl",
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


async def schedule(url: str, queue: str, jobs: Path) -> None:
    rows = [line.split("\t") for line in jobs.read_text(encoding="utf-8").splitlines() if line]
    pool = await create_pool(RedisSettings.from_dsn(url))
    try:
        for start in range(0, len(rows), BATCH):
            await asyncio.gather(*(pool.enqueue_job(
                "append", directory, agent, int(due), _job_id=job_id, _queue_name=queue,
                _defer_until=datetime.fromtimestamp(int(due) / 1000, UTC))
                for job_id, directory, agent, due in rows[start:start + BATCH]))
    finally:
        await pool.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    url = os.environ.get("DSH_SCHEDULE_REDIS_URL")
    if not url or not ((len(args) == 2 and args[0] == "worker")
                       or (len(args) == 3 and args[0] == "schedule")):
        print("usage: DSH_SCHEDULE_REDIS_URL=... python peer_arq.py worker QUEUE | "
              "schedule QUEUE JOBS", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    if args[0] == "schedule":
        asyncio.run(schedule(url, args[1], Path(args[2])))
        return 0
    worker = Worker([func(append, name="append", keep_result=0)], queue_name=args[1],
                    redis_settings=RedisSettings.from_dsn(url), keep_result=0,
                    health_check_key=f"{args[1]}:health-check", log_results=False)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
