"""The whole system in one process, on the embedded Redis (docs/architecture.md#processes-and-cli).

A reference host, a due owner behind an rq ``SimpleWorker`` (fakeredis state is per
process, so nothing forks) and the rq-scheduler mover, stepped by one loop. The host
delivers as a deployed one does: for the agents the ready stream names, never by looking
at every agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from rq import Queue

from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler.process import RebuildReport, rebuild
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect_embedded
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.due import DueOwner
from dsh_schedule.worker.process import ScheduleWorker

log = logging.getLogger(__name__)


class EmbeddedSystem:
    def __init__(
        self,
        store: SessionStore,
        settings: Settings,
        *,
        clock: Callable[[], int],
        sleep: Callable[[float], None],
        client: redis.Redis | None = None,
        on_delivery: Callable[[str, Delivery], None] | None = None,
        injected_clock: bool = False,
    ) -> None:
        self.client = client if client is not None else connect_embedded()
        self.settings = settings
        self.store = store
        self.clock = clock
        self.coordination = Coordination(self.client, settings)
        self._on_delivery = on_delivery
        self.host = self._new_host()
        self.owner = DueOwner(store, self.coordination, settings, clock=clock, sleep=sleep)
        self.queue = Queue(settings.queue, connection=self.client)
        self.worker = ScheduleWorker([self.queue], connection=self.client, owner=self.owner)
        self._injected_clock = injected_clock
        self._next_renew_ms = 0

    def _new_host(self) -> ReferenceHost:
        return ReferenceHost(
            self.store, self.coordination, self.settings, clock=self.clock,
            on_delivery=self._on_delivery,
        )

    def stop_host(self) -> None:
        """The host goes away: its agents are disposed, their logs keep every record."""
        self.host.close()
        self.host = self._new_host()

    def step(self) -> list[tuple[str, Delivery]]:
        """Renew leases, move due wakes, run queued wakes, repair what the watchdog finds
        overdue, deliver the followups of the agents the host's ready stream names (one
        read that does not wait)."""
        if self.clock() >= self._next_renew_ms:
            self.host.plugin.renew_leases()
            self._next_renew_ms = self.clock() + int(self.settings.lease_renew_s * 1000)
        self.coordination.wakes.move_due(self.clock() if self._injected_clock else None)
        if self.queue.count:
            self.worker.work(burst=True, logging_level="WARNING")
        self.host.plugin.bridge.watchdog.check()  # nothing sent while nothing is overdue
        return self.host.serve(0.0)

    def flush_redis(self) -> None:
        """Drop every key, as a Redis restart without persistence would."""
        self.client.flushdb()

    def rebuild(self) -> RebuildReport:
        self.host.plugin.renew_leases()
        return rebuild(self.coordination, self.settings, now_ms=self.clock())
