"""Coordination over all ports together (docs/architecture.md#layout), on the fake and the real
Redis.

Each port has its own contract suite beside this one; here: the owner's re-arm and the
immediate wake follow the lease's queue, and every key any port writes carries the prefix.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
import redis
from redis.client import Pipeline
from rq import Queue
from rq.job import Job

from dsh_schedule.shared.coordination.agents import Coordination, Projection
from dsh_schedule.shared.coordination.followups import Pair
from dsh_schedule.shared.coordination.wake_jobs import WAKE_FUNC, wake_job_id
from dsh_schedule.shared.core.fold import EMPTY, FoldState
from dsh_schedule.shared.core.instant import format_instant
from dsh_schedule.shared.core.records import AtSchedule
from dsh_schedule.shared.settings import Settings
from tests.support import add_followup

AGENT = "agent-1"
T0 = 1_764_579_600_000  # 2025-12-01T09:00:00.000Z
TARGET = T0 + 3_600_500  # an hour and half a second later
LEASE_S = 60.0


def waiting_for(target_ms: int) -> FoldState:
    record = AtSchedule(id="schedule-1", prompt="call back", scheduledAt=format_instant(target_ms))
    return FoldState(active=(record,), created=frozenset({"schedule-1"}))


def queued(client: redis.Redis, queue: str) -> list[str]:
    ids: Any = client.lrange(f"rq:queue:{queue}", 0, -1)
    return [i.decode() for i in ids]


def test_rearm_of_an_agent_without_a_lease_arms_nothing(
    coordination: Coordination, redis_client: redis.Redis
) -> None:
    assert coordination.rearm([(AGENT, waiting_for(TARGET))], T0)[0] is None
    assert coordination.wakes.projections([AGENT])[0].wake is None
    assert redis_client.dbsize() == 0


def test_rearm_arms_the_next_decision_time_on_the_lease_queue(
    coordination: Coordination, redis_client: redis.Redis
) -> None:
    # given a live agent whose lease names its queue
    coordination.leases.grant(AGENT, "beside-the-store", now_ms=T0, ttl_s=LEASE_S)
    # when the owner re-arms with a record waiting for TARGET
    job_id = coordination.rearm([(AGENT, waiting_for(TARGET))], T0)[0]
    # then the wake is scheduled at TARGET's second, for the lease's queue
    assert job_id is not None
    score = redis_client.zscore(coordination.keys.scheduled_jobs(), job_id)
    assert score is not None and int(score) == TARGET // 1000
    assert Job.fetch(job_id, connection=redis_client).origin == "beside-the-store"


def test_rearm_with_nothing_active_retires_the_wake(
    coordination: Coordination, redis_client: redis.Redis
) -> None:
    coordination.leases.grant(AGENT, "beside-the-store", now_ms=T0, ttl_s=LEASE_S)
    armed = coordination.rearm([(AGENT, waiting_for(TARGET))], T0)[0]
    assert armed is not None
    assert coordination.rearm([(AGENT, EMPTY)], T0)[0] is None
    assert coordination.wakes.projections([AGENT])[0].wake is None
    assert redis_client.zscore(coordination.keys.scheduled_jobs(), armed) is None


def test_rearm_with_something_overdue_arms_now(coordination: Coordination) -> None:
    coordination.leases.grant(AGENT, "beside-the-store", now_ms=T0, ttl_s=LEASE_S)
    job_id = coordination.rearm([(AGENT, waiting_for(T0 - 1_000))], T0)[0]
    assert job_id == coordination.wakes.projections([AGENT])[0].wake
    assert job_id is not None and job_id.endswith(f"_{T0 // 1000}")


def test_trigger_uses_the_lease_queue_and_falls_back_to_the_configured_one(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    # without a lease: the configured queue
    coordination.trigger([AGENT])
    assert len(queued(redis_client, settings.queue)) == 1
    # with a lease: the queue it names
    coordination.leases.grant(AGENT, "beside-the-store", now_ms=T0, ttl_s=LEASE_S)
    coordination.trigger([AGENT])
    assert len(queued(redis_client, "beside-the-store")) == 1
    assert len(queued(redis_client, settings.queue)) == 1


def test_every_key_of_every_port_is_under_the_prefix(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    # given every port used for one agent
    keys, queue = coordination.keys, settings.queue
    coordination.leases.grant(AGENT, queue, now_ms=T0, ttl_s=LEASE_S)
    assert coordination.phase.claim_turn(AGENT, "t1", 10.0)
    assert not coordination.phase.claim([AGENT], "maintenance", "m1", 10.0)[0]
    add_followup(coordination.followups, AGENT, "text",
                 [Pair(scheduleId="schedule-1", occurrenceAt="x")])
    coordination.rearm([(AGENT, waiting_for(TARGET))], T0)
    coordination.wakes.move_due(TARGET)
    Queue(queue, connection=redis_client).enqueue(
        WAKE_FUNC, AGENT, TARGET, job_id=wake_job_id(AGENT, TARGET)
    )  # a job still under the would-be id: the re-arm takes a suffixed id
    coordination.rearm([(AGENT, waiting_for(TARGET))], T0)
    coordination.trigger([AGENT])
    with coordination.locks.hold(AGENT, wait_s=0.0):
        # when the keyspace is listed
        written = {k.decode() for k in redis_client.scan_iter(match="*")}
    # then all but rq's own job, queue and queue-registry keys carry the prefix
    rq_own = {k for k in written if k.startswith(("rq:job:", "rq:queue:")) or k == "rq:queues"}
    assert written - rq_own == {
        keys.lock(AGENT),
        keys.phase(AGENT),
        keys.idle_waiter(AGENT),
        keys.hosts(),
        keys.served("host"),
        keys.agent_host(),
        keys.lease_queue(),
        keys.host_digest(),
        keys.followups(AGENT),
        keys.followup_counts(),
        keys.followup_total(),
        keys.ready(queue),
        keys.current_wake(AGENT),
        keys.wake_counter(AGENT),
        keys.scheduled_jobs(),
        keys.mover_nudge(),
    }
    assert all(k.startswith(keys.prefix) for k in written - rq_own)


def announcements(client: redis.Redis, coordination: Coordination, queue: str) -> int:
    return int(client.xlen(coordination.keys.ready(queue)))


def test_rearm_announces_again_a_followup_older_than_the_stale_age(
    redis_client: redis.Redis, settings: Settings
) -> None:
    # given a live agent with a followup, announced once when it was added
    fresh = Coordination(redis_client, settings)  # stale after 30 s
    stale = Coordination(redis_client, msgspec.structs.replace(settings, followup_stale_s=0.001))
    fresh.leases.grant(AGENT, "beside-the-store", now_ms=T0, ttl_s=LEASE_S)
    add_followup(fresh.followups, AGENT, "text", [Pair(scheduleId="schedule-1", occurrenceAt="x")])
    assert announcements(redis_client, fresh, "beside-the-store") == 1
    time.sleep(0.01)
    # when it is re-armed while the entry is younger than the stale age: nothing more
    fresh.rearm([(AGENT, waiting_for(TARGET))], T0)
    assert announcements(redis_client, fresh, "beside-the-store") == 1
    # and when it is older: announced again, on the lease's queue
    stale.rearm([(AGENT, waiting_for(TARGET))], T0)
    assert announcements(redis_client, fresh, "beside-the-store") == 2
    # an agent without a lease is neither armed nor announced
    add_followup(stale.followups, "cold", "text", [])
    time.sleep(0.01)
    assert stale.rearm([("cold", waiting_for(TARGET))], T0)[0] is None
    assert announcements(redis_client, fresh, settings.queue) == 0


def test_projections_tell_a_held_wake_from_a_lost_one_and_date_the_oldest_followup(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    for agent in ("armed", "lost", "idle"):
        coordination.leases.grant(agent, settings.queue, now_ms=T0, ttl_s=LEASE_S)
    armed = coordination.rearm([("armed", waiting_for(TARGET))], T0)[0]
    lost = coordination.rearm([("lost", waiting_for(TARGET))], T0)[0]
    assert armed is not None and lost is not None
    # the lost wake's job goes away behind the projection's back
    redis_client.zrem(coordination.keys.scheduled_jobs(), lost)
    redis_client.delete(Job.key_for(lost))
    entry = add_followup(coordination.followups, "idle", "text", [])

    found = coordination.projections(["armed", "lost", "idle"])

    assert found == [
        Projection(armed, True, None),
        Projection(lost, False, None),
        Projection(None, False, int(entry.split("-")[0])),
    ]
    assert coordination.projections([]) == []
    # a wake moved to its queue (its job hash exists, it left the schedule) is held too
    redis_client.zrem(coordination.keys.scheduled_jobs(), armed)
    Queue(settings.queue, connection=redis_client).enqueue(WAKE_FUNC, "armed", TARGET,
                                                           job_id=armed)
    assert coordination.projections(["armed"])[0].wake_held is True


def test_projections_of_many_agents_take_one_command_per_hundred(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agents = [f"a{i}" for i in range(150)]
    for agent in agents[:3]:
        coordination.leases.grant(agent, settings.queue, now_ms=T0, ttl_s=LEASE_S)
        coordination.rearm([(agent, waiting_for(TARGET))], T0)
    sent: list[str] = []
    queued = Pipeline.execute_command

    def counting(self: Pipeline, *args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return queued(self, *args, **options)

    monkeypatch.setattr(Pipeline, "execute_command", counting)
    found = coordination.projections(agents)

    assert sent == ["EVAL", "EVAL"]
    assert [p.wake_held for p in found] == [True] * 3 + [False] * 147


def test_trigger_wakes_each_agent_on_its_lease_queue_in_batches(
    coordination: Coordination, redis_client: redis.Redis, settings: Settings
) -> None:
    coordination.leases.grant("a", "queue-a", now_ms=T0, ttl_s=LEASE_S)
    coordination.leases.grant("b", "queue-b", now_ms=T0, ttl_s=LEASE_S)
    assert coordination.trigger(["a", "b", "unleased"]) == 3  # one job per queue
    assert coordination.trigger([]) == 0
    agents = {queue: [a for job in Queue(queue, connection=redis_client).jobs
                      for a in job.args[0]["agents"]]
              for queue in ("queue-a", "queue-b", settings.queue)}
    assert agents == {"queue-a": ["a"], "queue-b": ["b"], settings.queue: ["unleased"]}
