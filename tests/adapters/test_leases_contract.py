"""The live-lease contract (docs/architecture.md#hosts-followups-and-rebuild), on the fake and
the real Redis."""

from __future__ import annotations

import pytest
import redis

from dsh_schedule.shared.coordination.followups import Followups, Pair
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.leases import (
    DIGEST_MODULUS,
    INSTALL_BATCH,
    HostRenewal,
    Leases,
    agent_digest,
)
from dsh_schedule.shared.settings import Settings
from tests.support import add_followup

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
    assert bool(leases.live_among([AGENT], now_ms=second_grant_ms + 60_000)) is True


@pytest.mark.parametrize(
    ("now_ms", "live"),
    [(T0, True), (EXPIRY - 1, True), (EXPIRY, True), (EXPIRY + 1, False)],
    ids=["at-grant", "before-expiry", "at-expiry", "after-expiry"],
)
def test_an_agent_is_live_while_its_hosts_lease_is(
    leases: Leases, now_ms: int, live: bool
) -> None:
    # given a host whose lease runs 60 s from T0, and one whose lease stays live throughout
    leases.install("host-a", [AGENT], QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.install("host-b", ["agent-long"], QUEUE, now_ms=T0, ttl_s=3600.0)
    # then every view agrees on the agent at that instant
    assert bool(leases.live_among([AGENT], now_ms=now_ms)) is live
    assert (AGENT in leases.live_agents(now_ms=now_ms)) is live
    assert ("host-a" in leases.expired_hosts(now_ms=now_ms)) is not live
    assert "agent-long" in leases.live_agents(now_ms=now_ms)
    assert "host-b" not in leases.expired_hosts(now_ms=now_ms)


def test_an_unknown_agent_is_neither_live_nor_served(leases: Leases) -> None:
    assert leases.live_among([AGENT], now_ms=T0) == []
    assert leases.live_agents(now_ms=T0) == []
    assert leases.expired_hosts(now_ms=T0) == []
    assert leases.queues_of([AGENT])[0] == DEFAULT_QUEUE


def test_the_lease_records_the_queue_and_a_new_install_moves_it(leases: Leases) -> None:
    leases.install("host-a", [AGENT], QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.install("host-b", ["agent-2"], "queue-b", now_ms=T0, ttl_s=TTL_S)
    assert leases.queues_of([AGENT])[0] == QUEUE
    assert leases.queues_of(["agent-2"])[0] == "queue-b"
    assert leases.live_among([AGENT, "agent-2", "agent-3"], now_ms=T0) == [AGENT, "agent-2"]
    assert leases.queues_of([AGENT, "agent-2"]) == [QUEUE, "queue-b"]
    leases.install("host-a", [AGENT], "queue-c", now_ms=T0 + 1_000, ttl_s=TTL_S)
    assert leases.queues_of([AGENT])[0] == "queue-c"


def test_another_host_installing_an_agent_takes_it_over(leases: Leases) -> None:
    # given an agent served by host-a
    leases.install("host-a", [AGENT, "agent-2"], QUEUE, now_ms=T0, ttl_s=TTL_S)
    # when host-b installs it (a session resumed elsewhere)
    assert leases.install("host-b", [AGENT], "queue-b", now_ms=T0 + 1_000,
                          ttl_s=TTL_S) == [AGENT]
    # then host-b serves it, on its queue, and host-a's set no longer holds it
    assert leases.hosts_of([AGENT, "agent-2"], now_ms=T0 + 1_000) == ["host-b", "host-a"]
    assert leases.queues_of([AGENT])[0] == "queue-b"
    assert leases.served_here("host-a", [AGENT, "agent-2"]) == [False, True]
    # and host-a's lease expiring leaves it live
    assert bool(leases.live_among([AGENT], now_ms=EXPIRY + 500)) is True
    assert bool(leases.live_among(["agent-2"], now_ms=EXPIRY + 500)) is False


def test_drop_forgets_the_lease_and_its_queue(leases: Leases) -> None:
    leases.install("host-a", [AGENT, "agent-2"], QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.drop([AGENT])
    assert bool(leases.live_among([AGENT], now_ms=T0)) is False
    assert leases.queues_of([AGENT])[0] == DEFAULT_QUEUE
    assert leases.live_agents(now_ms=T0) == ["agent-2"]
    assert leases.still_served("host-a", 10) == ["agent-2"]
    # and a later grant is new again
    assert leases.install("host-a", [AGENT], QUEUE, now_ms=T0 + 1_000, ttl_s=TTL_S) == [AGENT]


def test_renewing_a_host_reports_its_lease_and_its_served_set(
    leases: Leases, redis_client: redis.Redis
) -> None:
    leases.install("host-a", [AGENT, "agent-2"], QUEUE, now_ms=T0, ttl_s=TTL_S)
    both = (agent_digest(AGENT) + agent_digest("agent-2")) % DIGEST_MODULUS
    assert leases.renew_host("host-a", now_ms=T0 + 20_000, ttl_s=TTL_S) == HostRenewal(
        was_valid=True, served=2, digest=both)
    # a renewal after the lease ran out says so, and renews it
    assert leases.renew_host("host-a", now_ms=T0 + 200_000, ttl_s=TTL_S) == HostRenewal(
        was_valid=False, served=2, digest=both)
    assert bool(leases.live_among([AGENT], now_ms=T0 + 200_000))
    redis_client.flushdb()
    assert leases.renew_host("host-a", now_ms=T0 + 220_000, ttl_s=TTL_S) == HostRenewal(
        was_valid=False, served=0, digest=0)


def test_the_host_digest_follows_every_entry_the_scripts_write(
    leases: Leases, redis_client: redis.Redis
) -> None:
    """The digest names exactly the agents whose agent-host entry names the host: an
    install adds, a move takes from the old host, a drop takes away; a lost entry whose
    write Redis lost shows as a digest that differs from the host's own."""
    leases.install("host-a", [AGENT, "agent-2"], QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.install("host-b", ["agent-2"], QUEUE, now_ms=T0, ttl_s=TTL_S)
    renew = leases.renew_host
    assert renew("host-a", now_ms=T0, ttl_s=TTL_S).digest == agent_digest(AGENT)
    assert renew("host-b", now_ms=T0, ttl_s=TTL_S).digest == agent_digest("agent-2")
    leases.install("host-a", [AGENT], QUEUE, now_ms=T0, ttl_s=TTL_S)  # unchanged
    assert renew("host-a", now_ms=T0, ttl_s=TTL_S).digest == agent_digest(AGENT)
    leases.drop([AGENT])
    assert renew("host-a", now_ms=T0, ttl_s=TTL_S).digest == 0
    leases.reset_digest("host-a", 12345)
    assert renew("host-a", now_ms=T0, ttl_s=TTL_S).digest == 12345


def test_an_expired_host_is_forgotten_once_its_agents_are_retired(leases: Leases) -> None:
    leases.install("host-a", [AGENT, "agent-2"], QUEUE, now_ms=T0, ttl_s=TTL_S)
    later = EXPIRY + 1
    assert leases.expired_hosts(now_ms=later) == ["host-a"]
    assert leases.forget_host("host-a", now_ms=later) is False  # it still serves agents
    leases.drop(sorted(leases.still_served("host-a", 10)))
    assert leases.forget_host("host-a", now_ms=later) is True
    assert leases.expired_hosts(now_ms=later) == []


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
    assert bool(leases.live_among([AGENT], now_ms=T0 + 20_000))
    assert leases.queues_of([AGENT])[0] == QUEUE
    assert leases.grant(AGENT, QUEUE, now_ms=T0 + 40_000, ttl_s=TTL_S) is False
    # and an entry added now is read by a host consumer (the group comes back on read)
    followups = Followups(redis_client, keys)
    add_followup(followups, AGENT, "hello", [Pair(scheduleId="schedule-1", occurrenceAt="x")])
    assert [e.text for e in followups.read(AGENT, "host-1")] == ["hello"]


def test_a_group_over_an_existing_stream_sees_its_entries(
    leases: Leases, redis_client: redis.Redis, keys: Keys
) -> None:
    """Entries re-projected before the lease came back are not skipped by the new group."""
    followups = Followups(redis_client, keys)
    add_followup(followups, AGENT, "early", [])
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    assert [e.text for e in followups.read(AGENT, "host-1")] == ["early"]


def test_lease_keys_are_under_the_prefix(
    leases: Leases, redis_client: redis.Redis, keys: Keys
) -> None:
    leases.grant(AGENT, QUEUE, now_ms=T0, ttl_s=TTL_S)
    written = sorted(k.decode() for k in redis_client.scan_iter(match="*"))
    # an idle agent's lease holds no stream: memory per live agent stays small
    assert written == sorted([keys.hosts(), keys.served("host"), keys.agent_host(),
                              keys.lease_queue(), keys.host_digest()])


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


def test_an_install_reports_exactly_the_new_leases(leases: Leases) -> None:
    # given a valid lease, one whose host expired, a dropped one, and an agent never leased
    leases.grant("valid", QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.grant("expired", QUEUE, now_ms=T0 - 120_000, ttl_s=TTL_S, host="gone")
    leases.grant("dropped", QUEUE, now_ms=T0, ttl_s=TTL_S)
    leases.drop(["dropped"])
    agents = ["valid", "expired", "dropped", "never"]
    # when all four are installed at once
    new = leases.install("host", agents, "queue-b", now_ms=T0 + 1_000, ttl_s=TTL_S)
    # then the three without a valid lease here are new, in the order given
    assert new == ["expired", "dropped", "never"]
    assert sorted(leases.live_agents(now_ms=T0 + 1_000 + 60_000)) == sorted(agents)
    assert leases.live_among(agents, now_ms=T0 + 1_000) == agents
    assert leases.queues_of(agents) == ["queue-b"] * len(agents)
    # and renewing them again finds none new
    assert leases.install("host", agents, "queue-b", now_ms=T0 + 2_000, ttl_s=TTL_S) == []
    assert leases.install("host", [], QUEUE, now_ms=T0, ttl_s=TTL_S) == []


def test_an_install_after_a_flush_finds_every_lease_new(
    leases: Leases, redis_client: redis.Redis
) -> None:
    agents = [f"agent-{i}" for i in range(5)]
    assert leases.install("host", agents, QUEUE, now_ms=T0, ttl_s=TTL_S) == agents
    redis_client.flushdb()
    assert leases.install("host", agents, QUEUE, now_ms=T0 + 20_000, ttl_s=TTL_S) == agents


@pytest.mark.parametrize(("size", "round_trips"), [(1, 1), (INSTALL_BATCH, 1), (2_500, 2)])
def test_an_install_takes_one_round_trip_per_batch(
    leases: Leases, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    size: int, round_trips: int,
) -> None:
    agents = [f"agent-{i:05d}" for i in range(size)]
    leases.install("host", ["warm-up"], QUEUE, now_ms=T0, ttl_s=TTL_S)  # the script is loaded
    counter = RoundTrips(redis_client, monkeypatch)
    new = leases.install("host", agents, QUEUE, now_ms=T0, ttl_s=TTL_S)
    assert counter.count == round_trips
    assert new == agents
    counter.count = 0
    assert leases.install("host", agents, QUEUE, now_ms=T0 + 1_000, ttl_s=TTL_S) == []
    assert counter.count == round_trips


@pytest.mark.parametrize("size", [1, 5_000])
def test_a_host_renewal_is_one_round_trip_whatever_it_serves(
    leases: Leases, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch, size: int,
) -> None:
    leases.install("host", [f"agent-{i:05d}" for i in range(size)], QUEUE, now_ms=T0,
                   ttl_s=TTL_S)
    leases.renew_host("host", now_ms=T0, ttl_s=TTL_S)  # the script is loaded
    counter = RoundTrips(redis_client, monkeypatch)
    assert leases.renew_host("host", now_ms=T0 + 20_000, ttl_s=TTL_S).served == size
    assert counter.count == 1
