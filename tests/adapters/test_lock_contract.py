"""The per-agent lock contract (docs/architecture.md#timings), on the fake and the real Redis."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import pytest
import redis

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.lock import AgentLocks, LockUnavailable
from dsh_schedule.shared.settings import Settings

AGENT = "agent-1"
SHORT_TTL_S = 0.2  # the only lock TTL the suite waits out


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.prefix)


def locks_on(client: redis.Redis, keys: Keys, ttl_s: float = 5.0) -> AgentLocks:
    return AgentLocks(client, keys, ttl_s=ttl_s)


def test_a_second_holder_is_refused_while_the_first_holds(
    redis_client: redis.Redis, keys: Keys
) -> None:
    # given one holder
    first, second = locks_on(redis_client, keys), locks_on(redis_client, keys)
    with first.hold(AGENT, wait_s=0.1):
        # when another tries within its wait bound, then it gives up
        with pytest.raises(LockUnavailable) as refused, second.hold(AGENT, wait_s=0.05):
            pytest.fail("a second holder got in")
        assert refused.value.agent == AGENT
    # and the first one's lock is gone with its block
    assert redis_client.exists(keys.lock(AGENT)) == 0


def test_locks_of_different_agents_are_independent(redis_client: redis.Redis, keys: Keys) -> None:
    locks = locks_on(redis_client, keys)
    with locks.hold("agent-a", wait_s=0.0), locks.hold("agent-b", wait_s=0.0):
        assert redis_client.exists(keys.lock("agent-a"), keys.lock("agent-b")) == 2


def test_a_waiting_holder_gets_in_when_the_holder_releases_within_the_wait(
    redis_client: redis.Redis, keys: Keys
) -> None:
    # given a holder that lets go shortly, from another thread
    first, second = locks_on(redis_client, keys), locks_on(redis_client, keys)
    held, let_go = threading.Event(), threading.Event()

    def hold_until_told() -> None:
        with first.hold(AGENT, wait_s=0.0):
            held.set()
            let_go.wait(timeout=5.0)

    holder = threading.Thread(target=hold_until_told)
    holder.start()
    assert held.wait(timeout=5.0)
    threading.Timer(0.05, let_go.set).start()
    # when a second holder waits (bound well above the release delay)
    entered = False
    with second.hold(AGENT, wait_s=5.0):
        entered = True
    holder.join(timeout=5.0)
    # then it got in
    assert entered


def test_the_lock_expires_after_its_ttl_and_another_holder_gets_in(
    redis_client: redis.Redis, keys: Keys
) -> None:
    # given a holder whose lock has a short TTL and who never lets go
    stale = locks_on(redis_client, keys, ttl_s=SHORT_TTL_S)
    fresh = locks_on(redis_client, keys)
    with ExitStack() as stale_block:
        stale_block.enter_context(stale.hold(AGENT, wait_s=0.0))
        # when another holder waits longer than the TTL, then it gets in
        with fresh.hold(AGENT, wait_s=5.0):
            assert redis_client.exists(keys.lock(AGENT)) == 1
            # and when the expired holder leaves its block, that is no error ...
            stale_block.close()
            # ... and the new holder's lock is still there
            assert redis_client.exists(keys.lock(AGENT)) == 1
            with pytest.raises(LockUnavailable), fresh.hold(AGENT, wait_s=0.0):
                pytest.fail("the expired holder's release deleted the new holder's lock")


def test_a_release_after_expiry_without_takeover_does_not_raise(
    redis_client: redis.Redis, keys: Keys
) -> None:
    locks = locks_on(redis_client, keys, ttl_s=SHORT_TTL_S)
    with locks.hold(AGENT, wait_s=0.0):
        # the key disappears under the holder (expiry, or a flushed Redis)
        redis_client.delete(keys.lock(AGENT))
    assert redis_client.exists(keys.lock(AGENT)) == 0


def test_the_lock_can_be_released_from_another_thread(
    redis_client: redis.Redis, keys: Keys
) -> None:
    # given the lock taken in one thread
    locks = locks_on(redis_client, keys)
    block = locks.hold(AGENT, wait_s=0.0)
    taker = threading.Thread(target=block.__enter__)
    taker.start()
    taker.join(timeout=5.0)
    assert redis_client.exists(keys.lock(AGENT)) == 1
    # when another thread leaves the block
    releaser = threading.Thread(target=block.__exit__, args=(None, None, None))
    releaser.start()
    releaser.join(timeout=5.0)
    # then the lock is really gone (a thread-local token would have left it in place)
    assert redis_client.exists(keys.lock(AGENT)) == 0
    with locks.hold(AGENT, wait_s=0.0):
        pass


def test_the_lock_key_is_under_the_prefix(redis_client: redis.Redis, keys: Keys) -> None:
    with locks_on(redis_client, keys).hold(AGENT, wait_s=0.0):
        written = [k.decode() for k in redis_client.scan_iter(match="*")]
    assert written == [keys.lock(AGENT)]
    assert keys.lock(AGENT).startswith(keys.prefix)
