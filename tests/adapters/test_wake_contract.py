"""The wake projection contract (docs/architecture.md#wake-projection), on the fake and the
real Redis.

Targets lie far in the future and ``move_due`` gets the now, so no test depends on the
clock or on rq-scheduler's own clock sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.mover import MOVE_BATCH, MOVE_TAKE, move_batch_size
from dsh_schedule.shared.coordination.wake import ArmRequest, WakeProjection
from dsh_schedule.shared.coordination.wake_jobs import (
    WAKE_BATCH_FUNC,
    WAKE_DESCRIPTION,
    WAKE_FUNC,
    WAKE_TIMEOUT_S,
    DueWakes,
    ImmediateWakes,
    ScheduledWake,
    decode_wakes,
    scheduled_wake,
    wake_agent,
    wake_job_id,
)
from dsh_schedule.shared.settings import Settings

AGENT = "agent-1"
AGENT_HEX = AGENT.encode().hex()
T1 = 2_000_000_000_500  # 2033-05-18T03:33:20.500Z: score 2_000_000_000.5
T2 = 2_000_000_060_000  # a minute later
T3 = 2_000_000_120_250  # another minute later
S1 = 2_000_000_000.5  # T1's score: the target in epoch seconds, to the millisecond
RQ_OWN = ("rq:job:", "rq:queue:")
RQ_QUEUE_REGISTRY = "rq:queues"  # rq's global set of queue keys, written by any enqueue
OTHER_FUNC = "tests.adapters.test_wake_contract.not_a_wake"


def not_a_wake() -> None:
    """A job of some other kind in the same schedule (never run here)."""


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.prefix)


@pytest.fixture
def queue(settings: Settings) -> str:
    return settings.queue


@pytest.fixture
def wakes(redis_client: redis.Redis, settings: Settings) -> WakeProjection:
    return Coordination(redis_client, settings).wakes


def schedule(client: redis.Redis, keys: Keys) -> dict[str, float]:
    """The prefixed rq-scheduler schedule: job id -> score (epoch seconds)."""
    members: Any = client.zrange(keys.scheduled_jobs(), 0, -1, withscores=True)
    return {k.decode(): s for k, s in members}


def queued(client: redis.Redis, queue: str) -> list[str]:
    ids: Any = client.lrange(f"rq:queue:{queue}", 0, -1)
    return [i.decode() for i in ids]


def job_exists(client: redis.Redis, job_id: str) -> bool:
    return bool(client.exists(Job.key_for(job_id)))


def armed_wake(client: redis.Redis, keys: Keys, job_id: str) -> tuple[str, int]:
    """The (agent, target) a scheduled wake job stands for, as the mover reads it: the job
    restored by rq and its score in the schedule."""
    wake = scheduled_wake(Job.fetch(job_id, connection=client), schedule(client, keys)[job_id])
    return (wake.agent, wake.target_ms)


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
    assert wake_agent(job_id) == wake_agent(f"{job_id}_7") == agent


def test_arm_schedules_a_wake_job_under_the_prefix(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # when an agent's wake is armed
    job_id = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    # then one job sits in the prefixed schedule at the target's exact millisecond
    assert job_id == f"wake_{AGENT_HEX}_2000000000"
    assert schedule(redis_client, keys) == {job_id: S1}
    assert wakes.projections([AGENT])[0].wake == job_id
    # and the job (restored by rq) stands for the wake of that agent and target on the given
    # queue, keeping no result
    job = Job.fetch(job_id, connection=redis_client)
    assert job.func_name == WAKE_FUNC
    assert scheduled_wake(job, schedule(redis_client, keys)[job_id]) == ScheduledWake(AGENT, T1)
    assert job.kwargs == {}
    assert job.result_ttl == 0
    assert job.origin == queue
    assert queued(redis_client, queue) == []


def test_a_wake_job_is_the_job_rq_itself_saves(
    wakes: WakeProjection, redis_client: redis.Redis, queue: str
) -> None:
    # given the job rq's own Job.save writes for the same wake, under another id
    job_id = str(wakes.arm([ArmRequest(AGENT, T1, queue)])[0])
    reference = Job.create(WAKE_FUNC, connection=redis_client, description=WAKE_DESCRIPTION,
                           result_ttl=0, ttl=None, id="reference", timeout=WAKE_TIMEOUT_S,
                           status=JobStatus.SCHEDULED, origin=queue)
    reference.save()
    ours = Job.fetch(job_id, connection=redis_client).to_dict()
    theirs = Job.fetch("reference", connection=redis_client).to_dict()
    # then rq restores an armed wake as that very job (only the instant differs)
    assert ours.keys() == theirs.keys()
    assert {k: v for k, v in ours.items() if k != "created_at"} == {
        k: v for k, v in theirs.items() if k != "created_at"}
    # and the stored hash holds no field rq reads as absent when it is empty
    stored: Any = redis_client.hgetall(Job.key_for(job_id))
    assert all(stored.values())


LONG_AGENT = "session/" + "é-☃" * 60  # an id far longer than any hash value may be


@pytest.mark.redis
@pytest.mark.parametrize("agent", [AGENT, "0123456789abcdef", LONG_AGENT],
                         ids=["short", "sixteen", "long"])
def test_an_idle_agents_wake_job_is_a_listpack(
    real_redis: redis.Redis, settings: Settings, agent: str
) -> None:
    # given an agent's wake armed on a real redis-server, at its default configuration
    wakes = Coordination(real_redis, settings).wakes
    job_id = str(wakes.arm([ArmRequest(agent, T1, settings.queue)])[0])
    # then its job hash is a compact listpack, whatever the length of the agent id
    assert real_redis.object("encoding", Job.key_for(job_id)) == b"listpack"
    # and the mover still hands on that agent's wake for that target
    assert wakes.move_due(T1) == 1
    assert handed_on(real_redis, settings.queue) == [(agent, T1)]


def old_format_wake(client: redis.Redis, keys: Keys, agent: str, target_ms: int,
                    queue: str) -> str:
    """A wake armed as the code before the slimmed job hash armed it: the hash rq's own
    ``Job.save`` writes, with the agent and the target as its rq arguments."""
    job_id = wake_job_id(agent, target_ms)
    Job.create(WAKE_FUNC, args=(agent, target_ms), connection=client, result_ttl=0, ttl=None,
               id=job_id, timeout=WAKE_TIMEOUT_S, status=JobStatus.SCHEDULED,
               origin=queue).save()
    client.zadd(keys.scheduled_jobs(), {job_id: target_ms / 1000})
    client.set(keys.current_wake(agent), job_id)
    return job_id


def test_a_wake_armed_before_the_slimmed_job_hash_still_moves(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given a wake left in Redis by the previous code, beside one armed now
    old = old_format_wake(redis_client, keys, AGENT, T1, queue)
    wakes.arm([ArmRequest("agent-2", T1 + 1, queue)])
    # then the new code knows it as the agent's current wake, for that target
    assert wakes.projections([AGENT])[0].wake == old
    assert wakes.arm([ArmRequest(AGENT, T1, queue)])[0] == old
    # and the mover hands on both, each for its own agent and target, once
    assert wakes.move_due(T2) == 2
    assert handed_on(redis_client, queue) == [(AGENT, T1), ("agent-2", T1 + 1)]
    assert schedule(redis_client, keys) == {}
    assert not job_exists(redis_client, old)
    assert wakes.move_due(T3) == 0


def test_arming_more_wakes_than_one_call_holds_writes_each_once(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given 250 agents armed once (three write calls), then each superseded by a new target
    agents = [f"agent-{i:03d}" for i in range(250)]
    first = wakes.arm([ArmRequest(a, T1 + i, queue) for i, a in enumerate(agents)])
    second = wakes.arm([ArmRequest(a, T2 + i, queue) for i, a in enumerate(agents)])
    # then each agent has exactly its newest wake, scheduled at its own millisecond
    assert schedule(redis_client, keys) == {
        str(job_id): (T2 + i) / 1000 for i, job_id in enumerate(second)}
    for i, (agent, old, new) in enumerate(zip(agents, first, second, strict=True)):
        assert wakes.projections([agent])[0].wake == new
        assert armed_wake(redis_client, keys, str(new)) == (agent, T2 + i)
        assert not job_exists(redis_client, str(old))


def test_arming_the_same_target_again_is_a_no_op(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    job_id = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert wakes.arm([ArmRequest(AGENT, T1, queue)])[0] == job_id
    assert schedule(redis_client, keys) == {job_id: S1}
    assert wakes.projections([AGENT])[0].wake == job_id
    assert armed_wake(redis_client, keys, str(job_id)) == (AGENT, T1)
    assert redis_client.exists(keys.wake_counter(AGENT)) == 0


@pytest.mark.parametrize("new_ms", [T2, T1 - 60_000], ids=["later", "earlier"])
def test_arming_a_new_target_supersedes_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str, new_ms: int
) -> None:
    # given a current wake
    old = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert old is not None
    # when the agent's next decision time changes
    new = wakes.arm([ArmRequest(AGENT, new_ms, queue)])[0]
    # then only the new wake is scheduled and the old job is gone
    assert new == wake_job_id(AGENT, new_ms)
    assert schedule(redis_client, keys) == {new: new_ms / 1000}
    assert not job_exists(redis_client, old)
    assert wakes.projections([AGENT])[0].wake == new


@pytest.mark.parametrize("new_ms", [T1 + 1, T1 - 500, T1 + 499], ids=["+1ms", "-500ms", "+499ms"])
def test_a_new_target_in_the_same_second_supersedes_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str, new_ms: int
) -> None:
    # given a current wake, still waiting in the schedule
    old = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert old is not None
    # when the agent's next decision time moves by less than a second
    new = wakes.arm([ArmRequest(AGENT, new_ms, queue)])[0]
    # then the new target is scheduled at its own millisecond under a fresh id (the old id's
    # job still existed when the new one was chosen), and the old wake is gone
    assert new == f"{old}_1"
    assert schedule(redis_client, keys) == {new: new_ms / 1000}
    assert not job_exists(redis_client, old)
    assert wakes.projections([AGENT])[0].wake == new
    assert armed_wake(redis_client, keys, new) == (AGENT, new_ms)


def test_arm_none_retires_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    old = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert old is not None
    assert wakes.arm([ArmRequest(AGENT, None, queue)])[0] is None
    assert schedule(redis_client, keys) == {}
    assert not job_exists(redis_client, old)
    assert wakes.projections([AGENT])[0].wake is None
    assert redis_client.exists(keys.current_wake(AGENT)) == 0


def test_arm_none_without_a_wake_is_harmless(
    wakes: WakeProjection, redis_client: redis.Redis, queue: str
) -> None:
    assert wakes.arm([ArmRequest(AGENT, None, queue)])[0] is None
    assert wakes.projections([AGENT])[0].wake is None
    assert redis_client.dbsize() == 0


def test_cancel_retires_the_current_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    old = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert old is not None
    wakes.cancel([AGENT])
    assert schedule(redis_client, keys) == {}
    assert not job_exists(redis_client, old)
    assert wakes.projections([AGENT])[0].wake is None


@pytest.mark.parametrize("target", [T2, None], ids=["re-arm", "retire"])
def test_an_arm_whose_lock_expired_leaves_the_wake_a_later_holder_armed(
    redis_client: redis.Redis, settings: Settings, keys: Keys, queue: str,
    target: int | None,
) -> None:
    # given a holder paused past its lock's time to live, and another process that took
    # the lock since and armed the agent's wake from a longer log
    stale, other = Coordination(redis_client, settings), Coordination(redis_client, settings)
    with stale.locks.hold(AGENT, wait_s=1):
        redis_client.delete(keys.lock(AGENT))  # expired
        with other.locks.hold(AGENT, wait_s=1):
            armed = other.wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
        # when the first holder arms (or retires) from what it read before
        got = stale.wakes.arm([ArmRequest(AGENT, target, queue)])
    # then the later wake stands, and the agent is woken at once to arm from its log
    assert got == [None]
    assert schedule(redis_client, keys) == {str(armed): S1}
    assert len(queued(redis_client, queue)) == 1


def test_an_arm_while_its_lock_holds_writes(
    redis_client: redis.Redis, settings: Settings, keys: Keys, queue: str
) -> None:
    coordination = Coordination(redis_client, settings)
    with coordination.locks.hold(AGENT, wait_s=1):
        armed = coordination.wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
        assert schedule(redis_client, keys) == {str(armed): S1}
        assert coordination.wakes.arm([ArmRequest(AGENT, None, queue)]) == [None]
    assert schedule(redis_client, keys) == {}
    assert queued(redis_client, queue) == []


def test_wakes_of_different_agents_are_independent(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    mine = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    theirs = wakes.arm([ArmRequest("agent-2", T1, queue)])[0]
    assert mine != theirs
    wakes.arm([ArmRequest(AGENT, None, queue)])
    assert schedule(redis_client, keys) == {theirs: S1}
    assert wakes.projections(["agent-2"])[0].wake == theirs


def handed_on(client: redis.Redis, queue: str) -> list[tuple[str, int]]:
    """The (agent, target) wakes the mover handed to ``queue``, in order."""
    items: list[tuple[str, int]] = []
    for job in Queue(queue, connection=client).jobs:
        assert (job.func_name, job.result_ttl) == (WAKE_BATCH_FUNC, 0)
        batch = decode_wakes(job.args[0])
        assert isinstance(batch, DueWakes)
        items.extend((wake.agent, wake.target_ms) for wake in batch.wakes)
    return items


def handed_on_among_others(client: redis.Redis, queue: str) -> list[tuple[str, int]]:
    """``handed_on``, skipping the queue's jobs of other kinds."""
    items: list[tuple[str, int]] = []
    for job in Queue(queue, connection=client).jobs:
        if job.func_name == WAKE_BATCH_FUNC:
            batch = decode_wakes(job.args[0])
            assert isinstance(batch, DueWakes)
            items.extend((wake.agent, wake.target_ms) for wake in batch.wakes)
    return items


@pytest.mark.parametrize(
    ("now_ms", "moved"),
    [
        (1_999_999_999_999, 0),  # the second before the target's
        (2_000_000_000_000, 0),  # the target's second, 500 ms before the target
        (T1 - 1, 0),  # a millisecond before the target
        (T1, 1),
        (2_000_000_059_999, 1),  # past the first wake, before the second
        (T2, 2),
    ],
    ids=["second-before", "target-second", "ms-before", "target", "between", "both"],
)
def test_move_due_hands_on_only_wakes_whose_target_has_come(
    wakes: WakeProjection,
    redis_client: redis.Redis,
    keys: Keys,
    queue: str,
    now_ms: int,
    moved: int,
) -> None:
    # given two agents' wakes a minute apart
    first = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    second = wakes.arm([ArmRequest("agent-2", T2, queue)])[0]
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
        # later-armed wakes are earlier targets
        wakes.arm([ArmRequest(agent, T1 - i, queue)])
    wakes.arm([ArmRequest("theirs", T1, "elsewhere")])
    assert wakes.move_due(T1) == len(agents) + 1
    jobs = Queue(queue, connection=redis_client).jobs
    # no worker is registered on the queue: as one worker's, MOVE_BATCH to a job
    assert [len(job.args[0]["wakes"]) for job in jobs] == [MOVE_BATCH, 5]
    assert handed_on(redis_client, queue) == [(a, T1 - i) for i, a in enumerate(agents)][::-1]
    assert handed_on(redis_client, "elsewhere") == [("theirs", T1)]


def test_move_due_shares_a_burst_among_the_queues_workers(
    wakes: WakeProjection, redis_client: redis.Redis, queue: str
) -> None:
    # given three workers registered on the queue, as rq registers them
    redis_client.sadd(WORKERS_BY_QUEUE_KEY % queue, "rq:worker:a", "rq:worker:b", "rq:worker:c")
    for i in range(300):
        wakes.arm([ArmRequest(f"agent-{i:03d}", T1 - 300 + i, queue)])
    # when 300 wakes come due at once, then each worker gets a job of 100
    assert wakes.move_due(T1) == 300
    jobs = Queue(queue, connection=redis_client).jobs
    assert [len(job.args[0]["wakes"]) for job in jobs] == [100, 100, 100]
    assert handed_on(redis_client, queue) == [(f"agent-{i:03d}", T1 - 300 + i)
                                              for i in range(300)]


@pytest.mark.parametrize(("wakes", "workers", "size"), [
    (1, 0, 1), (1, 4, 1), (7, 2, 4), (300, 3, 100), (1000, 2, 500), (1000, 1, MOVE_BATCH),
    (1000, 0, MOVE_BATCH), (10, 20, 1),
])
def test_a_mover_call_is_shared_evenly_and_no_job_passes_the_bound(
    wakes: int, workers: int, size: int
) -> None:
    assert move_batch_size(wakes, workers) == size


def test_no_wake_is_handed_on_before_its_millisecond(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given one wake at each millisecond T+1 ... T+999 of one second, armed in shuffled order
    second = 2_000_000_000_000
    targets = [second + (ms * 379) % 1000 for ms in range(1, 1000)]
    wakes.arm([ArmRequest(f"agent-{t % 1000:03d}", t, queue) for t in targets])
    # when the mover runs half-way through that second
    assert wakes.move_due(second + 500) == 500
    # then exactly the wakes at or before T+500 are handed on, in target order
    assert handed_on(redis_client, queue) == [
        (f"agent-{ms:03d}", second + ms) for ms in range(1, 501)
    ]
    left = schedule(redis_client, keys)
    assert sorted(round(score * 1000) for score in left.values()) == [
        second + ms for ms in range(501, 1000)
    ]
    assert wakes.next_due_ms == second + 501
    # and the rest follow once their own milliseconds have come
    assert wakes.move_due(second + 998) == 498
    assert wakes.next_due_ms == second + 999
    assert wakes.move_due(second + 999) == 1
    assert handed_on(redis_client, queue)[500:] == [
        (f"agent-{ms:03d}", second + ms) for ms in range(501, 1000)
    ]
    assert schedule(redis_client, keys) == {}
    assert wakes.next_due_ms is None


def test_a_job_of_another_kind_is_moved_as_rq_scheduler_moves_it(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given a wake and two jobs of another kind in the same schedule: a one-shot at T1's
    # whole second and a repeating one
    wake = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert wake is not None
    at = datetime.fromtimestamp(T1 // 1000, UTC)
    wakes.scheduler.enqueue_at(at, OTHER_FUNC, job_id="other-once", queue_name=queue)
    wakes.scheduler.schedule(at, OTHER_FUNC, interval=3600, id="other-every", queue_name=queue)
    # when the mover runs in that second, before the wake's target
    assert wakes.move_due(T1 - 1) == 2
    # then each other job is queued under its own id, once, as rq-scheduler queues it;
    # the one-shot leaves the schedule and the repeating one is scheduled again
    assert sorted(queued(redis_client, queue)) == ["other-every", "other-once"]
    assert sorted(schedule(redis_client, keys)) == sorted([wake, "other-every"])
    assert Job.fetch("other-once", connection=redis_client).func_name == OTHER_FUNC
    # and the wake waits for its own millisecond
    wakes.scheduler.cancel("other-every")
    assert wakes.move_due(T1) == 1
    assert handed_on_among_others(redis_client, queue) == [(AGENT, T1)]


def test_an_unreadable_wake_job_spares_the_rest_of_the_pass(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given two due wakes, one of whose job hashes no longer decodes
    broken = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    assert broken is not None
    wakes.arm([ArmRequest("agent-2", T1 + 1, queue)])
    redis_client.hset(Job.key_for(broken), "data", b"not a job")
    # when the mover runs
    assert wakes.move_due(T2) == 1
    # then the other wake is handed on and the broken one is out of the schedule
    assert handed_on(redis_client, queue) == [("agent-2", T1 + 1)]
    assert schedule(redis_client, keys) == {}


class CountingConnection(redis.Connection):
    """A connection that counts its round trips (every send is one: a command, a pipeline
    or a script call)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


@pytest.fixture
def counting_client(real_redis: redis.Redis) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool(
        connection_class=CountingConnection, **real_redis.connection_pool.connection_kwargs
    )
    client = redis.Redis(connection_pool=pool)
    yield client
    client.close()
    pool.disconnect()


@pytest.mark.redis
def test_a_burst_moves_in_a_bounded_number_of_round_trips(
    counting_client: redis.Redis, keys: Keys, queue: str, settings: Settings
) -> None:
    # given a burst of wakes all due at once, on two queues, and a mover that has made its
    # first pass (script loading is not part of the burst)
    wakes = Coordination(counting_client, settings).wakes
    assert wakes.move_due(T1) == 0
    burst = 2_600
    requests = [
        ArmRequest(f"agent-{i:04d}", T1 + i, queue if i % 3 else "elsewhere")
        for i in range(burst)
    ]
    wakes.arm(requests)
    # when the mover moves them, counting every round trip it makes
    CountingConnection.sends = 0
    assert wakes.move_due(T1 + burst) == burst
    trips = CountingConnection.sends
    # then it took one script call and one pipelined write per MOVE_TAKE wakes (plus the
    # call that finds the schedule drained, and one count of each queue's workers),
    # nowhere near a round trip per wake
    assert trips <= 2 * math.ceil(burst / MOVE_TAKE) + 1 + 2
    # and every wake was handed on once, per queue in target order, MOVE_BATCH per job
    for name in (queue, "elsewhere"):
        mine = [(r.agent, r.target_ms) for r in requests if r.queue == name]
        assert handed_on(counting_client, name) == mine
        sizes = [len(job.args[0]["wakes"]) for job in Queue(name, connection=counting_client).jobs]
        assert max(sizes) <= MOVE_BATCH
        assert len(sizes) <= math.ceil(len(mine) / MOVE_BATCH) + math.ceil(burst / MOVE_TAKE)
    assert schedule(counting_client, keys) == {}


def test_a_moved_wake_hands_on_once_even_when_two_movers_run(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str,
    settings: Settings,
) -> None:
    wakes.arm([ArmRequest(AGENT, T1, queue)])
    other = Coordination(redis_client, settings).wakes
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
    again = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    # then a suffixed id is scheduled and the queued job is left untouched
    assert again == f"{base}_1"
    assert schedule(redis_client, keys) == {again: S1}
    assert queued(redis_client, queue) == [base]
    assert job_exists(redis_client, base)
    assert wakes.projections([AGENT])[0].wake == again
    job = Job.fetch(again, connection=redis_client)
    assert (job.func_name, armed_wake(redis_client, keys, again), job.result_ttl, job.origin) == (
        WAKE_FUNC,
        (AGENT, T1),
        0,
        queue,
    )
    # and arming that target once more is a no-op on the suffixed id
    assert wakes.arm([ArmRequest(AGENT, T1, queue)])[0] == again
    assert schedule(redis_client, keys) == {again: S1}


def test_re_arming_a_handed_on_target_schedules_its_id_afresh(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    first = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    wakes.move_due(T1)
    # the handed-on wake's own job is gone, so its id is free again
    assert wakes.arm([ArmRequest(AGENT, T1, queue)])[0] == first
    assert schedule(redis_client, keys) == {first: S1}


def test_superseding_after_a_hand_on_leaves_the_batch_alone(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given the current wake already handed on to the queue
    wakes.arm([ArmRequest(AGENT, T1, queue)])
    wakes.move_due(T1)
    # when a new target is armed, and then the wake is retired
    new = wakes.arm([ArmRequest(AGENT, T3, queue)])[0]
    assert new == wake_job_id(AGENT, T3)
    assert schedule(redis_client, keys) == {new: T3 / 1000}
    wakes.arm([ArmRequest(AGENT, None, queue)])
    # then the batch is still there to run (its wake finds nothing due and returns)
    assert handed_on(redis_client, queue) == [(AGENT, T1)]
    assert schedule(redis_client, keys) == {}


def test_trigger_enqueues_an_immediate_wake(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given a scheduled wake
    scheduled = wakes.arm([ArmRequest(AGENT, T1, queue)])[0]
    # when an immediate wake is triggered
    assert wakes.trigger({queue: [AGENT]}) == 1
    # then a batch of the agent, without a target, waits on the queue right away
    (job_id,) = queued(redis_client, queue)
    job = Job.fetch(job_id, connection=redis_client)
    assert (job.func_name, job.result_ttl, job.origin) == (WAKE_BATCH_FUNC, 0, queue)
    assert decode_wakes(job.args[0]) == ImmediateWakes(agents=(AGENT,))
    # and the scheduled wake is untouched
    assert schedule(redis_client, keys) == {scheduled: S1}
    assert wakes.projections([AGENT])[0].wake == scheduled


def test_every_key_the_projection_writes_is_under_the_prefix(
    wakes: WakeProjection, redis_client: redis.Redis, keys: Keys, queue: str
) -> None:
    # given every write path: arm, no-op, supersede, move, suffixed re-arm, trigger, retire
    wakes.arm([ArmRequest(AGENT, T1, queue)])
    wakes.arm([ArmRequest(AGENT, T1, queue)])
    wakes.arm([ArmRequest(AGENT, T2, queue)])
    wakes.move_due(T2)
    Queue(queue, connection=redis_client).enqueue(
        WAKE_FUNC, AGENT, T2, job_id=wake_job_id(AGENT, T2)
    )  # a job still under the would-be id
    wakes.arm([ArmRequest(AGENT, T2, queue)])
    wakes.trigger({queue: [AGENT]})
    wakes.arm([ArmRequest("agent-2", T3, queue)])
    wakes.arm([ArmRequest("agent-2", None, queue)])
    # when the whole keyspace is listed
    written = {k.decode() for k in redis_client.scan_iter(match="*")}
    # then everything but rq's own job, queue and queue-registry keys carries the prefix
    ours = {k for k in written if not k.startswith(RQ_OWN) and k != RQ_QUEUE_REGISTRY}
    assert ours == {
        keys.scheduled_jobs(),
        keys.current_wake(AGENT),
        keys.wake_counter(AGENT),
        keys.mover_nudge(),
    }
    assert all(k.startswith(keys.prefix) for k in ours)
    assert redis_client.llen(keys.mover_nudge()) == 1  # however many arms nudged
    assert f"rq:queue:{queue}" in written
    assert not any(k.startswith("rq:scheduler") for k in written)
