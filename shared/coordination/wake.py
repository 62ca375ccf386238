"""The wake projection on rq-scheduler (docs/architecture.md#wake-projection).

Each live agent with work has one *current* wake: an rq-scheduler job scheduled at its
next decision time on the queue beside its session store, scored at that time's exact
millisecond (``target_ms / 1000`` epoch seconds). Arming happens under the per-agent lock.
A wake id that may be queued or running is never re-scheduled (rq's success handling
would overwrite or delete it): a new id is used instead. The mover (``mover``) hands a
wake on only once its target has come on the mover's clock, never before. Immediate wakes
(a new lease, a released phase, a rebuild) are plain rq jobs with rq's own ids. What a
wake is to rq (its job functions, id, score and batches) lives in ``wakejobs``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple

import redis
from redis.client import Pipeline
from rq import Queue
from rq.job import Job, JobStatus

from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.mover import PrefixedScheduler
from dsh_schedule.shared.coordination.scripts import (
    SCRIPT_BATCH_MAX,
    batch_replies,
    queue_script_batch,
)
from dsh_schedule.shared.coordination.wakejobs import (
    WAKE_BATCH,
    WAKE_FUNC,
    WAKE_TIMEOUT_S,
    ImmediateWakes,
    batch_job,
    wake_job_id,
    wake_score,
)

log = logging.getLogger(__name__)


# KEYS[1] the agent's current-wake pointer, KEYS[2] rq-scheduler's schedule, KEYS[3] the
# job key a wake for the new target would take; ARGV[1] 1 when there is a new target.
# Returns {the current wake id, its score, whether KEYS[3] exists (0 without a target)};
# the first two false when absent (a current wake that is not scheduled has no score).
_ARM_FACTS = """
local current = redis.call('GET', KEYS[1])
local score = false
if current then
  score = redis.call('ZSCORE', KEYS[2], current)
end
local taken = 0
if ARGV[1] == '1' then
  taken = redis.call('EXISTS', KEYS[3])
end
return {current, score, taken}
"""


# The writes of arming, for many agents in one call (``WakeProjection._write_arms``): for
# each, a scheduled rq job (the hash rq's own ``Job.save`` writes), its score in the
# schedule, the current-wake pointer, and the superseded wake's removal. Only a superseded
# wake still waiting in the schedule is ours to delete; one already handed on (its job
# hash deleted by the mover) is left alone: its batch runs, finds nothing due (or re-arms)
# and ends. KEYS[1] the schedule; then per agent the new job hash, the current-wake
# pointer, the superseded job hash (the new one when none). ARGV[1] S, then S field/value
# pairs every job shares; then V, the V field names whose values differ from job to job;
# then per agent its wake id, score, superseded wake id ('' for none) and V values.
_ARM_WRITE = """
local s = tonumber(ARGV[1])
local v = tonumber(ARGV[2 + 2 * s])
local base = 2 + 2 * s + v
local per = 3 + v
local n = (#ARGV - base) / per
-- The shared pairs and the own fields' names once; each wake fills in its own values.
local fields = {}
for j = 2, 1 + 2 * s do fields[#fields + 1] = ARGV[j] end
for j = 1, v do fields[2 * s + 2 * j - 1] = ARGV[2 + 2 * s + j] end
for i = 0, n - 1 do
  local a = base + i * per
  local id, previous = ARGV[a + 1], ARGV[a + 3]
  for j = 1, v do fields[2 * s + 2 * j] = ARGV[a + 3 + j] end
  redis.call('HSET', KEYS[2 + 3 * i], unpack(fields))
  redis.call('ZADD', KEYS[1], ARGV[a + 2], id)
  redis.call('SET', KEYS[3 + 3 * i], id)
  if previous ~= '' and previous ~= id and redis.call('ZREM', KEYS[1], previous) == 1 then
    redis.call('DEL', KEYS[4 + 3 * i])
  end
end
return n
"""

# Nothing to arm, for one agent (``queue_script_batch`` runs it for many in one call).
# KEYS[1] the schedule, KEYS[2] the current wake's job hash (the pointer when none), KEYS[3]
# the agent's current-wake pointer, KEYS[4] its wake counter; ARGV[1] the current wake id
# ('' for none), deleted as ``_ARM_WRITE`` deletes a superseded one.
_RETIRE = """
if ARGV[1] ~= '' and redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('DEL', KEYS[2])
end
redis.call('DEL', KEYS[3], KEYS[4])
return 1
"""

# The fields of a wake's job hash that differ from one wake to the next; every other field
# is the same for every wake of one arming call, and is sent once.
_OWN_FIELDS: Final = ("created_at", "data", "description", "origin")


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


class WakeProjection:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys
        # rq-scheduler's mover lock expires ``interval + 10`` s after it was taken: a
        # scheduler that dies holding it stalls the others' movers no longer than that.
        self.scheduler = PrefixedScheduler(keys, connection=client, interval=1)

    def current(self, agent: str) -> str | None:
        value = self._client.get(self._keys.current_wake(agent))
        return value.decode() if isinstance(value, bytes) else None

    def is_scheduled(self, job_id: str) -> bool:
        return self._client.zscore(self.scheduler.scheduled_jobs_key, job_id) is not None

    def arm(self, agent: str, target_ms: int | None, queue: str) -> str | None:
        """Make ``target_ms`` the agent's one current wake (None: no wake). Hold the lock."""
        return self.arm_many([ArmRequest(agent, target_ms, queue)])[0]

    def arm_many(
        self, requests: Sequence[ArmRequest], *, facts: Sequence[ArmFacts] | None = None,
        then: Callable[[Pipeline], None] | None = None,
    ) -> list[str | None]:
        """``arm`` for many agents in one pipelined read and one write; hold every agent's
        lock. Returns each agent's current wake id (None: no wake). An agent already armed
        for exactly that target keeps its wake; any other target, even in the same
        second, supersedes it. ``facts``: each request's ``ArmFacts``, when the caller has
        just read them in a pipeline of its own (``queue_arm_facts``). ``then`` queues
        more commands at the end of the write (a lock's release)."""
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
            queue_script_batch(pipe, _RETIRE, retired)
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
        return queue_script_batch(pipe, _ARM_FACTS, items)

    @staticmethod
    def arm_facts(replies: Iterator[Any], calls: int) -> list[ArmFacts]:
        """The ``ArmFacts`` from the next ``calls`` replies (``queue_arm_facts``)."""
        return [ArmFacts(previous=previous.decode() if isinstance(previous, bytes) else None,
                         previous_score=float(score) if score is not None else None,
                         taken=bool(taken))
                for previous, score, taken in batch_replies(replies, calls)]

    def _scheduled(
        self, agent: str, target_ms: int, queue: str, job_id: str, previous: str | None,
    ) -> tuple[tuple[tuple[str, Any], ...], _Scheduled]:
        """What rq-scheduler's ``enqueue_at`` writes for one wake (a scheduled rq job and
        its score, here the exact millisecond rather than the whole second), plus the
        current-wake pointer and the superseded wake's removal: the job hash's fields
        every wake shares, and the rest (``_ARM_WRITE``)."""
        job = Job.create(
            WAKE_FUNC,
            args=(agent, target_ms),
            connection=self._client,
            result_ttl=0,
            ttl=None,
            id=job_id,
            timeout=WAKE_TIMEOUT_S,
            status=JobStatus.SCHEDULED,
            origin=queue,
        )
        fields = job.to_dict()
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
            pipe.eval(_ARM_WRITE, len(keys), *keys, *args)

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
        the wall clock) to its queue, and none whose target is later; how many it moved.

        ``now_ms`` replaces the wall clock (in-process runs on an injected clock). The
        comparison is to the millisecond, so a wake is never handed on early.
        """
        return self.scheduler.move_due(wall_clock_ms() if now_ms is None else now_ms)

    @property
    def next_due_ms(self) -> int | None:
        """The earliest target left in the schedule after the last pass (None: nothing
        left, or no pass yet). A loop may wait until then rather than a whole interval,
        but with a floor: passes closer together than the wakes' spacing hand each wake
        on in an rq job of its own, and under load rq's per-job cost then makes wakes
        later, not earlier."""
        return self.scheduler.next_due_ms
