"""The Redis coordination of one deployment: every adapter, built from one client.

Redis only coordinates: every key here can be deleted and rebuilt from the session logs
(docs/architecture.md#delivery). This is the entry point a host or a process builds once;
the transactions receive it beside their ``Settings``, which it does not hand out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis

from dsh_schedule.shared.coordination.clock import LIVE_SLACK_MS, SharedClock
from dsh_schedule.shared.coordination.followups import FollowupEntry, Followups, Pair
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import Leases
from dsh_schedule.shared.coordination.lock import AgentLocks, HeldLock
from dsh_schedule.shared.coordination.phase import AgentPhase, Release
from dsh_schedule.shared.coordination.unloaded import UnloadedTimers
from dsh_schedule.shared.coordination.wake import Projection as Projection
from dsh_schedule.shared.coordination.wake import WakeProjection
from dsh_schedule.shared.coordination.workers import WorkerLiveness
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.settings import Settings


class Coordination:
    """Locks, phase, leases, followups, wakes and worker liveness under one key
    prefix, and the clock every process shares (``clock``: Redis's, read on first use)."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self.keys = Keys(settings.prefix)
        self.clock = SharedClock(client, self.keys,
                                 max_skew_ms=int(settings.max_clock_skew_s * 1000))
        self.locks = AgentLocks(client, self.keys, ttl_s=settings.lock_ttl_s)
        self.phase = AgentPhase(client, self.keys)
        self.leases = Leases(client, self.keys, default_queue=settings.queue)
        self.followups = Followups(client, self.keys, default_queue=settings.queue)
        self.workers = WorkerLiveness(client, self.keys)
        self.followup_stale_ms = int(settings.followup_stale_s * 1000)
        self.wakes = WakeProjection(client, self.keys, leases=self.leases,
                                    followups=self.followups,
                                    followup_stale_ms=self.followup_stale_ms,
                                    clock=self.clock, locks=self.locks)
        # Timers of the sessions no host has loaded (``Settings.wake_unloaded``).
        self.unloaded = UnloadedTimers(client, self.keys, settings)
        self._unloaded_queue = settings.queue if settings.wake_unloaded else None

    def rearm(
        self, folds: Sequence[tuple[str, FoldState]], now_ms: int, *,
        release: HeldLock | None = None,
    ) -> list[str | None]:
        """The owner's recompute: arm each agent's wake at its next decision time
        (``WakeProjection.rearm``); hold every agent's lock. Only a live agent is armed,
        on the queue its lease names; with ``release``, the lock is released in the arm's
        own write. Each agent's current wake id (None: not live, or nothing to wake for).

        With ``wake_unloaded``, a session no host serves gets the timer of an unloaded
        session at its next decision time instead, written while its lock is held."""
        if self._unloaded_queue is not None and folds:
            self.unloaded.offer(self._unloaded_queue,
                                {agent: next_wake_ms(state, now_ms) for agent, state in folds},
                                now_ms=now_ms)
        return self.wakes.rearm(folds, now_ms, release=release)

    def trigger(self, agents: Sequence[str]) -> int:
        """Enqueue immediate wakes for the agents, each on the queue its lease names, in
        ``wake_batch`` jobs; one round trip to look the queues up, one to enqueue. Returns
        the number of jobs."""
        if not agents:
            return 0
        by_queue: dict[str, list[str]] = {}
        for agent, queue in zip(agents, self.leases.queues_of(list(agents)), strict=True):
            by_queue.setdefault(queue, []).append(agent)
        return self.wakes.trigger(by_queue)

    # -- the due owner's verbs -------------------------------------------------------------

    def live_agents(self, agents: Sequence[str], now_ms: int) -> set[str]:
        """The agents a host holds a valid lease on at ``now_ms``, an expiry counted only
        ``LIVE_SLACK_MS`` after it (two processes' readings of the shared clock differ by
        up to a round trip); one round trip."""
        return set(self.leases.live_among(list(agents), now_ms=now_ms - LIVE_SLACK_MS))

    def claim_maintenance(self, agents: Sequence[str], token: str, ttl_s: float) -> list[bool]:
        """Claim each agent's maintenance phase under ``token``, in one round trip: False
        where a turn holds it (an idle waiter is registered)."""
        return self.phase.claim(agents, "maintenance", token, ttl_s)

    def end_maintenance(self, agents: Sequence[str], token: str) -> None:
        """Release the maintenance phases ``token`` holds, in one round trip, and wake the
        agents whose idle waiter the release woke."""
        released = self.phase.release(agents, "maintenance", token)
        woken = [agent for agent, release in zip(agents, released, strict=True)
                 if release is Release.WAITER_WOKEN]
        if woken:
            self.trigger(woken)

    def write_followups(self, items: Sequence[tuple[str, str, Sequence[Pair]]]) -> None:
        """Write ``(agent, text, pairs)`` followups in one round trip, unannounced
        (``announce`` them once the agents are let go)."""
        self.followups.add(items)

    def followup_entries(self, agents: Sequence[str]) -> list[list[FollowupEntry]]:
        """Each agent's followup entries, in one round trip."""
        return self.followups.entries(agents)

    def announce(self, agents: Sequence[str]) -> None:
        """Tell the agents' hosts they have followups to deliver."""
        self.followups.announce(agents)

    def projections(self, agents: Sequence[str]) -> list[Projection]:
        """The ``Projection`` of each agent (``WakeProjection.projections``)."""
        return self.wakes.projections(agents)

    def forget_agents(
        self, agents: Sequence[str], *, lock_wait_s: float,
        park: Callable[[Sequence[str]], object] | None = None,
    ) -> list[str]:
        """Drop everything Redis holds for ``agents``; their session logs keep every record
        (disposal appends no delete records). Each agent's lock is held, so no transaction
        is half-way through: the free locks taken together, and what Redis holds for
        those agents dropped in a few round trips whatever their number (the
        caller bounds the batch). An agent whose lock is busy (a transaction in flight) is
        then forgotten alone, waiting for its lock. Returns the agents whose lock stayed
        busy: nothing of theirs was dropped. ``park`` runs first under the same locks
        (the timers of unloaded sessions, ``UnloadedTimers.park``)."""
        if park is None:
            return self.locks.each_held(agents, self._forget_held, wait_s=lock_wait_s)

        def park_and_forget(held: Sequence[str]) -> None:
            # Parked before the leases go: the scheduler's pass never finds one of them
            # unloaded without its timer (a timer of a live, locked session waits).
            park(held)
            self._forget_held(held)

        return self.locks.each_held(agents, park_and_forget, wait_s=lock_wait_s)

    def _forget_held(self, agents: Sequence[str]) -> None:
        self.wakes.cancel(agents)
        self.leases.drop(agents)
        self.phase.forget(agents)
        self.followups.drop(agents)
