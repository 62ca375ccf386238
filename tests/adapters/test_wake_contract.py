"""The wake projection contract (docs/architecture.md#wake-projection), on the fake and the
real Redis.

Targets lie far in the future and ``move_due`` gets the now, so no test depends on the
clock or on rq-scheduler's own clock sample.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.wake import (
    MOVE_BATCH,
    WAKE_BATCH_FUNC,
    WAKE_FUNC,
    DueWakes,
    WakeProjection,
    decode_batch,
    wake_job_id,
)
from dsh_schedule.shared.settings import Settings

AGENT = "agent-1"
AGENT_HEX = AGENT.encode().hex()
T1 = 2_000_000_000_500  # 2033-05-18T03:33:20.500Z: score 2_000_000_000
T2 = 2_000_000_060_000  # a minute later
T3 = 2_000_000_120_250  # another minute later
RQ_OWN = ("rq:job:", "rq:queue:")
RQ_QUEUE_REGISTRY = "rq:queues"  # rq's global set of queue keys, written by any enqueue


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.prefix)


@pytest.fixture
def queue(settings: Settings) -> str:
    return settings.queue


@pytest.fixture
def wakes(redis_client: redis.Redis, keys: Keys) -> WakeProjection:
    return WakeProjection(redis_client, keys)


def schedule(client: redis.Redis, keys: Keys) -> dict[str, float]:
    """The prefixed rq-scheduler schedule: job id -> score (epoch second)."""
    members: Any = client.zrange(keys.scheduled_jobs(), 0, -1, withscores=True)
    return {k.decode(): s for k, s in members}


def queued(client: redis.Redis, queue: str) -> list[str]:
    ids: Any = client.lrange(f"rq:queue:{queue}", 0, -1)
    return [i.decode() for i in ids]


def job_exists(client: redis.Redis, job_id: str) -> bool:
    return bool(client.exists(Job.key_for(job_id)))


@pytest.mark.parametrize(
    ("agent", "target_ms", "job_id"),
    [
        (AGENT, T1, f"wake_{AGENT_HEX}_2000000000"),
        (AGENT, 2_000_000_000_000, f"wake_{AGENT_HEX}_2000000000"),
        (AGENT, 2_000_000_000_999, f"wake_{AGENT_HEX}_2000000000"),
        ("s/é ☃", T1, "wake_732fc3a920e29883_2000000000"),
    ],
    ids=["mid-second", "whole-second", "end-of-second", "non-ascii-agent"],
)
def test_wake_ids_are_hex_agent_and_epoch_second(agent: str, target_ms: int, job_id: str) -> None:
    assert wake_job_id(agent, target_ms) == job_id


def test_arm_schedules_a_wake_job_under_the_prefix(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # when an agent's wake is armed
    job_id = wakes.arm(AGENT, T1, queue)
    # then one job sits in the prefixed schedule at the whole epoch second
    assert job_id == f"wake_{AGENT_HEX}_2000000000"
    assert schedule(redis_client, keys) == {job_id: 2_000_000_000.0}
    assert wakes.is_scheduled(job_id)
    assert wakes.current(AGENT) == job_id
    # and the job runs the wake for that agent and target on the given queue, keeping no result
    job = Job.fetch(job_id, connection=redis_client)
    assert job.func_name == WAKE_FUNC
    assert tuple(job.args) == (AGENT, T1)
    assert job.kwargs == {}
    assert job.result_ttl == 0
    assert job.origin == queue
    assert queued(redis_client, queue) == []


@pytest.mark.parametrize("again_ms", [T1, T1 + 400], ids=["same-ms", "same-second"])
def test_arming_the_same_target_again_is_a_no_op(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str, again_ms: int
) -> None:
    job_id = wakes.arm(AGENT, T1, queue)
    assert wakes.arm(AGENT, again_ms, queue) == job_id
    assert schedule(redis_client, keys) == {job_id: 2_000_000_000.0}
    assert wakes.current(AGENT) == job_id
    assert tuple(Job.fetch(str(job_id), connection=redis_client).args) == (AGENT, T1)
    assert redis_client.exists(keys.wake_counter(AGENT)) == 0


@pytest.mark.parametrize("new_ms", [T2, T1 - 60_000], ids=["later", "earlier"])
def test_arming_a_new_target_supersedes_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str, new_ms: int
) -> None:
    # given a current wake
    old = wakes.arm(AGENT, T1, queue)
    assert old is not None
    # when the agent's next decision time changes
    new = wakes.arm(AGENT, new_ms, queue)
    # then only the new wake is scheduled and the old job is gone
    assert new == wake_job_id(AGENT, new_ms)
    assert schedule(redis_client, keys) == {new: float(new_ms // 1000)}
    assert not job_exists(redis_client, old)
    assert wakes.current(AGENT) == new


def test_arm_none_retires_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    old = wakes.arm(AGENT, T1, queue)
    assert old is not None
    assert wakes.arm(AGENT, None, queue) is None
    assert schedule(redis_client, keys) == {}
    assert not job_exists(redis_client, old)
    assert wakes.current(AGENT) is None
    assert redis_client.exists(keys.current_wake(AGENT)) == 0


def test_arm_none_without_a_wake_is_harmless(
    wakes: WakeProjection, redis_client: redis.Redis, queue: str
) -> None:
    assert wakes.arm(AGENT, None, queue) is None
    assert wakes.current(AGENT) is None
    assert redis_client.dbsize() == 0


def test_cancel_retires_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    old = wakes.arm(AGENT, T1, queue)
    assert old is not None
    wakes.cancel(AGENT)
    assert schedule(redis_client, keys) == {}
    assert not job_exists(redis_client, old)
    assert wakes.current(AGENT) is None


def test_wakes_of_different_agents_are_independent(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    mine = wakes.arm(AGENT, T1, queue)
    theirs = wakes.arm("agent-2", T1, queue)
    assert mine != theirs
    wakes.arm(AGENT, None, queue)
    assert schedule(redis_client, keys) == {theirs: 2_000_000_000.0}
    assert wakes.current("agent-2") == theirs


def handed_on(client: redis.Redis, queue: str) -> list[tuple[str, int]]:
    """The (agent, target) wakes the mover handed to ``queue``, in order."""
    items: list[tuple[str, int]] = []
    for job in Queue(queue, connection=client).jobs:
        assert (job.func_name, job.result_ttl) == (WAKE_BATCH_FUNC, 0)
        batch = decode_batch(job.args[0])
        assert isinstance(batch, DueWakes)
        items.extend((wake.agent, wake.target_ms) for wake in batch.wakes)
    return items


@pytest.mark.parametrize(
    ("now_ms", "moved"),
    [
        (1_999_999_999_999, 0),  # the second before the score
        (2_000_000_000_000, 1),  # the score's second, 500 ms before the target: up to 1 s early
        (T1, 1),
        (2_000_000_059_999, 1),  # past the first wake, before the second
        (T2, 2),
    ],
    ids=["before", "score-second", "target", "between", "both"],
)
def test_move_due_hands_on_only_wakes_whose_second_has_come(
    wakes: WakeProjection,
    redis_client: redis.Redis,
    keys: Keys,
    queue: str,
    now_ms: int,
    moved: int,
) -> None:
    # given two agents' wakes a minute apart
    first = wakes.arm(AGENT, T1, queue)
    second = wakes.arm("agent-2", T2, queue)
    assert first is not None and second is not None
    # when the mover runs at now
    count = wakes.move_due(now_ms)
    # then exactly the due ones are handed on, in target order, out of the schedule,
    # their own job hashes gone
    assert count == moved
    assert handed_on(redis_client, queue) == [(AGENT, T1), ("agent-2", T2)][:moved]
    assert sorted(schedule(redis_client, keys)) == sorted([first, second][moved:])
    assert [job_exists(redis_client, i) for i in (first, second)] == [
        n > moved for n in (1, 2)
    ]


def test_move_due_hands_a_wake_to_its_own_queue_in_batches(
    wakes: WakeProjection, redis_client: redis.Redis, queue: str
) -> None:
    agents = [f"agent-{i:02d}" for i in range(MOVE_BATCH + 5)]
    for i, agent in enumerate(agents):
        wakes.arm(agent, T1 - i, queue)  # later-armed wakes are earlier targets
    wakes.arm("theirs", T1, "elsewhere")
    assert wakes.move_due(T1) == len(agents) + 1
    jobs = Queue(queue, connection=redis_client).jobs
    assert [len(job.args[0]["wakes"]) for job in jobs] == [MOVE_BATCH, 5]
    assert handed_on(redis_client, queue) == [(a, T1 - i) for i, a in enumerate(agents)][::-1]
    assert handed_on(redis_client, "elsewhere") == [("theirs", T1)]


def test_a_moved_wake_hands_on_once_even_when_two_movers_run(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    wakes.arm(AGENT, T1, queue)
    other = WakeProjection(redis_client, keys)
    assert wakes.move_due(T1) == 1
    assert other.move_due(T1) == 0
    assert handed_on(redis_client, queue) == [(AGENT, T1)]


def test_a_wake_id_whose_job_still_exists_is_never_rescheduled(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given a job under the would-be wake id that is queued (it may be running)
    base = wake_job_id(AGENT, T1)
    Queue(queue, connection=redis_client).enqueue(WAKE_FUNC, AGENT, T1, job_id=base)
    # when the owner arms that target
    again = wakes.arm(AGENT, T1, queue)
    # then a suffixed id is scheduled and the queued job is left untouched
    assert again == f"{base}_1"
    assert schedule(redis_client, keys) == {again: 2_000_000_000.0}
    assert queued(redis_client, queue) == [base]
    assert job_exists(redis_client, base)
    assert wakes.current(AGENT) == again
    job = Job.fetch(again, connection=redis_client)
    assert (job.func_name, tuple(job.args), job.result_ttl, job.origin) == (
        WAKE_FUNC,
        (AGENT, T1),
        0,
        queue,
    )
    # and arming that target once more is a no-op on the suffixed id
    assert wakes.arm(AGENT, T1, queue) == again
    assert schedule(redis_client, keys) == {again: 2_000_000_000.0}


def test_re_arming_a_handed_on_target_schedules_its_id_afresh(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    first = wakes.arm(AGENT, T1, queue)
    wakes.move_due(T1)
    # the handed-on wake's own job is gone, so its id is free again
    assert wakes.arm(AGENT, T1, queue) == first
    assert schedule(redis_client, keys) == {first: 2_000_000_000.0}


def test_superseding_after_a_hand_on_leaves_the_batch_alone(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given the current wake already handed on to the queue
    wakes.arm(AGENT, T1, queue)
    wakes.move_due(T1)
    # when a new target is armed, and then the wake is retired
    new = wakes.arm(AGENT, T3, queue)
    assert new == wake_job_id(AGENT, T3)
    assert schedule(redis_client, keys) == {new: float(T3 // 1000)}
    wakes.arm(AGENT, None, queue)
    # then the batch is still there to run (its wake finds nothing due and returns)
    assert handed_on(redis_client, queue) == [(AGENT, T1)]
    assert schedule(redis_client, keys) == {}


def test_trigger_enqueues_an_immediate_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given a scheduled wake
    scheduled = wakes.arm(AGENT, T1, queue)
    # when an immediate wake is triggered
    wakes.trigger(AGENT, queue)
    # then a job for the agent, without a target, waits on the queue right away
    (job_id,) = queued(redis_client, queue)
    job = Job.fetch(job_id, connection=redis_client)
    assert (job.func_name, tuple(job.args), job.result_ttl, job.origin) == (
        WAKE_FUNC,
        (AGENT, None),
        0,
        queue,
    )
    # and the scheduled wake is untouched
    assert schedule(redis_client, keys) == {scheduled: 2_000_000_000.0}
    assert wakes.current(AGENT) == scheduled


def test_every_key_the_projection_writes_is_under_the_prefix(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given every write path: arm, no-op, supersede, move, suffixed re-arm, trigger, retire
    wakes.arm(AGENT, T1, queue)
    wakes.arm(AGENT, T1, queue)
    wakes.arm(AGENT, T2, queue)
    wakes.move_due(T2)
    Queue(queue, connection=redis_client).enqueue(
        WAKE_FUNC, AGENT, T2, job_id=wake_job_id(AGENT, T2)
    )  # a job still under the would-be id
    wakes.arm(AGENT, T2, queue)
    wakes.trigger(AGENT, queue)
    wakes.arm("agent-2", T3, queue)
    wakes.arm("agent-2", None, queue)
    # when the whole keyspace is listed
    written = {k.decode() for k in redis_client.scan_iter(match="*")}
    # then everything but rq's own job, queue and queue-registry keys carries the prefix
    ours = {k for k in written if not k.startswith(RQ_OWN) and k != RQ_QUEUE_REGISTRY}
    assert ours == {
        keys.scheduled_jobs(),
        keys.current_wake(AGENT),
        keys.wake_counter(AGENT),
    }
    assert all(k.startswith(keys.prefix) for k in ours)
    assert f"rq:queue:{queue}" in written
    assert not any(k.startswith("rq:scheduler") for k in written)
