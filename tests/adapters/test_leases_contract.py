"""The live-lease contract (docs/architecture.md#hosts-followups-and-rebuild), on the fake and
the real Redis."""

from __future__ import annotations

import pytest
import redis

from dsh_schedule.shared.coordination.followups import Followups, Pair
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import GRANT_BATCH, Leases
from dsh_schedule.shared.settings import Settings

AGENT = "agent-1"
QUEUE = "queue-a"
DEFAULT_QUEUE = "queue-default"
T0 = 1_764_579_600_000  # 2025-12-01T09:00:00.000Z
TTL_S = 60.0
EXPIRY = T0 + 60_000


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.prefix)


@pytest.fixture
def leases(redis_client: redis.Redis, keys: Keys) -> Leases:
    return Leases(redis_client, keys, default_queue=DEFAULT_QUEUE)


def group_names(client: redis.Redis, keys: Keys, agent: str = AGENT) -> list[str]:
    groups = client.xinfo_groups(keys.followups(agent))
    return [g["name"].decode() if isinstance(g["name"], bytes) else g["name"] for g in groups]


@pytest.mark.parametrize(
    ("second_grant_ms", "new"),
    [
        (T0 + 20_000, False),  # renewal of a valid lease
        (EXPIRY, False),  # renewal at the last live millisecond
        (EXPIRY + 1, True),  # the old lease had expired: the resumed agent is new again
    ],
    ids=["renewal", "renewal-at-expiry", "after-expiry"],
)
def test_a_grant_reports_whether_the_lease_is_new(
    leases: Leases, second_grant_ms: int, new: bool
) -> None:
    assert leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S) is True
    assert leases.grant(AGENT, QUEUE, now_ms=second_grant_ms, ttl_s=TTL_S) is new
    assert leases.is_live(AGENT, now_ms=second_grant_ms + 60_000) is True


@pytest.mark.parametrize(
    ("now_ms", "live"),
    [(T0, True), (EXPIRY - 1, True), (EXPIRY, True), (EXPIRY + 1, False)],
    ids=["at-grant", "before-expiry", "at-expiry", "after-expiry"],
)
def test_liveness_is_judged_by_the_now_passed_in(leases: Leases, now_ms: int, live: bool) -> None:
    # given one lease granted at T0 for 60 s and one that stays live throughout
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.grant("agent-long", QUEUE, now_ms=T0, ttl_s=3600.0)
    # then every view agrees on the agent at that instant
    assert leases.is_live(AGENT, now_ms=now_ms) is live
    assert (AGENT in leases.live_agents(now_ms=now_ms)) is live
    assert (AGENT in leases.expired_agents(now_ms=now_ms)) is not live
    assert "agent-long" in leases.live_agents(now_ms=now_ms)
    assert "agent-long" not in leases.expired_agents(now_ms=now_ms)


def test_an_unknown_agent_is_neither_live_nor_expired(leases: Leases) -> None:
    assert leases.is_live(AGENT, now_ms=T0) is False
    assert leases.live_agents(now_ms=T0) == []
    assert leases.expired_agents(now_ms=T0) == []
    assert leases.queue_of(AGENT) == DEFAULT_QUEUE
    assert leases.live_queues([AGENT], now_ms=T0) == {}


def test_the_lease_records_the_queue_and_a_renewal_moves_it(leases: Leases) -> None:
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.grant("agent-2", "queue-b", now_ms=T0, ttl_s=TTL_S)
    assert leases.queue_of(AGENT) == QUEUE
    assert leases.queue_of("agent-2") == "queue-b"
    assert leases.live_queues([AGENT, "agent-2", "agent-3"], now_ms=T0) == {
        AGENT: QUEUE, "agent-2": "queue-b"
    }
    leases.grant(AGENT, "queue-c", now_ms=T0 + 1_000, ttl_s=TTL_S)
    assert leases.queue_of(AGENT) == "queue-c"


def test_drop_forgets_the_lease_and_its_queue(leases: Leases) -> None:
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.grant("agent-2", QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.drop(AGENT)
    assert leases.is_live(AGENT, now_ms=T0) is False
    assert leases.queue_of(AGENT) == DEFAULT_QUEUE
    assert leases.live_agents(now_ms=T0) == ["agent-2"]
    assert leases.expired_agents(now_ms=EXPIRY + 1) == ["agent-2"]
    # and a later grant is new again
    assert leases.grant(AGENT, QUEUE, now_ms=T0 + 1_000, ttl_s=TTL_S) is True


def test_a_grant_recreates_what_a_flushed_redis_lost(
    leases: Leases, redis_client: redis.Redis, keys: Keys
) -> None:
    # given a live agent, then Redis flushed
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    redis_client.flushdb()
    # when the host renews the lease
    new = leases.grant(AGENT, QUEUE, now_ms=T0 + 20_000, ttl_s=TTL_S)
    # then the lease counts as new, and the lease and queue are back
    assert new is True
    assert leases.is_live(AGENT, now_ms=T0 + 20_000)
    assert leases.queue_of(AGENT) == QUEUE
    assert leases.grant(AGENT, QUEUE, now_ms=T0 + 40_000, ttl_s=TTL_S) is False
    # and an entry added now is read by a host consumer (the group comes back on read)
    followups = Followups(redis_client, keys)
    followups.add(AGENT, "hello", [Pair(scheduleId="schedule-1", occurrenceAt="x")])
    assert [e.text for e in followups.read(AGENT, "host-1")] == ["hello"]


def test_a_group_over_an_existing_stream_sees_its_entries(
    leases: Leases, redis_client: redis.Redis, keys: Keys
) -> None:
    """Entries re-projected before the lease came back are not skipped by the new group."""
    followups = Followups(redis_client, keys)
    followups.add(AGENT, "early", [])
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    assert [e.text for e in followups.read(AGENT, "host-1")] == ["early"]


def test_lease_keys_are_under_the_prefix(
    leases: Leases, redis_client: redis.Redis, keys: Keys
) -> None:
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    written = sorted(k.decode() for k in redis_client.scan_iter(match="*"))
    # an idle agent's lease holds no stream: memory per live agent stays small
    assert written == sorted([keys.live(), keys.lease_queue()])


# -- renewal in batches -------------------------------------------------------------------


class RoundTrips:
    """Counts the requests a client's connections send (a pipeline is one)."""

    def __init__(self, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        connection_class = client.connection_pool.connection_class
        send = connection_class.send_packed_command

        def counting(connection: object, *args: object, **kwargs: object) -> object:
            self.count += 1
            return send(connection, *args, **kwargs)

        monkeypatch.setattr(connection_class, "send_packed_command", counting)


def test_grant_many_reports_exactly_the_new_leases(leases: Leases) -> None:
    # given a valid lease, an expired one, a dropped one, and an agent never leased
    leases.grant("valid", QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.grant("expired", QUEUE, now_ms=T0 - 120_000, ttl_s=TTL_S)
    leases.grant("dropped", QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.drop("dropped")
    agents = ["valid", "expired", "dropped", "never"]
    # when all four are granted at once
    new = leases.grant_many(agents, "queue-b", now_ms=T0 + 1_000, ttl_s=TTL_S)
    # then the three without a valid lease are new, in the order given
    assert new == ["expired", "dropped", "never"]
    assert sorted(leases.live_agents(now_ms=T0 + 1_000 + 60_000)) == sorted(agents)
    assert leases.live_queues(agents, now_ms=T0 + 1_000) == dict.fromkeys(agents, "queue-b")
    # and renewing them again finds none new
    assert leases.grant_many(agents, "queue-b", now_ms=T0 + 2_000, ttl_s=TTL_S) == []
    assert leases.grant_many([], QUEUE, now_ms=T0, ttl_s=TTL_S) == []


def test_grant_many_after_a_flush_finds_every_lease_new(
    leases: Leases, redis_client: redis.Redis
) -> None:
    agents = [f"agent-{i}" for i in range(5)]
    assert leases.grant_many(agents, QUEUE, now_ms=T0, ttl_s=TTL_S) == agents
    redis_client.flushdb()
    assert leases.grant_many(agents, QUEUE, now_ms=T0 + 20_000, ttl_s=TTL_S) == agents


@pytest.mark.parametrize(("size", "round_trips"), [(1, 1), (GRANT_BATCH, 1), (2_500, 2)])
def test_grant_many_takes_one_round_trip_per_batch(
    leases: Leases, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    size: int, round_trips: int,
) -> None:
    agents = [f"agent-{i:05d}" for i in range(size)]
    leases.grant_many(["warm-up"], QUEUE, now_ms=T0, ttl_s=TTL_S)  # the script is loaded
    counter = RoundTrips(redis_client, monkeypatch)
    new = leases.grant_many(agents, QUEUE, now_ms=T0, ttl_s=TTL_S)
    assert counter.count == round_trips
    assert new == agents
    counter.count = 0
    assert leases.grant_many(agents, QUEUE, now_ms=T0 + 1_000, ttl_s=TTL_S) == []
    assert counter.count == round_trips
