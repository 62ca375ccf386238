"""The batched due transaction (docs/architecture.md#batched-due-transactions): many wakes
share their round trips to Redis, and each agent is still decided, written and fenced on
its own."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import pytest
import redis
from redis.client import Pipeline

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.core.due import next_wake_ms
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.core.events import Event, NewEvent
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.transaction import FENCE_ATTEMPTS
from dsh_schedule.worker.due import WakeOutcome
from tests.support import (
    FakeClock,
    add_followup,
    dispatch_records,
    new_session,
    phase_holder,
    reminder_texts,
)


def _system(redis_client: redis.Redis, settings: Settings, store: MemoryStore | None = None,
            **overrides: float) -> tuple[EmbeddedSystem, FakeClock]:
    clock = FakeClock()
    quick = msgspec.structs.replace(settings, **overrides) if overrides else settings
    system = EmbeddedSystem(store or MemoryStore(), quick, clock=clock, sleep=clock.advance,
                            client=redis_client, injected_clock=True)
    return system, clock


def _agents_with_reminders(system: EmbeddedSystem, names: Sequence[str],
                           after_s: dict[str, int] | None = None) -> None:
    for name in names:
        new_session(system.store, name)
        system.host.open_root(name)
        _d, create = system.host.agents[name].tools["schedule_create"]
        result = create({"prompt": f"reminder for {name}",
                         "after_seconds": (after_s or {}).get(name, 5)})
        assert not result.is_error, result.content


def _targets(system: EmbeddedSystem, names: Sequence[str]) -> list[tuple[str, int | None]]:
    now = system.clock()
    return [(name, next_wake_ms(system.store.load(name)[1], now)) for name in names]


def _made_due(system: EmbeddedSystem, clock: FakeClock,
              names: Sequence[str]) -> list[tuple[str, int | None]]:
    """Agents with one reminder each, made due: their wakes, as the mover hands them on."""
    _agents_with_reminders(system, names)
    wakes = _targets(system, names)
    clock.advance(6)
    return wakes


def test_a_batch_dispatches_each_due_agent_once_and_arms_the_rest(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings)
    due = [f"due{i}" for i in range(6)]
    _agents_with_reminders(system, [*due, "later"], {"later": 600})
    wakes = _targets(system, [*due, "later"])
    clock.advance(6)

    outcomes = system.owner.wake([*wakes, ("gone", None)])

    assert outcomes == {**dict.fromkeys(due, WakeOutcome.SETTLED),
                        "later": WakeOutcome.SETTLED, "gone": WakeOutcome.NOT_LIVE}
    for name in due:
        assert len(dispatch_records(system.store, name)) == 1
        assert system.coordination.followups.waiting(name) == 1
        assert system.store.load(name)[1].active == ()
    assert dispatch_records(system.store, "later") == []
    assert system.coordination.wakes.projections(["later"])[0].wake is not None
    system.step()  # the host delivers each once
    assert all(len(reminder_texts(system.store, name)) == 1 for name in due)


def test_an_agent_whose_lock_is_busy_is_woken_alone_after_the_batch(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings, wake_lock_wait_s=2.0)
    wakes = _made_due(system, clock, ["free", "held"])
    lock = redis_client.lock(system.coordination.keys.lock("held"), timeout=30,
                             thread_local=False)
    assert lock.acquire(blocking=False)
    release = threading.Timer(0.3, lock.release)  # the batch is done long before
    release.start()
    try:
        outcomes = system.owner.wake(wakes)
    finally:
        release.join()

    assert outcomes == {"free": WakeOutcome.SETTLED, "held": WakeOutcome.SETTLED}
    assert len(dispatch_records(system.store, "held")) == 1  # after waiting for its lock
    assert len(dispatch_records(system.store, "free")) == 1


def test_an_agent_in_a_turn_waits_for_idle_and_spares_the_batch(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings)
    wakes = _made_due(system, clock, ["idle", "busy"])
    phase = system.coordination.phase
    assert phase.claim_turn("busy", "tok", 30)

    outcomes = system.owner.wake(wakes)

    assert outcomes == {"idle": WakeOutcome.SETTLED, "busy": WakeOutcome.WAITING_FOR_IDLE}
    assert dispatch_records(system.store, "busy") == []
    assert len(dispatch_records(system.store, "idle")) == 1
    assert redis_client.exists(system.coordination.keys.idle_waiter("busy"))
    assert phase_holder(phase, "idle") is None  # every maintenance phase of the batch released


class _InterposingStore(MemoryStore):
    """Another writer appends to ``victim`` just before the batch's dispatch append (once,
    or before every one when ``always``)."""

    def __init__(self, victim: str, *, always: bool = False) -> None:
        super().__init__()
        self.victim = victim
        self.always = always
        self.interposed = 0

    def append(self, session_id: str, events: Sequence[NewEvent],
               expected_seq: int) -> tuple[Event, ...]:
        if session_id == self.victim and (self.always or not self.interposed) and any(
            e.type == "schedule/change" and e.data.get("operation") == "dispatch" for e in events
        ):
            self.interposed += 1
            super().append(session_id, [NewEvent(type="custom/note", time=0, data={})],
                           expected_seq)
        return super().append(session_id, events, expected_seq)


def test_a_fence_conflict_in_a_batch_re_decides_that_agent_alone(
    redis_client: redis.Redis, settings: Settings
) -> None:
    store = _InterposingStore("contested")
    system, clock = _system(redis_client, settings, store)
    wakes = _made_due(system, clock, ["plain", "contested"])

    outcomes = system.owner.wake(wakes)

    assert store.interposed
    assert outcomes == {"plain": WakeOutcome.SETTLED, "contested": WakeOutcome.SETTLED}
    assert len(dispatch_records(store, "contested")) == 1
    system.step()
    # Two entries were written (the batch's, then the re-decided one); one is delivered.
    assert len(reminder_texts(store, "contested")) == 1
    assert len(reminder_texts(store, "plain")) == 1


def test_an_agent_whose_log_keeps_moving_is_abandoned_after_the_attempts_and_the_rest_land(
    redis_client: redis.Redis, settings: Settings
) -> None:
    store = _InterposingStore("contested", always=True)
    system, clock = _system(redis_client, settings, store)
    wakes = _made_due(system, clock, ["plain", "contested"])

    outcomes = system.owner.wake(wakes)

    assert store.interposed == FENCE_ATTEMPTS  # decided again after each conflict, no more
    assert outcomes == {"plain": WakeOutcome.SETTLED,
                        "contested": WakeOutcome.DISPATCH_ABANDONED}
    assert dispatch_records(store, "contested") == []
    assert len(dispatch_records(store, "plain")) == 1
    system.step()
    # Followups written for the contested agent have no dispatch: the host drops them.
    assert reminder_texts(store, "contested") == []
    assert len(reminder_texts(store, "plain")) == 1


@pytest.fixture
def commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the commands redis-py packs, by name, pipelined or not (a script call is
    one ``EVAL``, whatever it does in Redis)."""
    sent: Counter[str] = Counter()
    pipelined, direct = Pipeline.execute_command, redis.Redis.execute_command

    def in_pipeline(self: Pipeline, *args: Any, **options: Any) -> Any:
        sent[str(args[0])] += 1
        return pipelined(self, *args, **options)

    def alone(self: redis.Redis, *args: Any, **options: Any) -> Any:
        sent[str(args[0])] += 1
        return direct(self, *args, **options)

    monkeypatch.setattr(Pipeline, "execute_command", in_pipeline)
    monkeypatch.setattr(redis.Redis, "execute_command", alone)
    yield sent


def test_a_batch_costs_the_same_round_trips_and_commands_whatever_its_size(
    real_redis: redis.Redis, settings: Settings, round_trips: list[int],
    commands: Counter[str],
) -> None:
    def cost_of(count: int, tag: str) -> tuple[int, Counter[str]]:
        system, clock = _system(real_redis, settings)
        wakes = _made_due(system, clock, [f"{tag}{i}" for i in range(count)])
        before, sent = round_trips[0], Counter(commands)
        outcomes = system.owner.wake(wakes)
        assert set(outcomes.values()) == {WakeOutcome.SETTLED}
        return round_trips[0] - before, commands - sent

    (small_trips, small), (large_trips, large) = cost_of(4, "s"), cost_of(40, "l")
    assert small_trips == large_trips, (small_trips, large_trips)
    # Every step is one command for the batch; only the re-arms' MULTI still writes each
    # agent's wake on its own (one round trip).
    per_agent = {name for name in large if large[name] != small[name]}
    assert per_agent <= {"DEL", "ZREM", "EVAL"}, (small, large)
    assert sum(large.values()) - sum(small.values()) <= 3 * (40 - 4), (small, large)


def test_an_agent_that_just_dispatched_is_not_flushed_or_read_again(
    redis_client: redis.Redis, settings: Settings
) -> None:
    store = _CountingFlushes()
    system, clock = _system(redis_client, settings, store)
    wakes = _made_due(system, clock, ["a1", "a2"])
    store.flushes.clear()

    outcomes = system.owner.wake(wakes)

    assert outcomes == {"a1": WakeOutcome.SETTLED, "a2": WakeOutcome.SETTLED}
    # the preflight and the barrier; the check after the dispatch flushes nothing
    assert store.flushes == Counter({"a1": 2, "a2": 2})
    assert all(len(dispatch_records(store, name)) == 1 for name in ("a1", "a2"))
    assert all(system.coordination.followups.waiting(name) == 1 for name in ("a1", "a2"))


# -- the host's side: many agents' followups delivered together ---------------------------


def _dispatched(system: EmbeddedSystem, clock: FakeClock, names: Sequence[str]) -> None:
    _agents_with_reminders(system, names)
    assert system.host.serve(0.0) == []  # the installs' own looks: nothing is due yet
    wakes = _targets(system, names)
    clock.advance(6)
    assert set(system.owner.wake(wakes).values()) == {WakeOutcome.SETTLED}


def test_the_host_delivers_many_agents_together_each_once(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings)
    names = [f"a{i}" for i in range(8)]
    _dispatched(system, clock, names)

    delivered = system.host.serve(0.0)

    assert sorted(name for name, _d in delivered) == names
    for name, delivery in delivered:
        assert reminder_texts(system.store, name) == [delivery.text]
        assert f"reminder for {name}" in delivery.text
        assert system.coordination.followups.waiting(name) == 0
        assert phase_holder(system.coordination.phase, name) is None  # every turn released
    assert system.host.serve(0.0) == []  # nothing is delivered twice


def test_an_agent_in_a_turn_is_handed_back_and_delivered_once_it_ends(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings)
    _dispatched(system, clock, ["free", "talking"])
    phase = system.coordination.phase
    assert phase.claim_turn("talking", "tok", 30)

    first = system.host.serve(0.0)

    assert [name for name, _d in first] == ["free"]
    assert reminder_texts(system.store, "talking") == []
    phase.release(["talking"], "turn", "tok")[0]
    clock.advance(1.5)  # the bridge names a busy agent again after a second
    assert [name for name, _d in system.host.serve(0.0)] == ["talking"]
    assert len(reminder_texts(system.store, "talking")) == 1


def test_serving_many_agents_costs_the_same_round_trips_and_commands_whatever_their_number(
    real_redis: redis.Redis, settings: Settings, round_trips: list[int],
    commands: Counter[str],
) -> None:
    def cost_of(count: int, tag: str) -> tuple[int, Counter[str]]:
        system, clock = _system(real_redis, settings)
        names = [f"{tag}{i}" for i in range(count)]
        _dispatched(system, clock, names)
        before, sent = round_trips[0], Counter(commands)
        delivered = system.host.serve(0.0)
        assert len(delivered) == count
        return round_trips[0] - before, commands - sent

    (small_trips, small), (large_trips, large) = cost_of(4, "s"), cost_of(40, "l")
    assert small_trips == large_trips, (small_trips, large_trips)
    assert small == large, (small, large)


def test_a_round_that_empties_a_stream_does_not_read_it_again(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings)
    _dispatched(system, clock, ["one", "two"])
    followups = system.coordination.followups
    add_followup(followups, "two", "a second entry", [])  # "two" holds two entries now
    bridge = system.host.plugin.bridge

    with bridge.turns(["one", "two"]) as held:
        first = bridge.deliver_many(held)

    assert sorted(first.delivered) == ["one", "two"]
    assert first.again == ("two",)  # its read left an entry; "one"'s read emptied it
    assert followups.waiting("one") == 0


class _CountingFlushes(MemoryStore):
    """Counts the flushes of each session."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes: Counter[str] = Counter()

    def flush(self, session_id: str) -> None:
        self.flushes[session_id] += 1
        super().flush(session_id)


class _FailingBarrier(MemoryStore):
    """The flush after ``victim``'s dispatch append fails."""

    def __init__(self, victim: str) -> None:
        super().__init__()
        self.victim = victim

    def flush(self, session_id: str) -> None:
        if session_id == self.victim and dispatch_records(self, session_id):
            raise PersistenceError("disk full")
        super().flush(session_id)


def test_a_failed_barrier_stops_only_its_agent(
    redis_client: redis.Redis, settings: Settings
) -> None:
    store = _FailingBarrier("unlucky")
    system, clock = _system(redis_client, settings, store)
    wakes = _made_due(system, clock, ["unlucky", "fine"])

    outcomes = system.owner.wake(wakes)

    assert outcomes == {"unlucky": WakeOutcome.BARRIER_FAILED, "fine": WakeOutcome.SETTLED}
    assert len(dispatch_records(store, "fine")) == 1
    assert len(dispatch_records(store, "unlucky")) == 1  # appended, not yet confirmed


def test_a_failed_delivery_preflight_delivers_nothing_until_a_later_look(
    redis_client: redis.Redis, settings: Settings
) -> None:
    system, clock = _system(redis_client, settings)
    _dispatched(system, clock, ["shaky", "steady"])
    store = system.store
    assert isinstance(store, MemoryStore)
    original = store.flush
    failures = {"shaky": 1}

    def flush(session_id: str) -> None:
        if failures.get(session_id):
            failures[session_id] -= 1
            raise PersistenceError("disk error")
        original(session_id)

    store.flush = flush  # type: ignore[method-assign]

    first = system.host.serve(0.0)

    # A flush that succeeds after a failed one proves nothing: no gate ran for it.
    assert [name for name, _d in first] == ["steady"]
    assert reminder_texts(store, "shaky") == []
    assert system.coordination.followups.waiting("shaky") == 1
    clock.advance(settings.followup_stale_s + 1)
    assert [name for name, _d in system.host.serve(0.0)] == ["shaky"]
    assert len(reminder_texts(store, "shaky")) == 1


# -- a management call's round trips -------------------------------------------------------


def test_a_create_releases_its_lock_in_the_re_arms_own_write(
    real_redis: redis.Redis, settings: Settings, round_trips: list[int]
) -> None:
    system, _clock = _system(real_redis, settings)
    new_session(system.store, "a1")
    system.host.open_root("a1")
    _d, create = system.host.agents["a1"].tools["schedule_create"]
    assert not create({"prompt": "warm", "after_seconds": 600}).is_error  # scripts loaded

    before = round_trips[0]
    assert not create({"prompt": "x", "after_seconds": 900}).is_error

    # take the lock; one read for the re-arm; one write that arms and releases the lock
    assert round_trips[0] - before == 3
    assert not real_redis.exists(system.coordination.keys.lock("a1"))
    assert system.coordination.wakes.projections(["a1"])[0].wake is not None


def test_opening_many_agents_enqueues_their_wakes_together(
    redis_client: redis.Redis, settings: Settings
) -> None:
    from rq import Queue

    from dsh_schedule.shared.coordination.wake_jobs import ImmediateWakes, decode_wakes

    system, _clock = _system(redis_client, settings)
    queue = Queue(settings.queue, connection=redis_client)
    many = [f"m{i}" for i in range(5)]
    for name in [*many, "one"]:
        new_session(system.store, name)
    queue.empty()

    system.host.open_roots(many)
    jobs = queue.jobs
    assert [job.func_name for job in jobs] == ["dsh_schedule.worker.job.wake_batch"]
    assert decode_wakes(jobs[0].args[0]) == ImmediateWakes(agents=tuple(many))

    queue.empty()
    system.host.open_root("one")  # alone: a batch of one, at once
    (job,) = queue.jobs
    assert job.func_name == "dsh_schedule.worker.job.wake_batch"
    assert decode_wakes(job.args[0]) == ImmediateWakes(agents=("one",))

    with pytest.raises(RuntimeError), system.host.plugin.bridge.installing(), \
            system.host.plugin.bridge.installing():
        pass


def test_looking_at_agents_with_nothing_waiting_takes_no_turn_and_wakes_nobody(
    redis_client: redis.Redis, settings: Settings
) -> None:
    from rq import Queue

    system, _clock = _system(redis_client, settings)
    names = [f"q{i}" for i in range(4)]
    _agents_with_reminders(system, names, dict.fromkeys(names, 3600))  # active, far off
    queue = Queue(settings.queue, connection=redis_client)
    queue.empty()
    claims: list[str] = []
    phase = system.coordination.phase
    original = phase.claim

    def counting(agents: Sequence[str], kind: str, token: str, ttl_s: float) -> list[bool]:
        claims.extend(agents)
        return original(agents, kind, token, ttl_s)

    phase.claim = counting  # type: ignore[method-assign]

    assert system.host.serve(0.0) == []  # every agent is named once, after its install

    assert claims == []
    assert queue.count == 0  # no turn ended, so no agent with active records was woken


class _WatchingAnnouncements(MemoryStore):
    """Notes, at each barrier flush after a dispatch, the agents the ready stream names."""

    def __init__(self, client: redis.Redis, ready_key: str) -> None:
        super().__init__()
        self.client, self.ready_key = client, ready_key
        self.seen_at_barrier: list[list[str]] = []

    def flush(self, session_id: str) -> None:
        if dispatch_records(self, session_id):
            self.seen_at_barrier.append(_announced(self.client, self.ready_key))
        super().flush(session_id)


def _announced(client: redis.Redis, ready_key: str) -> list[str]:
    return [fields[b"agent"].decode() for _id, fields in client.xrange(ready_key)]


def test_a_host_is_told_of_a_dispatch_once_the_worker_lets_the_agent_go(
    redis_client: redis.Redis, settings: Settings
) -> None:
    ready_key = Keys(settings.prefix).ready(settings.queue)
    store = _WatchingAnnouncements(redis_client, ready_key)
    system, clock = _system(redis_client, settings, store)
    wakes = _made_due(system, clock, ["a1", "a2", "a3"])
    redis_client.delete(ready_key)  # the installs' own announcements

    outcomes = system.owner.wake(wakes)

    assert set(outcomes.values()) == {WakeOutcome.SETTLED}
    # while the transaction held them, their followups were written but not announced
    assert store.seen_at_barrier and all(seen == [] for seen in store.seen_at_barrier)
    assert all(system.coordination.followups.waiting(n) == 1 for n in ("a1", "a2", "a3"))
    # once it let them go, each was announced once, and a host can take each at once
    assert sorted(_announced(redis_client, ready_key)) == ["a1", "a2", "a3"]
    delivered = system.host.serve(0.0)
    assert sorted(name for name, _d in delivered) == ["a1", "a2", "a3"]
