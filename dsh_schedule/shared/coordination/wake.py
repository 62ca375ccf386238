"""Arming the wakes (docs/architecture.md#wake-projection): each live agent with work has
one *current* wake, a scheduled rq job (``wake_jobs``) at its next decision time on the
queue beside its session store, which the mover (``mover``) hands on once it is due.

Arming happens under the per-agent lock (``WakeProjection.rearm``). A wake id that may be
queued or running is never re-scheduled (rq's success handling would overwrite or delete
it): a new id is used instead. Immediate wakes (a new lease, a released phase, a rebuild)
are ``wake_batch`` jobs with rq's own ids. The scripts are the ``lua/`` files it names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple

import redis
from redis.client import Pipeline
from rq import Queue
from rq.job import Job

from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.coordination.clock import LIVE_SLACK_MS
from dsh_schedule.shared.coordination.followups import Followups, stream_id_ms
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import Leases
from dsh_schedule.shared.coordination.lock import AgentLocks, HeldLock
from dsh_schedule.shared.coordination.mover import PrefixedScheduler
from dsh_schedule.shared.coordination.scripts import SCRIPT_BATCH_MAX, LuaScript, item_replies
from dsh_schedule.shared.coordination.wake_jobs import (
    WAKE_BATCH,
    ImmediateWakes,
    batch_job,
    wake_job_hash,
    wake_job_id,
    wake_score,
)
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.fold import FoldState

log = logging.getLogger(__name__)

_ARM_FACTS: Final = LuaScript("arm_facts")
_ARM_WRITE: Final = LuaScript("arm_write")
_RETIRE: Final = LuaScript("retire")
_LEASE_AND_STALE: Final = LuaScript("lease_and_stale")
_PROJECTION: Final = LuaScript("projection")

# The fields of a wake's job hash that differ from one wake to the next; every other field
# is the same for every wake of one arming call, and is sent once.
_OWN_FIELDS: Final = ("origin",)


class _Scheduled(NamedTuple):
    """One wake for ``_ARM_WRITE``: its keys (job hash, current-wake pointer, superseded
    job hash, lock) and its arguments (wake id, score, superseded id, lock token,
    ``_OWN_FIELDS`` values); the request it arms."""

    keys: tuple[str, str, str, str]
    args: tuple[Any, ...]
    request: ArmRequest


class ArmRequest(NamedTuple):
    """One agent's wake to arm: its target (None: no wake) and its queue."""

    agent: str
    target_ms: int | None
    queue: str


class ArmFacts(NamedTuple):
    """What arming an agent's wake must know first: its current wake (None: none) and
    that wake's score in the schedule (None: not scheduled), and whether a job already
    holds the id the new wake would take."""

    previous: str | None
    previous_score: float | None
    taken: bool


class _Lease(NamedTuple):
    """What re-arming one agent reads first: the queue its lease names when the lease is
    valid (None: not live), whether its followup stream holds an entry older than the
    stale age, and its ``ArmFacts``."""

    queue: str | None
    stale: bool
    facts: ArmFacts


class Projection(NamedTuple):
    """What Redis holds for one agent's wake and followups, as the reconcile pass checks it.

    ``wake``: the current-wake pointer (None: no current wake). ``wake_held``: that wake's
    job is in the schedule or its rq job hash exists. ``oldest_followup_ms``: when (server
    epoch ms) the oldest entry still in its followup stream was added (None: empty).
    """

    wake: str | None
    wake_held: bool
    oldest_followup_ms: int | None


class WakeProjection:
    """Arms, moves and reads the wakes of one deployment's agents."""

    def __init__(self, client: redis.Redis, keys: Keys, *, leases: Leases,
                 followups: Followups, followup_stale_ms: int,
                 clock: Clock = wall_clock_ms, locks: AgentLocks | None = None) -> None:
        self._client = client
        self._keys = keys
        # Whose locks an arm checks are still held (None: no check).
        self._locks = locks
        self._leases = leases
        self._followups = followups
        self._followup_stale_ms = followup_stale_ms
        # rq-scheduler's mover lock expires ``interval + 10`` s after it was taken: a
        # scheduler that dies holding it stalls the others' movers no longer than that.
        self.scheduler = PrefixedScheduler(keys, connection=client, interval=1, clock=clock)

    def rearm(
        self, folds: Sequence[tuple[str, FoldState]], now_ms: int, *,
        release: HeldLock | None = None,
    ) -> list[str | None]:
        """Arm each agent's wake at its next decision time (``next_wake_ms``); hold every
        agent's lock. Only a live agent is armed, on the queue its lease names; with
        ``release``, the lock is released in the arm's own write. Each agent's current
        wake id (None: not live, or nothing to wake for).

        Re-arming also restores the other half of the followup projection: a live agent
        whose stream still holds an entry older than ``followup_stale_s`` is announced
        again on its queue's ready stream (its first announcement, or the host holding it,
        was lost), so the reconcile pass repairs a lost announcement by enqueueing a wake.
        """
        return self.arm_at([(agent, next_wake_ms(state, now_ms)) for agent, state in folds],
                           now_ms, release=release)

    def arm_at(
        self, targets: Sequence[tuple[str, int | None]], now_ms: int, *,
        release: HeldLock | None = None,
    ) -> list[str | None]:
        """``rearm`` for targets already decided (None: no wake), each agent's lock held."""
        if not targets:
            return []
        requests: list[ArmRequest] = []
        facts: list[ArmFacts] = []
        stale: dict[str, list[str]] = {}
        for (agent, target_ms), lease in zip(
                targets, self._leases_of(targets, now_ms=now_ms), strict=True):
            if lease.queue is None:
                continue  # not live: nothing is armed
            requests.append(ArmRequest(agent, target_ms, lease.queue))
            facts.append(lease.facts)
            if lease.stale:
                stale.setdefault(lease.queue, []).append(agent)
        armed = self.arm(requests, facts=facts, release=release)
        if stale:
            # The script checks each stream's age again, atomically.
            announced = self._followups.announce_stale(
                stale, older_than_ms=self._followup_stale_ms)
            if announced:
                log.info("announced %d stale followup stream(s) again", len(announced))
        current = dict(zip((r.agent for r in requests), armed, strict=True))
        return [current.get(agent) for agent, _target in targets]

    def _leases_of(
        self, targets: Sequence[tuple[str, int | None]], *, now_ms: int,
    ) -> list[_Lease]:
        """Each agent's ``_Lease``, in one round trip (one script call per hundred agents
        for the leases and streams, as many for the ``ArmFacts``); a lease is valid while
        its expiry is at or after ``now_ms`` less ``LIVE_SLACK_MS``."""
        hosts, agent_host = self._keys.hosts(), self._keys.agent_host()
        lease_queue = self._keys.lease_queue()
        with self._client.pipeline(transaction=False) as pipe:
            calls = _LEASE_AND_STALE.queue_items(pipe, [
                ([agent_host, lease_queue, self._keys.followups(agent), hosts],
                 [agent, self._followup_stale_ms])
                for agent, _target in targets
            ])
            fact_calls = self._queue_arm_facts(pipe, targets)
            replies = iter(pipe.execute())
        leases = item_replies(replies, calls)
        return [_Lease(self._leases.live_queue_reply(expiry, queue, now_ms=now_ms - LIVE_SLACK_MS),
                       bool(stale), facts)
                for (expiry, queue, stale), facts
                in zip(leases, self._arm_facts(replies, fact_calls), strict=True)]

    def projections(self, agents: Sequence[str]) -> list[Projection]:
        """The ``Projection`` of each agent, in one round trip however many agents (one
        script call per hundred; the caller bounds the batch); it reads only."""
        if not agents:
            return []
        scheduled, job_prefix = self.scheduler.scheduled_jobs_key, Job.key_for("")
        replies = _PROJECTION.run_items(self._client, [
            ([self._keys.current_wake(agent), self._keys.followups(agent), scheduled],
             [job_prefix])
            for agent in agents
        ])
        return [Projection(_text(wake) if wake is not None else None, bool(held),
                           stream_id_ms(_text(first)) if first is not None else None)
                for wake, first, held in replies]

    def arm(
        self, requests: Sequence[ArmRequest], *, facts: Sequence[ArmFacts] | None = None,
        release: HeldLock | None = None,
    ) -> list[str | None]:
        """Make each request's target the agent's one current wake (None: no wake), in one
        pipelined read and one write; hold every agent's lock. Returns each agent's current
        wake id (None: no wake). An agent already armed for exactly that target keeps its
        wake; any other target, even in the same second, supersedes it. ``facts``: each
        request's ``ArmFacts``, when the caller has just read them. With ``release``, the
        lock is released in the same write.

        The write is made only while this thread's lock of the agent still holds in Redis
        (``AgentLocks.token_of``): a holder paused past its lock's time to live would
        otherwise arm from a log that another writer has since appended to, replacing the
        wake that writer armed. Such an agent is woken at once instead (its wake re-reads
        the log and arms it), and its wake id answered as None."""
        if facts is None:
            with self._client.pipeline(transaction=False) as pipe:
                calls = self._queue_arm_facts(pipe, [(r.agent, r.target_ms) for r in requests])
                facts = self._arm_facts(iter(pipe.execute()), calls)
        results: list[str | None] = []
        retired: list[tuple[list[str], list[str]]] = []
        retiring: list[ArmRequest] = []
        scheduled: dict[tuple[tuple[str, Any], ...], list[_Scheduled]] = {}
        position: dict[str, int] = {}
        for r, fact in zip(requests, facts, strict=True):
            previous = fact.previous
            position[r.agent] = len(results)
            if r.target_ms is None:
                retired.append(self._retire_item(r.agent, previous))
                retiring.append(r)
                results.append(None)
                continue
            job_id = wake_job_id(r.agent, r.target_ms)
            if (
                previous is not None
                and (previous == job_id or previous.startswith(f"{job_id}_"))
                and fact.previous_score == wake_score(r.target_ms)
            ):
                results.append(previous)  # already armed for this very target
                continue
            if fact.taken:
                # Scheduled for another millisecond, queued, running or failed under
                # this id: never re-schedule it.
                job_id = f"{job_id}_{self._client.incr(self._keys.wake_counter(r.agent))}"
            shared, wake = self._scheduled(r, job_id, previous)
            scheduled.setdefault(shared, []).append(wake)
            results.append(job_id)
        with self._client.pipeline() as pipe:
            retire_calls = _RETIRE.queue_items(pipe, retired)
            chunks = [chunk for shared, wakes in scheduled.items()
                      for chunk in self._write_arms(pipe, shared, wakes)]
            if scheduled:
                # Wake a scheduler that sleeps until its next known due time: this wake
                # may be due sooner. One element at most, so nothing grows.
                pipe.lpush(self._keys.mover_nudge(), "1")
                pipe.ltrim(self._keys.mover_nudge(), 0, 0)
            if release is not None:
                release.release_on(pipe)
            replies = iter(pipe.execute())
        if release is not None:
            release.released_by_pipeline()
        lost = [r for r, done in zip(retiring, item_replies(replies, retire_calls),
                                     strict=True) if not done]
        lost.extend(chunk[i - 1] for chunk in chunks for i in next(replies))
        if lost:
            for r in lost:
                results[position[r.agent]] = None
            self._woken_instead(lost)
        return results

    def _woken_instead(self, lost: Sequence[ArmRequest]) -> None:
        """Wake at once the agents whose arm found their lock gone: each wake re-reads its
        log under the lock and arms from there."""
        by_queue: dict[str, list[str]] = {}
        for r in lost:
            if r.queue:
                by_queue.setdefault(r.queue, []).append(r.agent)
        log.warning("%d agent(s) not armed: their lock expired before the arm; woken to arm "
                    "from their logs (docs/architecture.md#wake-projection)", len(lost))
        if by_queue:
            self.trigger(by_queue)

    def _queue_arm_facts(self, pipe: Pipeline, targets: Sequence[tuple[str, int | None]]) -> int:
        """Queue on ``pipe`` the read ``_arm_facts`` decodes for each ``(agent, target)``
        (one script call per hundred agents; returns how many): the agent's current wake
        and its score, and whether a job already holds the id a wake for the target would
        take."""
        items: list[tuple[list[str], list[int]]] = []
        for agent, target_ms in targets:
            current = self._keys.current_wake(agent)
            job = current if target_ms is None else Job.key_for(wake_job_id(agent, target_ms))
            items.append(([current, self.scheduler.scheduled_jobs_key, job],
                          [0 if target_ms is None else 1]))
        return _ARM_FACTS.queue_items(pipe, items)

    @staticmethod
    def _arm_facts(replies: Iterator[Any], calls: int) -> list[ArmFacts]:
        """The ``ArmFacts`` from the next ``calls`` replies (``_queue_arm_facts``)."""
        return [ArmFacts(previous=previous.decode() if isinstance(previous, bytes) else None,
                         previous_score=float(score) if score is not None else None,
                         taken=bool(taken))
                for previous, score, taken in item_replies(replies, calls)]

    def _token(self, agent: str) -> bytes:
        """The token the agent's arm checks its lock for (b'': no check)."""
        token = self._locks.token_of(agent) if self._locks is not None else None
        return b"" if token is None else token

    def _scheduled(
        self, r: ArmRequest, job_id: str, previous: str | None,
    ) -> tuple[tuple[tuple[str, Any], ...], _Scheduled]:
        """One wake's writes (``_ARM_WRITE``): its job hash (``wake_job_hash``) and its score,
        the exact millisecond rather than rq-scheduler's whole second, the current-wake
        pointer and the superseded wake's removal, while the agent's lock holds. Returns
        the job hash's fields every wake shares, and the rest."""
        assert r.target_ms is not None
        fields = wake_job_hash(self._client, job_id, r.queue)
        own = tuple(fields.pop(name, "") for name in _OWN_FIELDS)
        log.debug("arming %s for %s at %d", job_id, r.agent, r.target_ms)
        return tuple(fields.items()), _Scheduled(
            keys=(Job.key_for(job_id), self._keys.current_wake(r.agent),
                  Job.key_for(previous or job_id), self._keys.lock(r.agent)),
            args=(job_id, repr(wake_score(r.target_ms)), previous or "",
                  self._token(r.agent), *own),
            request=r,
        )

    def _write_arms(self, pipe: Pipeline, shared: tuple[tuple[str, Any], ...],
                    wakes: list[_Scheduled]) -> list[list[ArmRequest]]:
        """Queue ``_ARM_WRITE`` for ``wakes``, whose job hashes share the fields ``shared``:
        at most ``SCRIPT_BATCH_MAX`` wakes to a call. The requests of each call, in order."""
        head: list[Any] = [len(shared), *(part for pair in shared for part in pair),
                           len(_OWN_FIELDS), *_OWN_FIELDS]
        chunks: list[list[ArmRequest]] = []
        for start in range(0, len(wakes), SCRIPT_BATCH_MAX):
            chunk = wakes[start:start + SCRIPT_BATCH_MAX]
            keys = [self.scheduler.scheduled_jobs_key, *(k for w in chunk for k in w.keys)]
            args = [*head, *(a for w in chunk for a in w.args)]
            _ARM_WRITE.queue(pipe, keys, args)
            chunks.append([w.request for w in chunk])
        return chunks

    def _retire_item(self, agent: str, previous: str | None) -> tuple[list[str], list[Any]]:
        """The ``_RETIRE`` item that removes the agent's current wake, if any, while its
        lock holds."""
        current = self._keys.current_wake(agent)
        return ([self.scheduler.scheduled_jobs_key,
                 Job.key_for(previous) if previous is not None else current,
                 current, self._keys.wake_counter(agent), self._keys.lock(agent)],
                [previous or "", self._token(agent)])

    def trigger(self, agents_by_queue: dict[str, list[str]]) -> int:
        """Enqueue immediate wakes (the wake decides everything under the lock): one rq
        job per ``WAKE_BATCH`` agents of a queue, all in one pipelined round trip.
        Returns the number of jobs."""
        jobs = 0
        with self._client.pipeline() as pipe:
            for queue_name, agents in agents_by_queue.items():
                queue = Queue(queue_name, connection=self._client)
                batches = [agents[i : i + WAKE_BATCH] for i in range(0, len(agents), WAKE_BATCH)]
                queue.enqueue_many(
                    [batch_job(ImmediateWakes(agents=tuple(batch))) for batch in batches],
                    pipeline=pipe,
                )
                jobs += len(batches)
            pipe.execute()
        return jobs

    def cancel(self, agents: Sequence[str]) -> None:
        """Remove the agents' current wakes (disposal); hold their locks. Arming no wake
        for each: one round trip reads their current wakes, one removes them."""
        if agents:
            self.arm([ArmRequest(agent, None, "") for agent in agents])

    def move_due(self, now_ms: int | None = None) -> int:
        """One mover pass: hand every wake whose target is at or before ``now_ms`` (default:
        the clock every process shares, Redis's) to its queue, and none whose target is
        later; how many it moved.

        ``now_ms`` replaces the shared clock (in-process runs on an injected clock). The
        comparison is to the millisecond, so a wake is never handed on early.
        """
        return self.scheduler.move_due(self.scheduler.clock() if now_ms is None else now_ms)

    @property
    def next_due_ms(self) -> int | None:
        """The earliest target left in the schedule after the last pass (None: nothing
        left, or no pass yet). A loop may wait until then rather than a whole interval,
        but with a floor: passes closer together than the wakes' spacing hand each wake
        on in an rq job of its own, and under load rq's per-job cost then makes wakes
        later, not earlier."""
        return self.scheduler.next_due_ms


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
