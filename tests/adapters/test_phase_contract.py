"""The agent phase contract (docs/architecture.md#the-due-transaction), on the fake and the
real Redis."""

from __future__ import annotations

import time

import pytest
import redis

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.phase import AgentPhase, Release
from dsh_schedule.shared.settings import Settings
from tests.support import phase_holder

AGENT = "agent-1"
TTL_S = 10.0


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.prefix)


@pytest.fixture
def phase(redis_client: redis.Redis, keys: Keys) -> AgentPhase:
    return AgentPhase(redis_client, keys)


def waiter_registered(client: redis.Redis, keys: Keys) -> bool:
    return bool(client.exists(keys.idle_waiter(AGENT)))


def test_maintenance_claims_a_free_agent_and_then_a_turn_cannot(
    phase: AgentPhase, redis_client: redis.Redis, keys: Keys
) -> None:
    assert phase.claim([AGENT], "maintenance", "m1", TTL_S)[0] is True
    assert phase_holder(phase, AGENT) == "maintenance:m1"
    assert phase.claim_turn(AGENT, "t1", TTL_S) is False
    # a refused turn registers no idle waiter: it waits for the release itself
    assert not waiter_registered(redis_client, keys)
    assert phase_holder(phase, AGENT) == "maintenance:m1"


def test_a_turn_claims_a_free_agent_and_a_second_turn_cannot(phase: AgentPhase) -> None:
    assert phase.claim_turn(AGENT, "t1", TTL_S) is True
    assert phase.claim_turn(AGENT, "t2", TTL_S) is False
    assert phase_holder(phase, AGENT) == "turn:t1"


@pytest.mark.parametrize("owner_kind", ["turn", "maintenance"])
def test_maintenance_on_a_held_agent_registers_an_idle_waiter(
    phase: AgentPhase, redis_client: redis.Redis, keys: Keys, owner_kind: str
) -> None:
    # given the phase held by a turn or by another maintenance
    assert phase.claim([AGENT], owner_kind, "owner", TTL_S) == [True]
    # when maintenance tries to claim
    claimed = phase.claim([AGENT], "maintenance", "m2", TTL_S)[0]
    # then it is refused, the owner keeps the phase and a waiter is registered
    assert claimed is False
    assert phase_holder(phase, AGENT) == f"{owner_kind}:owner"
    assert waiter_registered(redis_client, keys)
    # and the owner's release reports the waiter and clears it
    assert phase.release([AGENT], owner_kind, "owner")[0] is Release.WAITER_WOKEN
    assert not waiter_registered(redis_client, keys)
    assert phase_holder(phase, AGENT) is None


def test_a_release_without_a_waiter_just_releases(phase: AgentPhase) -> None:
    assert phase.claim_turn(AGENT, "t1", TTL_S)
    assert phase.release([AGENT], "turn", "t1")[0] is Release.RELEASED
    assert phase_holder(phase, AGENT) is None
    assert phase.claim([AGENT], "maintenance", "m1", TTL_S)[0] is True


@pytest.mark.parametrize(
    ("kind", "token"),
    [("turn", "other"), ("maintenance", "t1"), ("maintenance", "other")],
    ids=["wrong-token", "wrong-kind", "wrong-both"],
)
def test_a_release_by_a_non_owner_changes_nothing(
    phase: AgentPhase, redis_client: redis.Redis, keys: Keys, kind: str, token: str
) -> None:
    # given a turn holding the phase and maintenance waiting on it
    assert phase.claim_turn(AGENT, "t1", TTL_S)
    assert not phase.claim([AGENT], "maintenance", "m1", TTL_S)[0]
    # when someone else releases
    result = phase.release([AGENT], kind, token)[0]
    # then nothing changes
    assert result is Release.NOT_OWNER
    assert phase_holder(phase, AGENT) == "turn:t1"
    assert waiter_registered(redis_client, keys)


def test_a_release_of_a_free_phase_is_not_owner(phase: AgentPhase) -> None:
    assert phase.release([AGENT], "turn", "t1")[0] is Release.NOT_OWNER


def test_renew_extends_the_ttl_for_the_owner_only(
    phase: AgentPhase, redis_client: redis.Redis, keys: Keys
) -> None:
    # given a turn with a short TTL
    assert phase.claim_turn(AGENT, "t1", 1.0)
    # when a non-owner renews, then it is refused and the TTL is untouched
    assert phase.renew([AGENT], "turn", "other", 60.0)[0] is False
    assert phase.renew([AGENT], "maintenance", "t1", 60.0)[0] is False
    assert 0 < redis_client.pttl(keys.phase(AGENT)) <= 1000
    # when the owner renews, then the TTL is extended
    assert phase.renew([AGENT], "turn", "t1", 60.0)[0] is True
    assert redis_client.pttl(keys.phase(AGENT)) > 1000
    assert phase_holder(phase, AGENT) == "turn:t1"


def test_renew_of_a_lost_phase_is_refused_and_claims_nothing(phase: AgentPhase) -> None:
    assert phase.renew([AGENT], "turn", "t1", TTL_S)[0] is False
    assert phase_holder(phase, AGENT) is None


def test_the_phase_expires_after_its_ttl(phase: AgentPhase) -> None:
    # given a turn that crashed while holding the phase with a short TTL
    assert phase.claim_turn(AGENT, "t1", 0.1)
    # when the TTL has passed
    time.sleep(0.15)
    # then the phase is free for maintenance, and the late owner cannot renew it
    assert phase_holder(phase, AGENT) is None
    assert phase.claim([AGENT], "maintenance", "m1", TTL_S)[0] is True
    assert phase.renew([AGENT], "turn", "t1", TTL_S)[0] is False
    assert phase.release([AGENT], "turn", "t1")[0] is Release.NOT_OWNER
    assert phase_holder(phase, AGENT) == "maintenance:m1"


def test_forget_removes_the_phase_and_the_waiter(
    phase: AgentPhase, redis_client: redis.Redis, keys: Keys
) -> None:
    assert phase.claim_turn(AGENT, "t1", TTL_S)
    assert not phase.claim([AGENT], "maintenance", "m1", TTL_S)[0]
    phase.forget([AGENT])
    assert phase_holder(phase, AGENT) is None
    assert not waiter_registered(redis_client, keys)
    assert phase.claim([AGENT], "maintenance", "m1", TTL_S)[0] is True


def test_phases_of_different_agents_are_independent(phase: AgentPhase) -> None:
    assert phase.claim_turn("agent-a", "t1", TTL_S)
    assert phase.claim(["agent-b"], "maintenance", "m1", TTL_S)[0] is True
    assert phase.release(["agent-a"], "turn", "t1")[0] is Release.RELEASED
    assert phase_holder(phase, "agent-b") == "maintenance:m1"


def test_phase_keys_are_under_the_prefix(
    phase: AgentPhase, redis_client: redis.Redis, keys: Keys
) -> None:
    assert phase.claim_turn(AGENT, "t1", TTL_S)
    assert not phase.claim([AGENT], "maintenance", "m1", TTL_S)[0]
    written = sorted(k.decode() for k in redis_client.scan_iter(match="*"))
    assert written == sorted([keys.phase(AGENT), keys.idle_waiter(AGENT)])
