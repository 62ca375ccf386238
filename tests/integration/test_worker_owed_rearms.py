"""A worker's re-arm lost after a durable dispatch is owed and repaid once Redis answers,
with no sweep (docs/architecture.md#owed-re-arms)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis
from rq import Queue

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.worker.outcome import WakeOutcome
from dsh_schedule.worker.retry import RETRY_MAX_S
from tests.support import FakeClock, dispatch_records, new_session, refuse_writes

pytestmark = [pytest.mark.redis]


class CutAfterDispatch(MemoryStore):
    """A store that makes Redis refuse writes right after the next dispatch it appends."""

    def __init__(self, client: redis.Redis) -> None:
        super().__init__()
        self._client = client
        self.armed = False
        self.undo: list[Callable[[], None]] = []

    def append(self, session_id: str, events: Sequence[Any], expected_seq: int) -> Any:
        appended = super().append(session_id, events, expected_seq)
        if self.armed and any(e.data.get("operation") == "dispatch" for e in appended):
            self.armed = False
            self.undo.append(refuse_writes(self._client, "OOM"))
        return appended


def _due(store: MemoryStore, client: redis.Redis, settings: Settings, clock: FakeClock,
         create: dict[str, Any], *, after_s: float) -> tuple[EmbeddedSystem, str]:
    """A served session with the reminder ``create`` makes, ``after_s`` later: due, the
    host's lease renewed meanwhile."""
    system = EmbeddedSystem(store, settings, clock=clock, sleep=clock.advance,
                            client=client, injected_clock=True)
    session = new_session(store)
    system.host.open_root(session)
    system.step()
    _d, handler = system.host.agents[session].tools["schedule_create"]
    assert not handler(create).is_error
    clock.advance(after_s)
    system.host.plugin.renew_leases()  # the host keeps its lease meanwhile
    return system, session


def test_a_worker_repays_the_wake_its_failed_batch_owes(
    real_redis: redis.Redis, settings: Settings
) -> None:
    # given an agent with a reminder every 300 s, its first occurrence due
    clock = FakeClock()
    store = CutAfterDispatch(real_redis)
    system, session = _due(store, real_redis, settings, clock,
                           {"prompt": "stretch", "every_seconds": 300}, after_s=300)
    # the mover hands the due wake on; the worker takes its job (run here by hand)
    assert system.coordination.wakes.move_due(clock()) == 1
    Queue(settings.queue, connection=real_redis).empty()

    # when Redis refuses writes right after the dispatch is appended
    store.armed = True
    outcome = system.owner.wake([(session, clock())])[session]

    # then the dispatch stands, nothing is armed for the next occurrence, and the worker
    # owes the agent a wake
    assert outcome is WakeOutcome.REDIS_UNAVAILABLE
    assert len(dispatch_records(store, session)) == 1
    assert system.owner.owed.owed() == [session]
    assert real_redis.zcard(system.coordination.keys.scheduled_jobs()) == 0
    assert system.owner.repay_owed() == []  # Redis still refuses: still owed
    assert system.owner.owed.owed() == [session]

    # when Redis takes writes again, the worker's beat repays the owed wake
    store.undo[0]()
    assert system.owner.repay_owed() == [session]
    assert system.owner.owed.owed() == []
    system.step()

    # then the next occurrence is armed and delivered once, with no reconcile pass
    assert real_redis.zcard(system.coordination.keys.scheduled_jobs()) == 1
    clock.advance(300)
    for _ in range(3):
        system.step()
    assert len(dispatch_records(store, session)) == 2


def test_a_wake_that_failed_on_its_store_leaves_a_wake_in_redis_for_its_retry(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """The retry of a wake that failed on its own agent is owed in the worker's memory,
    lost if the worker dies before it: a wake at most ``RETRY_MAX_S`` later stands in Redis
    for it meanwhile (docs/architecture.md#owed-re-arms)."""
    # given an agent whose one-shot is due, its wake handed on to a worker
    clock = FakeClock()
    store = MemoryStore()
    system, session = _due(store, redis_client, settings, clock,
                           {"prompt": "stretch", "after_seconds": 60}, after_s=60)
    assert system.coordination.wakes.move_due(clock()) == 1
    Queue(settings.queue, connection=redis_client).empty()

    # when its preflight fails on the store, and the worker then forgets what it owes
    store.fail_next_flush()
    outcome = system.owner.wake([(session, clock())])[session]
    assert outcome is WakeOutcome.PREFLIGHT_FAILED
    assert system.owner.owed.owed() == [session]
    del system

    # then a wake for the agent waits in the schedule, RETRY_MAX_S on
    scheduled: Any = redis_client.zrange(Keys(settings.prefix).scheduled_jobs(), 0, -1,
                                         withscores=True)
    assert [score for _id, score in scheduled] == [(clock() + RETRY_MAX_S * 1000) / 1000]
    assert dispatch_records(store, session) == []
