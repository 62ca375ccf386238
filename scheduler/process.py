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
each loop's last pass.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Final

import msgspec
import redis

from dsh_schedule import status
from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.collector import tune_for_service
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.connection import connect
from dsh_schedule.shared.coordination.outage import Outage, is_outage
from dsh_schedule.shared.settings import Settings

log = logging.getLogger(__name__)

CHECK_BATCH: Final = 1_000  # agents retired per batch
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
    """One reconcile pass: the agents of expired hosts it retired, the slice of the sweep
    it woke, and how many hosts it read (``woken`` is ``swept``)."""

    woken: tuple[str, ...]
    retired: tuple[str, ...]
    hosts: int
    swept: tuple[str, ...]


def rebuild(coord: Coordination, settings: Settings, *, now_ms: int) -> RebuildReport:
    """Enqueue a wake for every live agent; remove what Redis holds for the agents of
    hosts whose lease expired.

    It wakes the agents whose hosts' leases Redis still holds. After Redis lost everything
    there are none yet: each host finds the generation marker gone within a second and
    installs its agents again, and each new lease wakes its agent, so the hosts restore
    everything without it (``rebuild_note``, docs/decisions.md#delivery, "What rebuild is
    for")."""
    live = coord.leases.live_agents(now_ms=now_ms)
    coord.trigger_many(live)
    coord.followups.recount(live)  # the pending-followups counter, put right
    return RebuildReport(woken=tuple(live), retired=tuple(_retire(coord, settings, now_ms)))


def rebuild_note(report: RebuildReport, settings: Settings) -> str | None:
    """What ``dsh-schedule rebuild`` tells an operator when it woke no agent: no host's
    lease is live, so a Redis that just lost its keys is restored by the hosts."""
    if report.woken:
        return None
    return (
        "rebuild: no agent holds a lease, so there was nothing to wake. If Redis just lost "
        "its keys (a flush, a restart without persistence), nothing more is needed: each "
        "host finds the generation marker gone within "
        f"{settings.generation_check_s:g} s and installs its agents anew, and every new "
        "lease wakes its agent, which re-arms its reminders and re-projects its followups "
        "from its log. rebuild is for a Redis that kept the leases but lost wakes (see "
        "docs/decisions.md, \"What rebuild is for\")."
    )


def _retire(coord: Coordination, settings: Settings, now_ms: int) -> list[str]:
    """Remove, under each one's lock, what Redis holds for the agents of every host whose
    lease expired, ``CHECK_BATCH`` agents at a time; then forget the host. One read when
    no host expired, whatever the number of agents.

    Every agent retired leaves the host's served set here, whatever the hashes say: an
    agent whose ``agent-host`` entry was lost (a failover that lost a write) is retired
    like the others instead of being found again for ever. Each agent is tried once a
    pass, so the pass ends whatever Redis holds."""
    retired: list[str] = []
    leases = coord.leases
    for host in leases.expired_hosts(now_ms=now_ms):
        busy: set[str] = set()
        tried: set[str] = set()
        while batch := [a for a in leases.still_served(host, CHECK_BATCH + len(busy))
                        if a not in tried][:CHECK_BATCH]:
            tried.update(batch)
            # With wake_unloaded, each keeps a timer at its wake's moment.
            park = coord.unloaded.park_wakes if settings.wake_unloaded else None
            left = set(coord.forget_agents(batch, lock_wait_s=settings.tool_lock_wait_s,
                                           park=park))
            for agent in left:
                log.info("could not retire %s now; the next pass retries", agent)
            busy |= left
            done = [a for a in batch if a not in left]
            leases.leave_served(host, done)
            retired.extend(done)
        if not busy and leases.forget_host(host, now_ms=now_ms):
            log.info("host %s: its lease expired; its agents are retired", host)
    return retired


class Reconciler:
    """The rebuild and the reconcile pass of one scheduler process.

    A reconcile pass reads O(hosts) and O(what changed), never the whole live set
    (docs/architecture.md#rebuild-and-reconcile): one read of the hosts ZSET finds the
    hosts whose lease expired, whose agents it retires; and it wakes one slice of a slow
    sweep, the last safety net: a cursor over the agents (``HSCAN`` of the agent-host
    hash) that each pass advances by the share of them its interval is of
    ``sweep_period_s`` (a week by default), so every live agent is woken once per period
    and never all at once. It reads no agent's projection and checks no key: a key lost
    from a live agent's projection is repaired by its host (the watchdog, within
    ``repair_after_s`` of the moment it mattered, and the renewal's digest for lease
    entries a failover lost: docs/architecture.md#repairing-lost-keys). The sweep is the
    last net for what no host watches: an announcement trimmed past a lagging host, a
    worker's failed re-arm until its due path owes it. Retiring tries each agent of an
    expired host once a pass and takes it out of the host's served set whatever the
    hashes say, so a pass always ends. The pass itself decides nothing: each wake decides
    under the agent's lock.
    """

    def __init__(self, coord: Coordination, settings: Settings) -> None:
        self._coord = coord
        self._settings = settings
        self._cursor = 0  # where the sweep's HSCAN goes on
        self._scanned: list[str] = []  # agents the scan returned that the sweep owes
        self._sweep_owed = 0.0  # agents the sweep owes, from the time passed
        self._last_pass_ms: int | None = None

    def rebuild(self, *, now_ms: int) -> RebuildReport:
        """Wake every live agent (start, after an outage); the next passes go on from it."""
        report = rebuild(self._coord, self._settings, now_ms=now_ms)
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
        """One pass: retire the agents of expired hosts, wake the sweep's slice."""
        coord = self._coord
        retired = _retire(coord, self._settings, now_ms)
        hosts = coord.leases.live_hosts(now_ms=now_ms)
        swept = self._sweep(now_ms)
        coord.trigger_many(swept)
        report = ReconcileReport(woken=tuple(swept), retired=tuple(retired),
                                 hosts=len(hosts), swept=tuple(swept))
        self._record(report, hosts, now_ms)
        (log.info if retired else log.debug)(
            "reconcile: %d live host(s), %d swept, %d retired", len(hosts), len(swept),
            len(retired))
        return report

    def _record(self, report: ReconcileReport, hosts: Sequence[str], now_ms: int) -> None:
        """Leave the pass's summary for ``status`` (the live agents counted with one SCARD
        per live host); set the gauges when metrics are on (one ZCARD, and one GET of the
        pending-followups counter)."""
        coord = self._coord
        recorder = metrics.get()
        live = coord.leases.count_served(hosts)
        status.write_reconcile(coord.client, coord.keys, status.ReconcileSummary(
            at=now_ms, kind="reconcile", live=live, woken=len(report.woken),
            retired=len(report.retired), swept=len(report.swept), hosts=report.hosts,
        ))
        if not recorder.enabled:
            return
        recorder.live_agents(live)
        recorder.scheduled_wakes(int(coord.client.zcard(coord.keys.scheduled_jobs())))
        recorder.followups_pending(coord.followups.pending_total())

    def _sweep(self, now_ms: int) -> list[str]:
        """The next slice of the sweep: as many agents as the time since the last pass is
        a share of ``sweep_period_s``, from where the scan stopped; only the live ones
        are woken."""
        settings = self._settings
        last, self._last_pass_ms = self._last_pass_ms, now_ms
        elapsed_ms = 0 if last is None else max(now_ms - last, 0)
        # A late pass (a paused process, an outage) catches up at most one more interval.
        elapsed_ms = min(elapsed_ms, int(2 * settings.reconcile_interval_s * 1000))
        client, key = self._coord.client, self._coord.keys.agent_host()
        agents = int(client.hlen(key))
        if not agents:
            self._sweep_owed, self._scanned = 0.0, []
            return []
        period_ms = settings.sweep_period_s * 1000
        self._sweep_owed = min(self._sweep_owed + agents * elapsed_ms / period_ms,
                               float(agents))
        take = math.floor(self._sweep_owed + 1e-9)  # 0.1 added ten times is one agent
        if take <= 0:
            return []
        self._sweep_owed = max(self._sweep_owed - take, 0.0)
        while len(self._scanned) < take:
            cursor, found = client.hscan(key, self._cursor, count=take)
            self._cursor = int(cursor)
            self._scanned.extend(_text(agent) for agent in found)
            if self._cursor == 0:
                break  # a whole round: the next pass starts another
        swept, self._scanned = self._scanned[:take], self._scanned[take:]
        return self._coord.leases.live_among(swept, now_ms=now_ms)


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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
