"""``python -m dsh_schedule.loadtest.bare_scheduler PREFIX INTERVAL``: rq-scheduler alone.

The bare-library counterpart of the ``scheduler`` process: rq-scheduler's own
``Scheduler.run`` loop, no code of ours in it, every ``INTERVAL`` seconds (the load test
passes the mover interval), moving due jobs onto the queue of ``DSH_SCHEDULE_QUEUE``.
Its keys live under ``PREFIX`` (as ``PrefixedScheduler`` puts them), so it never touches
another scheduler's; the Redis is ``DSH_SCHEDULE_REDIS_URL``. SIGTERM stops it (rq-
scheduler's own handler).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import redis

from dsh_schedule.shared.coordination.keys import Keys


def bare_scheduler(prefix: str, queue: str, interval_s: float, connection: redis.Redis) -> Any:
    """A plain ``rq_scheduler.Scheduler`` whose keys are those of ``Keys(prefix)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from rq_scheduler import Scheduler
    warnings.filterwarnings("ignore", category=DeprecationWarning,
                            module=r"rq_scheduler(\..*)?")
    scheduler = Scheduler(queue_name=queue, interval=interval_s, connection=connection)
    keys = Keys(prefix)
    scheduler.scheduled_jobs_key = keys.scheduled_jobs()
    scheduler.scheduler_lock_key = keys.scheduler_lock()
    scheduler.scheduler_key = keys.scheduler()
    scheduler.redis_scheduler_namespace_prefix = keys.scheduler_instances()
    return scheduler


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    url, queue = os.environ.get("DSH_SCHEDULE_REDIS_URL"), os.environ.get("DSH_SCHEDULE_QUEUE")
    if len(args) != 2 or not url or not queue:
        print("usage: DSH_SCHEDULE_REDIS_URL=... DSH_SCHEDULE_QUEUE=... "
              "python -m dsh_schedule.loadtest.bare_scheduler PREFIX INTERVAL", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    scheduler = bare_scheduler(args[0], queue, float(args[1]), redis.Redis.from_url(url))
    try:
        scheduler.run()
    except SystemExit:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
