"""The whole system in one process (docs/architecture.md#processes-and-cli).

``EmbeddedSystem`` is the one place that assembles it: Redis (the embedded one, or the
client given), the coordination, the session store, a due owner behind an rq
``SimpleWorker`` (fakeredis state is per process, so nothing forks) and the scheduler's
own loop (``SchedulerLoop``), whose passes it makes when asked. The embedded runtime
(``dsh_schedule.runtime``) runs those passes in two threads; the demo, the web console,
the embedded load test and the tests step them by hand, with a reference host that
delivers as a deployed one does: for the agents the ready stream names, never by looking
at every agent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis
from rq import Queue
from rq.timeouts import BaseDeathPenalty, TimerDeathPenalty, UnixSignalDeathPenalty

from dsh_schedule.host.gate import Delivery
from dsh_schedule.host.reference import ReferenceHost
from dsh_schedule.scheduler.process import SchedulerLoop
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect_embedded
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.worker.due import DueOwner
from dsh_schedule.worker.process import ScheduleWorker

log = logging.getLogger(__name__)


class InProcessWorker(ScheduleWorker):
    """The schedule worker inside a program: the process's signals stay the program's own
    (rq installs no handlers), and a job's time limit is SIGALRM in the main thread and
    rq's timer in any other (only the main thread may take a signal)."""

    @property  # rq reads it from the instance, per job
    def death_penalty_class(self) -> type[BaseDeathPenalty]:  # type: ignore[override]
        if threading.current_thread() is threading.main_thread():
            return UnixSignalDeathPenalty
        return TimerDeathPenalty

    def _install_signal_handlers(self) -> None:
        pass


class EmbeddedSystem:
    """Redis, the coordination, the store, a worker and the scheduler, in this process.

    ``clock`` is the clock of the tools, the due owner and the host; with
    ``injected_clock`` the scheduler's passes decide at it too (else at the shared clock,
    Redis's). ``client`` replaces the embedded Redis; ``on_delivery`` is given to the
    reference host, which is made on first use of ``host``.
    """

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
        rq_log_level: str = "WARNING",
    ) -> None:
        self.client = client if client is not None else connect_embedded()
        self.settings = settings
        self.store = store
        self.clock = clock
        self.coordination = Coordination(self.client, settings)
        self.owner = DueOwner(store, self.coordination, settings, clock=clock, sleep=sleep)
        self.queue = Queue(settings.queue, connection=self.client)
        self.worker = InProcessWorker([self.queue], connection=self.client, owner=self.owner)
        self.scheduler = SchedulerLoop(self.coordination, settings,
                                       clock=clock if injected_clock else None)
        self._on_delivery = on_delivery
        self._host: ReferenceHost | None = None
        self._injected_clock = injected_clock
        self._rq_log_level = rq_log_level
        self._next_renew_ms = 0

    # -- the processes' passes ----------------------------------------------------------

    def move_due(self) -> int:
        """The scheduler's mover pass, once: the wakes due by now go onto the queue."""
        return self.coordination.wakes.move_due(self.clock() if self._injected_clock else None)

    def scheduler_pass(self) -> None:
        """One pass of the scheduler's own loop (rebuild or reconcile when due, the mover,
        the look for dead workers, the heartbeat)."""
        self.scheduler.one_pass()

    def worker_pass(self) -> None:
        """Run the queued wakes, as the worker process does, until the queue is empty."""
        if self.queue.count:
            self.worker.work(burst=True, logging_level=self._rq_log_level)

    # -- the stepped reference host -------------------------------------------------------

    @property
    def host(self) -> ReferenceHost:
        """The reference host the steps deliver through (made on first use)."""
        if self._host is None:
            self._host = self._new_host()
        return self._host

    @host.setter
    def host(self, host: ReferenceHost) -> None:
        self._host = host

    def _new_host(self) -> ReferenceHost:
        return ReferenceHost(self.store, self.coordination, self.settings, clock=self.clock,
                             on_delivery=self._on_delivery)

    def stop_host(self) -> None:
        """The host goes away and a new one takes its place: the agents are disposed,
        their logs keep every record."""
        self.host.close()
        self._host = self._new_host()

    def step(self) -> list[tuple[str, Delivery]]:
        """Renew leases, move due wakes, run queued wakes, repair what the watchdog finds
        overdue, deliver the followups of the agents the host's ready stream names (one
        read that does not wait)."""
        host = self.host
        if self.clock() >= self._next_renew_ms:
            host.plugin.renew_leases()
            self._next_renew_ms = self.clock() + int(self.settings.lease_renew_s * 1000)
        self.move_due()
        self.worker_pass()
        host.plugin.bridge.watchdog.check()  # nothing sent while nothing is overdue
        return host.serve(0.0)

    def flush_redis(self) -> None:
        """Drop every key, as a Redis restart without persistence would."""
        self.client.flushdb()
