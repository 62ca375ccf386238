"""The ``scheduler`` process: the wake mover, startup rebuild, periodic reconcile.

Our own loop runs the mover pass (``WakeProjection.move_due``: a script that takes the
wakes due to the millisecond; rq-scheduler's ``run()`` would install its own signal
handlers and compare whole seconds) under rq-scheduler's lock. Rebuild enqueues a wake
for every live agent; the periodic reconcile pass retires the agents of hosts whose lease
expired and wakes a slice of a slow full sweep; it reads no agent's projection (the
hosts' watchdogs repair lost keys, docs/architecture.md#repairing-lost-keys). All deciding
happens inside the wake, under the lock, after a preflight — so a Redis flush loses
nothing.

The loop also leaves what an operator reads (docs/architecture.md#operations): a heartbeat
key refreshed after its passes, the summary of its last rebuild or reconcile, and, when
metrics are on, the gauges of live agents and scheduled wakes (set by each rebuild or
reconcile pass) and of pending followups (set by each reconcile pass), from what the pass
reads anyway plus one ZCARD and one XLEN per non-empty followup stream, and the time of
each loop's last pass. The rebuild and reconcile passes: ``scheduler/rebuild.py``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Final

import redis

from dsh_schedule import status
from dsh_schedule.scheduler.rebuild import (
    RebuildReport,
    Reconciler,
    ReconcileReport,
    rebuild,
    rebuild_note,
)
from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.collector import tune_for_service
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect
from dsh_schedule.shared.coordination.outage import Outage, is_outage
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "RebuildReport", "ReconcileReport", "Reconciler", "SchedulerLoop", "ask_unloaded",
    "rebuild", "rebuild_note", "recover_dead_workers", "run_scheduler",
]

MIN_PAUSE_S: Final = 0.01  # the shortest pause between two mover passes
# How late Redis may end a blocking call's timeout (its clock ticks ten times a second by
# default), and how often the end of a pause looks for a nudge instead.
BLOCK_SLACK_S: Final = 0.1
NUDGE_POLL_S: Final = 0.01


# How long a scheduler's take-over of a dead worker lasts: another scheduler may take it
# over once this passes (the first died before it woke the agents).
RECOVERY_CLAIM_MS: Final = 10_000
# How often the loop looks for workers whose beat is overdue: one read, whatever the
# number of agents (docs/architecture.md#a-dead-workers-wakes).
DEAD_WORKER_CHECK_S: Final = 1.0


def recover_dead_workers(coord: Coordination) -> list[str]:
    """Wake again exactly the agents of the wakes that dead workers held
    (docs/architecture.md#a-dead-workers-wakes); the agents woken.

    A worker whose beat is overdue is dead (or paused past its beat: its fenced appends
    lose to what the new wake writes). Its agents' locks and maintenance phases are still
    held until their TTLs run out, and a wake before that would find them busy: its entry
    is set to be looked at again once they expire. Then one scheduler takes it over (its
    score becomes the claim's end, so no other takes it meanwhile), enqueues the wakes,
    and forgets the worker and the rq job it was executing. A worker that beats again
    meanwhile is left alone: its score moved."""
    liveness = coord.workers
    now_ms, overdue = liveness.overdue()
    woken: list[str] = []
    for name, score, held in overdue:
        if held is None or not held.agents:
            if liveness.swap(name, score, None):
                log.info("worker %s stopped beating; it held no wake", name)
            continue
        busy_ms = liveness.busy_for_ms(held.agents)
        if busy_ms > 0:
            liveness.swap(name, score, now_ms + busy_ms)  # look again once they expire
            continue
        claim = now_ms + RECOVERY_CLAIM_MS
        if not liveness.swap(name, score, claim):
            continue  # it beat again, or another scheduler took it
        coord.trigger(held.agents)
        liveness.drop_abandoned(held.job)
        liveness.swap(name, claim, None)
        log.warning("worker %s stopped beating while it held wake %s: woke its %d "
                    "agent(s) again", name, held.job, len(held.agents))
        woken.extend(held.agents)
    return woken


def ask_unloaded(coord: Coordination, now_ms: int | None = None) -> int:
    """Announce to their host groups the unloaded sessions whose timers are due
    (``UnloadedTimers.take_due``): one log line per session and request, each request
    moving its timer on by a doubling backoff. How many were announced."""
    announced = coord.unloaded.take_due(coord.clock() if now_ms is None else now_ms)
    recorder = metrics.get()
    for request in announced:
        log.info("session %s is due and no host serves it: asked %s to load it "
                 "(request %d; asked again in %g s unless it is loaded)",
                 request.session, request.queue, request.attempt,
                 request.backoff_ms / 1000)
        recorder.load_requested()
    return len(announced)


class SchedulerLoop:
    """The mover every ``mover_interval_s``, a rebuild at start and an incremental
    reconcile every ``reconcile_interval_s``; through a Redis outage (``is_outage``: lost,
    or refusing for an operational reason) it waits with backoff and rebuilds once Redis
    is back (docs/architecture.md#outages)."""

    def __init__(self, coord: Coordination, settings: Settings, *,
                 clock: Clock | None = None) -> None:
        """``clock``: the time the passes decide at (default: the shared clock, Redis's;
        an in-process system on an injected clock passes that one)."""
        self._coord = coord
        self._settings = settings
        self._clock: Clock = coord.clock if clock is None else clock
        self._outage = Outage(log, "scheduler")
        self._reconciler = Reconciler(coord, settings)
        self._rebuild_next = True
        self._next_reconcile = 0.0  # monotonic time of the next reconcile: now, a rebuild
        self._next_beat = 0.0  # monotonic time of the next heartbeat refresh
        self._moved = True  # whether the last pass held the mover lock
        self._next_worker_check = 0.0  # monotonic time of the next dead-worker look
        self.stop = threading.Event()

    def one_pass(self) -> None:
        """One pass of the loop: a rebuild (the first pass) or reconcile when its interval
        is up, the mover, the look for dead workers and the heartbeat, each when due.
        ``run`` makes them in turn; an in-process system calls it from its own loop."""
        if time.monotonic() >= self._next_reconcile:
            self._reconcile()
            self._next_reconcile = time.monotonic() + self._settings.reconcile_interval_s
        self._move()
        self._recover()
        self._beat()

    def run(self) -> int:
        while not self.stop.is_set():
            try:
                self.one_pass()
                pause_s, exact = self._pause_s()
            except Exception as exc:
                if is_outage(exc):  # lost, or an error reply saying "not now"
                    self.stop.wait(self._outage.failed(exc))
                    continue
                # The mover must keep moving: log, and try again on the next pass.
                log.exception("scheduler pass failed")
                self.stop.wait(1.0)
                continue
            if self._outage.succeeded():
                # Redis may have lost everything: rebuild now
                self._next_reconcile = 0.0
                self._rebuild_next = True
            self._wait(pause_s, exact=exact)
        log.info("scheduler stopped")
        return 0

    def _wait(self, pause_s: float, *, exact: bool) -> None:
        """Block until the next pass: ``pause_s``, or sooner when a wake is armed (the
        nudge list). An idle scheduler therefore costs one pass per interval, and a wake
        armed for a moment before the next known due time is moved on time.

        Redis ends a blocking call's timeout only on one of its clock ticks (ten a second
        at its default ``hz``), so a blocking pop may return up to ``BLOCK_SLACK_S`` late.
        When the pause ends at a wake's due time (``exact``), the block therefore ends that
        much early, and the rest is slept out here, looking for a nudge every
        ``NUDGE_POLL_S``."""
        if self.stop.is_set():
            return
        deadline = time.monotonic() + pause_s
        client, nudge = self._coord.client, self._coord.keys.mover_nudge()
        try:
            block_s = pause_s - BLOCK_SLACK_S if exact else pause_s
            if block_s >= MIN_PAUSE_S and client.blpop([nudge], timeout=block_s):
                return
            while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
                self.stop.wait(min(left, NUDGE_POLL_S))
                if client.lpop(nudge) is not None:
                    return
        except redis.RedisError as exc:
            if not is_outage(exc):
                raise
            self.stop.wait(self._outage.failed(exc))

    def _pause_s(self) -> tuple[float, bool]:
        """Until the next pass, and whether it ends at a wake's due time: the mover
        interval, or less when the earliest wake left in the schedule is due sooner
        (never under ``MIN_PAUSE_S``: passes closer than that would hand each wake on in
        an rq job of its own), or ``MIN_PAUSE_S`` when another scheduler held the mover
        lock (its pass may have missed a new wake)."""
        interval = self._settings.mover_interval_s
        if not self._moved:
            return MIN_PAUSE_S, True
        next_due = self._coord.wakes.next_due_ms
        if self._settings.wake_unloaded and self._coord.unloaded.next_due_ms is not None:
            unloaded_due = self._coord.unloaded.next_due_ms
            next_due = unloaded_due if next_due is None else min(next_due, unloaded_due)
        if next_due is None:
            return interval, False
        until_due = (next_due - self._clock()) / 1000
        if until_due >= interval:
            return interval, False
        return max(MIN_PAUSE_S, until_due), True

    def _beat(self) -> None:
        """Refresh the scheduler heartbeat, at most every ``HEARTBEAT_EVERY_S``."""
        now = time.monotonic()
        if now < self._next_beat:
            return
        every_s = max(status.HEARTBEAT_EVERY_S, self._settings.mover_interval_s)
        status.write_heartbeat(self._coord.client, self._coord.keys, every_s=every_s,
                               now_ms=self._coord.clock())
        self._next_beat = now + status.HEARTBEAT_EVERY_S

    def _recover(self) -> None:
        """Look for dead workers, at most every ``DEAD_WORKER_CHECK_S``."""
        now = time.monotonic()
        if now < self._next_worker_check:
            return
        self._next_worker_check = now + DEAD_WORKER_CHECK_S
        recover_dead_workers(self._coord)

    def _reconcile(self) -> None:
        now_ms = self._clock()
        if self._rebuild_next:
            report = self._reconciler.rebuild(now_ms=now_ms)
            self._rebuild_next = False
            log.debug("rebuild woke %d live agent(s)", len(report.woken))
        else:
            self._reconciler.reconcile(now_ms=now_ms)
        metrics.get().pass_done("reconcile", time.time())

    def _move(self) -> None:
        scheduler = self._coord.wakes.scheduler
        self._moved = bool(scheduler.acquire_lock())
        if self._moved:
            try:
                self._coord.wakes.move_due(self._clock())
                if self._settings.wake_unloaded:
                    ask_unloaded(self._coord, self._clock())
            finally:
                scheduler.remove_lock()
        metrics.get().pass_done("mover", time.time())

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping after this pass", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)


def run_scheduler(settings: Settings) -> int:
    if not settings.redis_url:
        raise ValueError("the scheduler needs a Redis URL")
    client = connect(settings.redis_url)
    loop = SchedulerLoop(Coordination(client, settings), settings)
    tune_for_service()
    loop.install_signal_handlers()
    log.info("scheduler moving wakes every %g s", settings.mover_interval_s)
    return loop.run()
