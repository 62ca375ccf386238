"""The scheduler's rebuild and reconcile passes (scheduler/process.py runs them): rebuild
enqueues a wake for every live agent; the periodic reconcile pass retires the agents of
hosts whose lease expired and wakes a slice of a slow full sweep; each leaves the summary
an operator reads (docs/architecture.md#operations)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Final

import msgspec

from dsh_schedule import status
from dsh_schedule.shared import metrics
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings

log = logging.getLogger("dsh_schedule.scheduler.process")

CHECK_BATCH: Final = 1_000  # agents retired per batch


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
    coord.trigger(live)
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
        coord.trigger(swept)
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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
