"""What idle agents cost: a reference host serving N idle agents, and one reconcile pass.

Not a test (nothing here asserts a timing): a measurement to run by hand, on a private
``redis-server`` it starts and stops itself::

    .venv/bin/python -m tests.bench.idle_hosts --agents 1000 2000 --window 40

For each N it prints one JSON line: the host process's CPU seconds per second of
``ReferenceHost.run`` (default settings: leases renewed every 20 s, so a 40 s window holds
two renewals), Redis commands per second and redis-server CPU over the same window, and
what one scheduler pass costs (its own CPU seconds and Redis commands, the agents it
woke, and the CPU seconds a worker then spends on those wakes, run here in process on
sessions in memory) — the rebuild, and, where the code has it, the incremental reconcile
pass 30 s later.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import redis

from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler import process as scheduler_process
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.worker.due import DueOwner
from tests.redis_server import RedisServer
from tests.support import new_session


def _redis_totals(client: redis.Redis) -> tuple[int, float]:
    stats: Any = client.info("stats")
    cpu: Any = client.info("cpu")
    return int(stats["total_commands_processed"]), float(cpu["used_cpu_user"]) + float(
        cpu["used_cpu_sys"]
    )


def measure_host(server: RedisServer, agents: int, window_s: float, warmup_s: float
                 ) -> dict[str, Any]:
    client = server.client()
    client.flushdb()
    settings = Settings(redis_url=server.url(), prefix=f"idle{agents}:", queue=f"idle{agents}")
    store = MemoryStore()
    host = ReferenceHost(store, Coordination(client, settings), settings)
    for i in range(agents):
        host.open_root(new_session(store, f"idle-{i:05d}"))
    stop = threading.Event()
    thread = threading.Thread(target=host.run, args=(stop,), daemon=True)
    thread.start()
    time.sleep(warmup_s)
    probe = server.client()
    commands_0, redis_cpu_0 = _redis_totals(probe)
    cpu_0, wall_0 = time.process_time(), time.monotonic()
    time.sleep(window_s)
    cpu_1, wall_1 = time.process_time(), time.monotonic()
    commands_1, redis_cpu_1 = _redis_totals(probe)
    stop.set()
    thread.join(30)
    wall = wall_1 - wall_0
    return {
        "agents": agents,
        "window_s": round(wall, 1),
        "host_cpu_s_per_s": round((cpu_1 - cpu_0) / wall, 4),
        "redis_commands_per_s": round((commands_1 - commands_0 - 2) / wall, 1),
        "redis_server_cpu_s_per_s": round((redis_cpu_1 - redis_cpu_0) / wall, 4),
    }


def measure_scheduler(server: RedisServer, agents: int) -> dict[str, Any]:
    """One rebuild, then (when the code has one) an incremental reconcile pass 30 s later,
    over ``agents`` idle live agents."""
    client = server.client()
    client.flushdb()
    settings = Settings(redis_url=server.url(), prefix=f"sched{agents}:",
                        queue=f"sched{agents}")
    coord = Coordination(client, settings)
    store = MemoryStore()
    names = [new_session(store, f"idle-{i:05d}") for i in range(agents)]
    now = int(time.time() * 1000)
    for name in names:
        coord.leases.grant(name, settings.queue, now_ms=now, ttl_s=3600)
    owner = DueOwner(store, coord, settings, clock=lambda: now)
    result: dict[str, Any] = {"agents": agents}

    def one(label: str, run: Any) -> None:
        commands_0, _ = _redis_totals(client)
        cpu_0 = time.process_time()
        report = run()
        cpu_1 = time.process_time()
        commands_1, _ = _redis_totals(client)
        woken = list(report.woken)
        for start in range(0, len(woken), 100):
            owner.wake([(agent, None) for agent in woken[start : start + 100]])
        cpu_2 = time.process_time()
        result[label] = {"cpu_s": round(cpu_1 - cpu_0, 4),
                         "redis_commands": commands_1 - commands_0 - 2,
                         "woken": len(woken), "worker_cpu_s": round(cpu_2 - cpu_1, 4)}

    reconciler_class = getattr(scheduler_process, "Reconciler", None)
    if reconciler_class is None:
        one("rebuild_pass", lambda: scheduler_process.rebuild(coord, settings, now_ms=now))
    else:
        reconciler = reconciler_class(coord, settings)
        one("rebuild_pass", lambda: reconciler.rebuild(now_ms=now))
        one("reconcile_pass", lambda: reconciler.reconcile(now_ms=now + 30_000))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    args = parser.parse_args()
    with RedisServer() as server:
        for agents in args.agents:
            print(json.dumps({"host": measure_host(server, agents, args.window, args.warmup)}),
                  flush=True)
            print(json.dumps({"scheduler": measure_scheduler(server, agents)}), flush=True)


if __name__ == "__main__":
    main()
