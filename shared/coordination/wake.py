"""The wake projection on rq-scheduler, in one place (docs/architecture.md#wake-projection):
what a wake is to rq, arming, and the mover; its scripts are the ``lua/`` files this module
names.

Each live agent with work has one *current* wake: an rq-scheduler job scheduled at its
next decision time on the queue beside its session store, scored at that time's exact
millisecond (``target_ms / 1000`` epoch seconds). Arming happens under the per-agent lock
(``WakeProjection.rearm``). A wake id that may be queued or running is never re-scheduled
(rq's success handling would overwrite or delete it): a new id is used instead. The mover
(``PrefixedScheduler``) hands a wake on only once its target has come on the clock every
process shares (Redis's, ``coordination.clock``), never before, in batched ``wake_batch``
jobs shared among a queue's workers.
Immediate wakes (a new lease, a released phase, a rebuild) are plain rq jobs with rq's own
ids. What a wake is to rq (its job functions, id, score and batches) is shared by the
arming side, the mover and the worker.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import msgspec
import redis
from redis.client import Pipeline
from rq import Queue, worker_registration
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from dsh_schedule.shared.clock import Clock, wall_clock_ms
from dsh_schedule.shared.coordination.clock import LIVE_SLACK_MS
from dsh_schedule.shared.coordination.followups import Followups, stream_id_ms
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import Leases
from dsh_schedule.shared.coordination.lock import HeldLock
from dsh_schedule.shared.coordination.scripts import SCRIPT_BATCH_MAX, LuaScript, item_replies
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.fold import FoldState

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from rq_scheduler import Scheduler

# rq-scheduler samples datetime.utcnow(), deprecated on newer Pythons; silence that
# module's warning only.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"rq_scheduler(\..*)?")

log = logging.getLogger(__name__)


# -- what a wake is to rq -----------------------------------------------------------------

WAKE_FUNC: Final = "dsh_schedule.worker.job.wake"
WAKE_BATCH_FUNC: Final = "dsh_schedule.worker.job.wake_batch"
WAKE_ID_PREFIX: Final = "wake_"
WAKE_BATCH: Final = 100
WAKE_TIMEOUT_S: Final = 120


def wake_score(target_ms: int) -> float:
    """A wake's score in the schedule: its target in epoch seconds, to the millisecond."""
    return target_ms / 1000


def wake_job_id(agent: str, target_ms: int) -> str:
    """``wake_<hex of agent id>_<epoch second>`` (rq ids allow only [A-Za-z0-9_-])."""
    return f"wake_{agent.encode().hex()}_{target_ms // 1000}"


def wake_agent(job_id: str) -> str:
    """The agent a wake id names (``wake_job_id``, with or without its ``_<n>`` suffix);
    ``ValueError`` when the id is not one."""
    if not job_id.startswith(WAKE_ID_PREFIX):
        raise ValueError(f"not a wake id: {job_id!r}")
    return bytes.fromhex(job_id.removeprefix(WAKE_ID_PREFIX).split("_", 1)[0]).decode()


class ScheduledWake(msgspec.Struct, frozen=True, array_like=True):
    """A scheduled wake the mover handed on: the agent and the target it was armed for."""

    agent: str
    target_ms: int


def scheduled_wake(job: Job, score: float) -> ScheduledWake:
    """The wake a scheduled wake job stands for, from its id and its ``score`` in the
    schedule (the target, ``wake_score``); a job armed before wake jobs were slimmed
    carries the agent and the target as its rq arguments, and those are used
    (docs/decisions.md#wake-jobs-slimmed-to-a-listpack). ``ValueError`` (or rq's
    ``DeserializationError``) when the job is not a readable wake."""
    if job.args:
        agent, target_ms = job.args
        return ScheduledWake(agent, target_ms)
    return ScheduledWake(wake_agent(job.id), round(score * 1000))


class DueWakes(msgspec.Struct, frozen=True, tag="due"):
    """The mover's batch: scheduled wakes that came due, each handled on its own."""

    wakes: tuple[ScheduledWake, ...]


class ImmediateWakes(msgspec.Struct, frozen=True, tag="immediate"):
    """A rebuild's batch: live agents woken now, decided together."""

    agents: tuple[str, ...]


WakeBatch = DueWakes | ImmediateWakes


def batch_payload(batch: WakeBatch) -> dict[str, Any]:
    """The rq job argument for a batch (plain JSON-able data, tagged by kind)."""
    payload: dict[str, Any] = msgspec.to_builtins(batch)
    return payload


def decode_batch(payload: Any) -> WakeBatch:
    """The batch of a ``wake_batch`` job; ``msgspec.ValidationError`` when malformed."""
    batch: WakeBatch = msgspec.convert(payload, type=WakeBatch)
    return batch


def batch_job(batch: WakeBatch) -> Any:
    """The rq enqueue data of a ``wake_batch`` job."""
    return Queue.prepare_data(
        WAKE_BATCH_FUNC, args=(batch_payload(batch),), result_ttl=0, timeout=WAKE_TIMEOUT_S * 10
    )


# -- the mover ----------------------------------------------------------------------------

_TAKE_DUE: Final = LuaScript("take_due")
# A mover call takes at most MOVE_TAKE due entries; it hands its wakes on to each queue in
# as many jobs as the queue has workers, of at most MOVE_BATCH wakes each.
MOVE_BATCH: Final = 500
MOVE_TAKE: Final = 1000
# How long the mover trusts its count of a queue's workers.
WORKERS_TTL_S: Final = 10.0


def move_batch_size(wakes: int, workers: int) -> int:
    """How many of a mover call's ``wakes`` for one queue go in one job: an even share
    for each of the queue's ``workers`` (one, when none is registered), at most
    ``MOVE_BATCH``. A burst reaches every worker at once, in as few jobs as that takes:
    each job's round trips to Redis are shared by all its wakes."""
    return max(1, min(MOVE_BATCH, -(-wakes // max(1, workers))))


class PrefixedScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler with its global keys under our prefix and an exact, batched mover.

    ``move_due(now_ms)`` replaces rq-scheduler's pass (whole-second "now", one round trip
    per job): a script takes up to ``MOVE_TAKE`` entries scored at or before ``now_ms``
    per call, oldest first, removing each wake from the schedule and deleting its job hash
    in the same step and returning the hash, so only the pass that took a wake hands it
    on. Each call's wakes go to their queues in one pipelined write, in target order, as
    ``wake_batch`` jobs: as many as the queue has workers, of at most ``MOVE_BATCH``
    wakes each (``move_batch_size``). A due job that is not one of our
    wakes is left to rq-scheduler's own ``enqueue_job``, exactly as its pass would move
    it. ``enqueue_jobs()`` is that pass at the wall clock.
    """

    def __init__(self, keys: Keys, *, clock: Clock = wall_clock_ms, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.scheduled_jobs_key = keys.scheduled_jobs()
        self.scheduler_lock_key = keys.scheduler_lock()
        self.scheduler_key = keys.scheduler()
        self.redis_scheduler_namespace_prefix = keys.scheduler_instances()
        self.next_due_ms: int | None = None
        self._workers: dict[str, tuple[float, int]] = {}  # queue -> (read at, count)

    def enqueue_jobs(self) -> int:
        """rq-scheduler's pass, made exact: ``move_due`` at the shared clock."""
        return self.move_due(self.clock())

    def move_due(self, now_ms: int) -> int:
        """Hand on every job scored at or before ``now_ms``; how many were handed on.

        Round trips: one script call per ``MOVE_TAKE`` due entries plus one pipelined
        write per call that took wakes, whatever the size of the burst (a job that is not
        a wake costs what rq-scheduler's own pass costs). A mover that fails between a
        call and its write loses at most that call's wakes, and the reconcile pass wakes
        every live agent again. Afterwards ``next_due_ms`` is the earliest score left in
        the schedule (None: nothing left).
        """
        moved = 0
        others_moved: set[str] = set()
        while True:
            taken: Any = _TAKE_DUE.run(
                self.connection, [self.scheduled_jobs_key],
                [repr(wake_score(now_ms)), MOVE_TAKE, Job.redis_job_namespace_prefix,
                 WAKE_ID_PREFIX],
            )
            next_score, entries = taken
            self.next_due_ms = None if not next_score else round(float(next_score) * 1000)
            wakes: list[tuple[str, ScheduledWake]] = []
            others: list[str] = []
            for entry in entries:
                job_id = entry[0].decode()
                if len(entry) == 1:
                    others.append(job_id)
                    continue
                try:
                    job = self._restored(job_id, entry[1])
                    if job is None:
                        continue  # an entry without its job: dropped, as rq-scheduler does
                    if job.func_name != WAKE_FUNC:
                        self.enqueue_job(job)  # not ours after all: rq-scheduler's way
                        moved += 1
                        continue
                    wake = scheduled_wake(job, float(entry[2]))
                except redis.RedisError:
                    raise
                except Exception:
                    # One unreadable job spares the rest of the chunk.
                    log.exception("scheduled job %s is unreadable: dropped", job_id)
                    continue
                wakes.append((job.origin, wake))
            moved += self._hand_on(wakes)
            repeated = False
            for job_id in others:
                if job_id in others_moved:
                    repeated = True  # a repeating job due again: the next pass moves it
                    continue
                moved += self._enqueue_other(job_id)
                others_moved.add(job_id)
            if len(entries) < MOVE_TAKE or repeated:
                return moved

    def _restored(self, job_id: str, flat_hash: list[bytes]) -> Job | None:
        if not flat_hash:
            return None
        job = Job(id=job_id, connection=self.connection)
        job.restore(dict(zip(flat_hash[::2], flat_hash[1::2], strict=True)))
        return job

    def _hand_on(self, wakes: list[tuple[str, ScheduledWake]]) -> int:
        """Enqueue taken wakes in one pipelined write: per queue, in target order, in
        ``wake_batch`` jobs sized to the queue's workers (``move_batch_size``)."""
        if not wakes:
            return 0
        by_queue: dict[str, list[ScheduledWake]] = {}
        for queue_name, wake in wakes:
            by_queue.setdefault(queue_name, []).append(wake)
        sizes = {name: move_batch_size(len(items), self._worker_count(name))
                 for name, items in by_queue.items()}
        with self.connection.pipeline() as pipe:
            for queue_name, items in by_queue.items():
                items.sort(key=lambda wake: wake.target_ms)
                size = sizes[queue_name]
                chunks = [items[i : i + size] for i in range(0, len(items), size)]
                Queue(queue_name, connection=self.connection).enqueue_many(
                    [batch_job(DueWakes(wakes=tuple(chunk))) for chunk in chunks],
                    pipeline=pipe,
                )
            pipe.execute()
        return len(wakes)

    def _worker_count(self, queue_name: str) -> int:
        """How many rq workers serve ``queue_name``, read at most every ``WORKERS_TTL_S``
        (a worker that died unregistered still counts until rq cleans it up)."""
        now = time.monotonic()
        known = self._workers.get(queue_name)
        if known is not None and now - known[0] < WORKERS_TTL_S:
            return known[1]
        count = int(self.connection.scard(worker_registration.WORKERS_BY_QUEUE_KEY % queue_name))
        self._workers[queue_name] = (now, count)
        return count

    def _enqueue_other(self, job_id: str) -> int:
        """A due job that is not a wake, moved as rq-scheduler's own pass moves it."""
        try:
            job = self.job_class.fetch(job_id, connection=self.connection)
        except NoSuchJobError:
            self.cancel(job_id)
            return 0
        self.enqueue_job(job)
        return 1


# -- arming -------------------------------------------------------------------------------

_ARM_FACTS: Final = LuaScript("arm_facts")
_ARM_WRITE: Final = LuaScript("arm_write")
_RETIRE: Final = LuaScript("retire")
_LEASE_AND_OLDEST: Final = LuaScript("lease_and_oldest")
_PROJECTION: Final = LuaScript("projection")

# The fields of a wake's job hash that differ from one wake to the next; every other field
# is the same for every wake of one arming call, and is sent once.
_OWN_FIELDS: Final = ("origin",)
# A scheduled wake's rq description: the agent is in its id, the target is its score.
WAKE_DESCRIPTION: Final = "wake"
# Fields of rq's ``to_dict`` a wake's job hash leaves out: rq restores a missing
# ``created_at`` as the moment it reads the job, and a wake's moment is its score.
_UNSTORED: Final = frozenset({"created_at"})


class _Scheduled(NamedTuple):
    """One wake for ``_ARM_WRITE``: its keys (job hash, current-wake pointer, superseded
    job hash) and its arguments (wake id, score, superseded id, ``_OWN_FIELDS`` values)."""

    keys: tuple[str, str, str]
    args: tuple[Any, ...]


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
                 clock: Clock = wall_clock_ms) -> None:
        self._client = client
        self._keys = keys
        self._leases = leases
        self._followups = followups
        self._followup_stale_ms = followup_stale_ms
        # rq-scheduler's mover lock expires ``interval + 10`` s after it was taken: a
        # scheduler that dies holding it stalls the others' movers no longer than that.
        self.scheduler = PrefixedScheduler(keys, connection=client, interval=1, clock=clock)

    def rearm_many(
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
        if not folds:
            return []
        targets = [(agent, next_wake_ms(state, now_ms)) for agent, state in folds]
        # One read for everything arming and announcing need: the server's clock, and per
        # agent its lease and queue, its oldest followup entry (one script call per
        # hundred agents), its current wake (``queue_arm_facts``).
        hosts, agent_host = self._keys.hosts(), self._keys.agent_host()
        lease_queue = self._keys.lease_queue()
        with self._client.pipeline(transaction=False) as pipe:
            pipe.time()
            calls = _LEASE_AND_OLDEST.queue_items(pipe, [
                ([agent_host, lease_queue, self._keys.followups(agent), hosts], [agent])
                for agent, _target in targets
            ])
            fact_calls = self.queue_arm_facts(pipe, targets)
            replies = iter(pipe.execute())
        seconds, micros = next(replies)
        server_ms = int(seconds) * 1000 + int(micros) // 1000
        leases = item_replies(replies, calls)
        all_facts = self.arm_facts(replies, fact_calls)
        requests: list[ArmRequest] = []
        facts: list[ArmFacts] = []
        stale_by_queue: dict[str, list[str]] = {}
        for (agent, target_ms), (score, queue, oldest), fact in zip(
                targets, leases, all_facts, strict=True):
            found = self._leases.live_queue_reply(None if score is None else float(score),
                                                 queue, now_ms=now_ms - LIVE_SLACK_MS)
            if found is None:
                continue  # not live: nothing is armed
            requests.append(ArmRequest(agent, target_ms, found))
            facts.append(fact)
            if oldest and server_ms - stream_id_ms(_text(oldest)) >= self._followup_stale_ms:
                stale_by_queue.setdefault(found, []).append(agent)
        armed = dict(zip(
            (r.agent for r in requests),
            self.arm_many(requests, facts=facts,
                                then=release.release_on if release is not None else None),
            strict=True,
        ))
        if release is not None:
            release.released_by_pipeline()
        if stale_by_queue:
            # The script checks each stream's age again, atomically.
            announced = self._followups.announce_stale(
                stale_by_queue, older_than_ms=self._followup_stale_ms
            )
            if announced:
                log.info("announced %d stale followup stream(s) again", len(announced))
        return [armed.get(agent) for agent, _state in folds]

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

    def arm_many(
        self, requests: Sequence[ArmRequest], *, facts: Sequence[ArmFacts] | None = None,
        then: Callable[[Pipeline], None] | None = None,
    ) -> list[str | None]:
        """Make each request's target the agent's one current wake (None: no wake), in one
        pipelined read and one write; hold every agent's lock. Returns each agent's current
        wake id (None: no wake). An agent already armed for exactly that target keeps its
        wake; any other target, even in the same second, supersedes it. ``facts``: each
        request's ``ArmFacts``, when the caller has just read them in a pipeline of its own
        (``queue_arm_facts``). ``then`` queues more commands at the end of the write (a
        lock's release)."""
        if facts is None:
            with self._client.pipeline(transaction=False) as pipe:
                calls = self.queue_arm_facts(pipe, [(r.agent, r.target_ms) for r in requests])
                facts = self.arm_facts(iter(pipe.execute()), calls)
        results: list[str | None] = []
        retired: list[tuple[list[str], list[str]]] = []
        scheduled: dict[tuple[tuple[str, Any], ...], list[_Scheduled]] = {}
        for r, fact in zip(requests, facts, strict=True):
            previous = fact.previous
            if r.target_ms is None:
                retired.append(self._retire_item(r.agent, previous))
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
            shared, wake = self._scheduled(r.agent, r.target_ms, r.queue, job_id, previous)
            scheduled.setdefault(shared, []).append(wake)
            results.append(job_id)
        with self._client.pipeline() as pipe:
            _RETIRE.queue_items(pipe, retired)
            for shared, wakes in scheduled.items():
                self._write_arms(pipe, shared, wakes)
            if scheduled:
                # Wake a scheduler that sleeps until its next known due time: this wake
                # may be due sooner. One element at most, so nothing grows.
                pipe.lpush(self._keys.mover_nudge(), "1")
                pipe.ltrim(self._keys.mover_nudge(), 0, 0)
            if then is not None:
                then(pipe)
            pipe.execute()
        return results

    def queue_arm_facts(self, pipe: Pipeline, targets: Sequence[tuple[str, int | None]]) -> int:
        """Queue on ``pipe`` the read ``arm_facts`` decodes for each ``(agent, target)``
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
    def arm_facts(replies: Iterator[Any], calls: int) -> list[ArmFacts]:
        """The ``ArmFacts`` from the next ``calls`` replies (``queue_arm_facts``)."""
        return [ArmFacts(previous=previous.decode() if isinstance(previous, bytes) else None,
                         previous_score=float(score) if score is not None else None,
                         taken=bool(taken))
                for previous, score, taken in item_replies(replies, calls)]

    def _scheduled(
        self, agent: str, target_ms: int, queue: str, job_id: str, previous: str | None,
    ) -> tuple[tuple[tuple[str, Any], ...], _Scheduled]:
        """What rq-scheduler's ``enqueue_at`` writes for one wake (a scheduled rq job and
        its score, here the exact millisecond rather than the whole second), slimmed
        (docs/decisions.md#wake-jobs-slimmed-to-a-listpack): no rq arguments (the agent
        is in the id, the target is the score: ``scheduled_wake``), a short description,
        no ``created_at`` and none of the empty fields rq's ``to_dict`` writes: every value
        stays under Redis's default ``hash-max-listpack-value`` whatever the agent id, so
        the hash is a listpack. Plus the current-wake pointer and the superseded wake's
        removal: the job hash's fields every wake shares, and the rest (``_ARM_WRITE``)."""
        job = Job.create(
            WAKE_FUNC,
            connection=self._client,
            description=WAKE_DESCRIPTION,
            result_ttl=0,
            ttl=None,
            id=job_id,
            timeout=WAKE_TIMEOUT_S,
            status=JobStatus.SCHEDULED,
            origin=queue,
        )
        fields = {name: value for name, value in job.to_dict().items()
                  if value != "" and name not in _UNSTORED}
        own = tuple(fields.pop(name, "") for name in _OWN_FIELDS)
        log.debug("arming %s for %s at %d", job_id, agent, target_ms)
        return tuple(fields.items()), _Scheduled(
            keys=(job.key, self._keys.current_wake(agent), Job.key_for(previous or job_id)),
            args=(job_id, repr(wake_score(target_ms)), previous or "", *own),
        )

    def _write_arms(self, pipe: Pipeline, shared: tuple[tuple[str, Any], ...],
                    wakes: list[_Scheduled]) -> None:
        """Queue ``_ARM_WRITE`` for ``wakes``, whose job hashes share the fields ``shared``:
        at most ``SCRIPT_BATCH_MAX`` wakes to a call."""
        head: list[Any] = [len(shared), *(part for pair in shared for part in pair),
                           len(_OWN_FIELDS), *_OWN_FIELDS]
        for start in range(0, len(wakes), SCRIPT_BATCH_MAX):
            chunk = wakes[start:start + SCRIPT_BATCH_MAX]
            keys = [self.scheduler.scheduled_jobs_key, *(k for w in chunk for k in w.keys)]
            args = [*head, *(a for w in chunk for a in w.args)]
            _ARM_WRITE.queue(pipe, keys, args)

    def _retire_item(self, agent: str, previous: str | None) -> tuple[list[str], list[str]]:
        """The ``_RETIRE`` item that removes the agent's current wake, if any."""
        current = self._keys.current_wake(agent)
        return ([self.scheduler.scheduled_jobs_key,
                 Job.key_for(previous) if previous is not None else current,
                 current, self._keys.wake_counter(agent)],
                [previous or ""])

    def trigger(self, agent: str, queue: str) -> None:
        """Enqueue an immediate wake; the wake decides everything under the lock."""
        Queue(queue, connection=self._client).enqueue(
            WAKE_FUNC, agent, None, result_ttl=0, job_timeout=WAKE_TIMEOUT_S
        )

    def trigger_many(self, agents_by_queue: dict[str, list[str]]) -> int:
        """Enqueue immediate wakes for many agents: one rq job per ``WAKE_BATCH`` agents
        of a queue, all in one pipelined round trip. Returns the number of jobs."""
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

    def cancel(self, agent: str) -> None:
        """Remove the agent's current wake (disposal). Hold the lock."""
        self.cancel_many([agent])

    def cancel_many(self, agents: Sequence[str]) -> None:
        """``cancel`` for many agents, whose locks are held: arming no wake for each (one
        round trip reads their current wakes, one removes them)."""
        if agents:
            self.arm_many([ArmRequest(agent, None, "") for agent in agents])

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
