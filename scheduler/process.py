"""The ``scheduler`` process: the wake mover, startup rebuild, periodic reconcile.

Our own loop runs the mover pass (``WakeProjection.move_due``: a script that takes the
wakes due to the millisecond; rq-scheduler's ``run()`` would install its own signal
handlers and compare whole seconds) under rq-scheduler's lock. Rebuild enqueues a wake
for every live agent; the periodic reconcile pass enqueues wakes only for the agents whose
projection in Redis is missing or stale, plus a slice of a slow full sweep. All deciding
happens inside the wake, under the lock, after a preflight — so a Redis flush loses
nothing.

The loop also leaves what an operator reads (docs/architecture.md#operations): a heartbeat
key refreshed after its passes, the summary of its last rebuild or reconcile, and, when
metrics are on, the gauges of live agents and scheduled wakes (set by each rebuild or
reconcile pass) and of pending followups (set by each reconcile pass), from what the pass
reads anyway plus one ZCARD and one XLEN per non-empty followup stream, and the time of
each loop's last pass.
"""

from __future__ import annotations

import bisect
import logging
import math
import signal
import threading
import time
import zlib
from collections.abc import Sequence
from types import FrameType
from typing import Final

import msgspec
import redis

from dsh_schedule import status
from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.collector import tune_for_service
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.lock import LockUnavailable
from dsh_schedule.shared.coordination.outage import Outage, is_outage
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)

CHECK_BATCH: Final = 1_000  # agents per pipelined projection check
# Each pass checks the projection of new agents and of one of these slices of the rest, so
# a live agent's projection is read every PROJECTION_SLICES passes (2 min by default), and
# an idle deployment's reconcile reads a quarter of its agents per pass.
PROJECTION_SLICES: Final = 4
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


class RebuildReport(msgspec.Struct, frozen=True, kw_only=True):
    woken: tuple[str, ...]
    retired: tuple[str, ...]


class ReconcileReport(msgspec.Struct, frozen=True, kw_only=True):
    """One reconcile pass: every agent it woke, and why (an agent may have several
    reasons; ``woken`` names it once)."""

    woken: tuple[str, ...]
    retired: tuple[str, ...]
    checked: int
    new: tuple[str, ...]
    stale_wakes: tuple[str, ...]
    stale_followups: tuple[str, ...]
    swept: tuple[str, ...]


def rebuild(coord: Coordination, settings: Settings, *, now_ms: int) -> RebuildReport:
    """Enqueue a wake for every live agent; remove what Redis holds for ended agents.

    It wakes the agents whose leases Redis still holds. After Redis lost everything there
    are none yet: each host grants its leases anew at its next renewal, and a new lease
    wakes its agent, so the hosts restore everything without it (``rebuild_note``,
    docs/decisions.md#delivery, "What rebuild is for")."""
    live = coord.leases.live_agents(now_ms=now_ms)
    coord.trigger_many(live)
    return RebuildReport(woken=tuple(live), retired=tuple(_retire(coord, settings, now_ms)))


def rebuild_note(report: RebuildReport, settings: Settings) -> str | None:
    """What ``dsh-schedule rebuild`` tells an operator when it woke no agent: no lease is
    live, so a Redis that just lost its keys is restored by the hosts' renewals."""
    if report.woken:
        return None
    return (
        "rebuild: no agent holds a lease, so there was nothing to wake. If Redis just lost "
        "its keys (a flush, a restart without persistence), nothing more is needed: each "
        f"host grants its leases anew at its next renewal (every {settings.lease_renew_s:g} "
        "s), and every new lease wakes its agent, which re-arms its reminders and "
        "re-projects its followups from its log. rebuild is for a Redis that kept the "
        "leases but lost wakes (see docs/decisions.md, \"What rebuild is for\")."
    )


def _retire(coord: Coordination, settings: Settings, now_ms: int) -> list[str]:
    """Remove, under each one's lock, what Redis holds for agents whose lease expired."""
    retired: list[str] = []
    for agent in coord.leases.expired_agents(now_ms=now_ms):
        try:
            coord.forget_agent(agent, lock_wait_s=settings.tool_lock_wait_s)
        except LockUnavailable:
            log.info("could not retire %s now; the next pass retries", agent)
        else:
            retired.append(agent)
    return retired


class Reconciler:
    """The rebuild and the incremental reconcile pass of one scheduler process.

    A reconcile pass reads every live agent's projection (``Coordination.projections``,
    ``CHECK_BATCH`` agents per pipelined read) and enqueues wakes, in ``wake_batch`` jobs,
    only for agents whose projection is missing or stale:

    - a new lease: no current wake, and never seen by an earlier pass or rebuild;
    - a current wake whose job is neither in the schedule nor an rq job hash;
    - a followup entry older than ``followup_stale_s`` (its announcement, or the host
      holding it, was lost; the wake's re-arm announces it again).

    What only a fold can see — an agent with work but no current wake, because a re-arm
    failed after a durable mutation — is left to a slow full sweep: a cursor over the live
    agents in id order that each pass advances by the share of them its interval is of
    ``sweep_period_s``, so every live agent is woken once per period and never all at
    once. An agent with no active reminder has no current wake either; only the sweep
    wakes it. The pass itself decides nothing: each wake decides under the agent's lock.
    """

    def __init__(self, coord: Coordination, settings: Settings) -> None:
        self._coord = coord
        self._settings = settings
        self._seen: set[str] = set()
        self._pass = 0  # reconcile passes so far: which projection slice to check
        self._with_followups: set[str] = set()  # agents last seen holding followups
        self._sweep_after: str | None = None  # the last agent id the sweep woke
        self._sweep_owed = 0.0  # agents the sweep owes, from the time passed
        self._last_pass_ms: int | None = None

    def rebuild(self, *, now_ms: int) -> RebuildReport:
        """Wake every live agent (start, after an outage); the next passes go on from it."""
        report = rebuild(self._coord, self._settings, now_ms=now_ms)
        self._seen = set(report.woken)
        self._sweep_owed = 0.0
        self._last_pass_ms = now_ms
        recorder = metrics.get()
        if recorder.enabled:
            recorder.live_agents(len(report.woken))
            keys = self._coord.keys
            recorder.scheduled_wakes(int(self._coord.client.zcard(keys.scheduled_jobs())))
        status.write_reconcile(self._coord.client, self._coord.keys, status.ReconcileSummary(
            at=now_ms, kind="rebuild", live=len(report.woken), woken=len(report.woken),
            retired=len(report.retired),
        ))
        return report

    def reconcile(self, *, now_ms: int) -> ReconcileReport:
        """One incremental pass: retire ended agents, wake the stale ones and the sweep's
        slice."""
        coord = self._coord
        retired = _retire(coord, self._settings, now_ms)
        live = sorted(coord.leases.live_agents(now_ms=now_ms))
        server_ms = coord.server_time_ms()
        stale_after_ms = coord.followup_stale_ms
        new: list[str] = []
        stale_wakes: list[str] = []
        stale_followups: list[str] = []
        self._pass += 1
        checked = [a for a in live
                   if a not in self._seen or _slice_of(a) == self._pass % PROJECTION_SLICES]
        for start in range(0, len(checked), CHECK_BATCH):
            batch = checked[start : start + CHECK_BATCH]
            for agent, found in zip(batch, coord.projections(batch), strict=True):
                if found.wake is None and agent not in self._seen:
                    new.append(agent)
                if found.wake is not None and not found.wake_held:
                    stale_wakes.append(agent)
                if found.oldest_followup_ms is None:
                    self._with_followups.discard(agent)
                else:
                    self._with_followups.add(agent)
                    if server_ms - found.oldest_followup_ms >= stale_after_ms:
                        stale_followups.append(agent)
        self._with_followups.intersection_update(live)
        with_followups = sorted(self._with_followups)
        swept = self._sweep(live, now_ms)
        woken = list(dict.fromkeys([*new, *stale_wakes, *stale_followups, *swept]))
        coord.trigger_many(woken)
        self._seen = set(live)
        report = ReconcileReport(
            woken=tuple(woken), retired=tuple(retired), checked=len(live), new=tuple(new),
            stale_wakes=tuple(stale_wakes), stale_followups=tuple(stale_followups),
            swept=tuple(swept),
        )
        self._record(report, with_followups, now_ms)
        repaired = len(new) + len(stale_wakes) + len(stale_followups)
        (log.info if repaired else log.debug)(
            "reconcile: %d live, %d new, %d stale wake(s), %d stale followup stream(s), "
            "%d swept, %d retired", len(live), len(new), len(stale_wakes),
            len(stale_followups), len(swept), len(retired),
        )
        return report

    def _record(self, report: ReconcileReport, with_followups: Sequence[str],
                now_ms: int) -> None:
        """Leave the pass's summary for ``status``; set the gauges when metrics are on."""
        coord = self._coord
        status.write_reconcile(coord.client, coord.keys, status.ReconcileSummary(
            at=now_ms, kind="reconcile", live=report.checked, woken=len(report.woken),
            retired=len(report.retired), new=len(report.new),
            stale_wakes=len(report.stale_wakes), stale_followups=len(report.stale_followups),
            swept=len(report.swept),
        ))
        recorder = metrics.get()
        if not recorder.enabled:
            return
        recorder.live_agents(report.checked)
        recorder.scheduled_wakes(int(coord.client.zcard(coord.keys.scheduled_jobs())))
        pending = 0
        for start in range(0, len(with_followups), CHECK_BATCH):
            with coord.client.pipeline(transaction=False) as pipe:
                for agent in with_followups[start : start + CHECK_BATCH]:
                    pipe.xlen(coord.keys.followups(agent))
                pending += sum(int(n) for n in pipe.execute())
        recorder.followups_pending(pending)

    def _sweep(self, live: Sequence[str], now_ms: int) -> list[str]:
        """The next slice of the full sweep: the live agents (sorted) after the cursor, as
        many as the time since the last pass is a share of ``sweep_period_s``."""
        settings = self._settings
        last, self._last_pass_ms = self._last_pass_ms, now_ms
        if not live:
            return []
        elapsed_ms = 0 if last is None else max(now_ms - last, 0)
        # A late pass (a paused process, an outage) catches up at most one more interval.
        elapsed_ms = min(elapsed_ms, int(2 * settings.reconcile_interval_s * 1000))
        period_ms = settings.sweep_period_s * 1000
        self._sweep_owed = min(self._sweep_owed + len(live) * elapsed_ms / period_ms,
                               float(len(live)))
        take = math.floor(self._sweep_owed + 1e-9)  # 0.1 added ten times is one agent
        if take <= 0:
            return []
        self._sweep_owed = max(self._sweep_owed - take, 0.0)
        after = self._sweep_after
        first = 0 if after is None else bisect.bisect_right(live, after) % len(live)
        ordered = [*live[first:], *live[:first]]
        swept = ordered[:take]
        self._sweep_after = swept[-1]
        return swept


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
        coord.trigger_many(held.agents)
        liveness.drop_abandoned(held.job)
        liveness.swap(name, claim, None)
        log.warning("worker %s stopped beating while it held wake %s: woke its %d "
                    "agent(s) again", name, held.job, len(held.agents))
        woken.extend(held.agents)
    return woken


def _slice_of(agent: str) -> int:
    """The projection-check slice an agent belongs to (stable across processes)."""
    return zlib.crc32(agent.encode()) % PROJECTION_SLICES


class SchedulerLoop:
    """The mover every ``mover_interval_s``, a rebuild at start and an incremental
    reconcile every ``reconcile_interval_s``; through a Redis outage (``is_outage``: lost,
    or refusing for an operational reason) it waits with backoff and rebuilds once Redis
    is back (docs/architecture.md#outages)."""

    def __init__(self, coord: Coordination, settings: Settings) -> None:
        self._coord = coord
        self._settings = settings
        self._outage = Outage(log, "scheduler")
        self._reconciler = Reconciler(coord, settings)
        self._rebuild_next = True
        self._next_beat = 0.0  # monotonic time of the next heartbeat refresh
        self._moved = True  # whether the last pass held the mover lock
        self._next_worker_check = 0.0  # monotonic time of the next dead-worker look
        self.stop = threading.Event()

    def run(self) -> int:
        next_reconcile = 0.0  # the first pass rebuilds
        while not self.stop.is_set():
            try:
                if time.monotonic() >= next_reconcile:
                    self._reconcile()
                    next_reconcile = time.monotonic() + self._settings.reconcile_interval_s
                self._move()
                self._recover()
                self._beat()
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
                next_reconcile = 0.0
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
        if next_due is None:
            return interval, False
        until_due = (next_due - wall_clock_ms()) / 1000
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
                               now_ms=wall_clock_ms())
        self._next_beat = now + status.HEARTBEAT_EVERY_S

    def _recover(self) -> None:
        """Look for dead workers, at most every ``DEAD_WORKER_CHECK_S``."""
        now = time.monotonic()
        if now < self._next_worker_check:
            return
        self._next_worker_check = now + DEAD_WORKER_CHECK_S
        recover_dead_workers(self._coord)

    def _reconcile(self) -> None:
        now_ms = wall_clock_ms()
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
                self._coord.wakes.move_due()
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
    client = redis.Redis.from_url(settings.redis_url)
    loop = SchedulerLoop(Coordination(client, settings), settings)
    tune_for_service()
    loop.install_signal_handlers()
    log.info("scheduler moving wakes every %g s", settings.mover_interval_s)
    return loop.run()
