"""The followup stream contract (docs/architecture.md#hosts-followups-and-rebuild), on the fake
and the real Redis."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.followups import FollowupEntry, Followups, Pair
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.settings import Settings
from tests.support import add_followup

AGENT = "agent-1"
SINGLE_TEXT = '[SCHEDULE REMINDER]\nreminder_prompt_json: "call Ana \u2603"'
SINGLE = (Pair(scheduleId="schedule-1", occurrenceAt="2026-12-01T16:00:00.000Z"),)
BATCH_TEXT = "[SCHEDULE REMINDER BATCH]\nreminders_json: [...]"
BATCH = (
    Pair(scheduleId="schedule-3", occurrenceAt="2026-12-01T10:00:00.000Z"),
    Pair(scheduleId="schedule-2", occurrenceAt="2026-12-01T09:30:00.000Z"),
)


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return Keys(settings.prefix)


@pytest.fixture
def followups(redis_client: redis.Redis, keys: Keys) -> Followups:
    """The stream with its consumer group, as its first read creates it."""
    followups = Followups(redis_client, keys)
    followups.ensure_group(AGENT)
    return followups


def ids(entries: list[FollowupEntry]) -> list[str]:
    return [e.entry_id for e in entries]


def test_entries_keep_text_and_pairs_in_order(followups: Followups) -> None:
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    second = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    assert followups.entries([AGENT])[0] == [
        FollowupEntry(entry_id=first, text=SINGLE_TEXT, pairs=SINGLE),
        FollowupEntry(entry_id=second, text=BATCH_TEXT, pairs=BATCH),
    ]
    assert followups.waiting(AGENT) == 2


def test_pairs_are_stored_as_compact_json(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    raw: Any = redis_client.xrange(keys.followups(AGENT))
    ((_, fields),) = raw
    assert fields[b"pairs"] == (
        b'[{"scheduleId":"schedule-1","occurrenceAt":"2026-12-01T16:00:00.000Z"}]'
    )


def test_an_empty_stream_has_no_entries(followups: Followups) -> None:
    assert followups.entries([AGENT])[0] == []
    assert followups.waiting(AGENT) == 0
    assert followups.read(AGENT, "host-1") == []


def test_reading_an_agent_without_a_stream_leaves_it_without_one(
    redis_client: redis.Redis, keys: Keys
) -> None:
    """An idle live agent holds no empty stream, however often a host looks."""
    followups = Followups(redis_client, keys)
    assert followups.read("idle-agent", "host-1") == []
    assert not redis_client.exists(keys.followups("idle-agent"))


def test_read_returns_new_entries_then_the_consumers_unacknowledged_ones(
    followups: Followups,
) -> None:
    # given two entries
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    second = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    # when a host reads them and crashes before acknowledging
    delivered = followups.read(AGENT, "host-1")
    assert ids(delivered) == [first, second]
    assert delivered == followups.entries([AGENT])[0]
    # then its next read returns the same entries again (crash recovery)
    assert followups.read(AGENT, "host-1") == delivered
    # and another consumer of the group gets nothing new
    assert followups.read(AGENT, "host-2") == []


def test_unacknowledged_entries_come_before_new_ones(followups: Followups) -> None:
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    assert ids(followups.read(AGENT, "host-1")) == [first]
    later = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    # the pending one first; the new one once the pending one is done
    assert ids(followups.read(AGENT, "host-1")) == [first]
    followups.done([(AGENT, first)])
    assert ids(followups.read(AGENT, "host-1")) == [later]


def test_read_streams_reads_as_read_does_and_says_whether_it_emptied_the_stream(
    followups: Followups, redis_client: redis.Redis, keys: Keys,
) -> None:
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    # a stream from before its group came with its first entry: read alone, as read does
    second = redis_client.xadd(keys.followups("agent-2"), {"text": "t", "pairs": "[]"}).decode()
    found = followups.read_streams([AGENT, "agent-2", "agent-3"], "host-1", count=2)
    assert {a: (ids(r.entries), r.drained) for a, r in found.items()} == {
        AGENT: ([first], True), "agent-2": ([second], False), "agent-3": ([], False),
    }
    later = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    # its unacknowledged entry first, not known to be the last; then the new ones
    again = followups.read_streams([AGENT], "host-1", count=2)[AGENT]
    assert (ids(again.entries), again.drained) == ([first], False)
    followups.done([(AGENT, first)])
    more = [add_followup(followups, AGENT, SINGLE_TEXT, SINGLE) for _ in range(2)]
    full = followups.read_streams([AGENT], "host-1", count=2)[AGENT]
    assert (ids(full.entries), full.drained) == ([later, more[0]], False)  # count reached
    other = followups.read_streams([AGENT], "host-2")
    assert {a: r.entries for a, r in other.items()} == {
        AGENT: followups.entries([AGENT])[0][2:]}


def test_done_and_waiting_many_take_one_command_for_many_agents(
    followups: Followups,
) -> None:
    added = {agent: add_followup(followups, agent, SINGLE_TEXT, SINGLE)
             for agent in ("a", "b", "c")}
    assert followups.waiting_many(["a", "b", "c", "none"]) == [1, 1, 1, 0]
    followups.done([("a", added["a"]), ("c", added["c"])])
    assert followups.waiting_many(["a", "b", "c"]) == [0, 1, 0]


def test_done_acknowledges_and_deletes(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    # given two entries read by a host
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    second = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    followups.read(AGENT, "host-1")
    # when the host is done with the first one
    followups.done([(AGENT, first)])
    # then only the second is left, in the stream and among the pending
    assert ids(followups.entries([AGENT])[0]) == [second]
    assert followups.waiting(AGENT) == 1
    assert ids(followups.read(AGENT, "host-1")) == [second]
    # and when it is done with the second, nothing is left anywhere
    followups.done([(AGENT, second)])
    assert followups.waiting(AGENT) == 0
    assert followups.read(AGENT, "host-1") == []
    pending = redis_client.xpending(keys.followups(AGENT), "host")
    assert pending["pending"] == 0


def test_done_on_an_entry_never_read_deletes_it(followups: Followups) -> None:
    entry = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    followups.done([(AGENT, entry)])
    assert followups.waiting(AGENT) == 0
    assert followups.read(AGENT, "host-1") == []


def test_claim_stale_hands_over_what_another_consumer_left(followups: Followups) -> None:
    # given entries a crashed host read but never acknowledged
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    second = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    followups.read(AGENT, "crashed-host")
    # when another host claims entries idle for at least 0 ms
    claimed = followups.claim_stale(AGENT, "host-2", min_idle_ms=0)
    # then it gets them whole, and from now on they are its own pending entries
    assert claimed == followups.entries([AGENT])[0]
    assert ids(claimed) == [first, second]
    assert ids(followups.read(AGENT, "host-2")) == [first, second]
    assert followups.read(AGENT, "crashed-host") == []


def test_claim_stale_leaves_entries_that_are_not_idle_long_enough(followups: Followups) -> None:
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    followups.read(AGENT, "busy-host")
    assert followups.claim_stale(AGENT, "host-2", min_idle_ms=3_600_000) == []
    assert len(followups.read(AGENT, "busy-host")) == 1


def test_claim_stale_skips_entries_already_done(followups: Followups) -> None:
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    second = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    followups.read(AGENT, "crashed-host")
    followups.done([(AGENT, first)])
    assert ids(followups.claim_stale(AGENT, "host-2", min_idle_ms=0)) == [second]


def test_streams_of_different_agents_are_independent(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    followups.ensure_group("agent-2")
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    other = add_followup(followups, "agent-2", BATCH_TEXT, BATCH)
    assert ids(followups.read("agent-2", "host-1")) == [other]
    assert followups.waiting(AGENT) == 1


def test_drop_removes_the_stream(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    followups.read(AGENT, "host-1")
    followups.drop([AGENT])
    assert redis_client.exists(keys.followups(AGENT)) == 0
    assert followups.entries([AGENT])[0] == []
    assert followups.waiting(AGENT) == 0


def test_followup_keys_are_under_the_prefix(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    written = sorted(k.decode() for k in redis_client.scan_iter(match="*"))
    assert written == sorted([keys.followups(AGENT), keys.followup_counts(),
                              keys.followup_total()])


def test_the_pending_total_follows_every_write_and_read(followups: Followups) -> None:
    """The counter the followup scripts keep: added entries count, acknowledged and
    dropped ones no longer do, and a read changes nothing."""
    assert followups.pending_total() == 0
    ids_a = followups.add([("a", "t", SINGLE), ("a", "u", SINGLE), ("b", "t", SINGLE)])
    add_followup(followups, "c", "t", SINGLE)
    assert followups.pending_total() == 4
    followups.read_streams(["a", "b", "c"], "host-1")
    assert followups.pending_total() == 4
    followups.done([("a", ids_a[0])])
    followups.done([("a", ids_a[0])])  # again: nothing more to take off
    assert followups.pending_total() == 3
    followups.drop(["b", "c", "none"])
    assert followups.pending_total() == 1


def test_a_lost_counter_is_put_right(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    """The total lost alone is summed again from the per-agent counts by the next write;
    streams no script counted (an older version wrote them) count once recounted."""
    followups.add([("a", "t", SINGLE), ("b", "t", SINGLE)])
    redis_client.delete(keys.followup_total())
    add_followup(followups, "c", "t", SINGLE)
    assert followups.pending_total() == 3
    redis_client.delete(keys.followup_total(), keys.followup_counts())
    redis_client.xadd(keys.followups("d"), {"text": "t", "pairs": "[]"})
    followups.recount(["a", "b", "c", "d", "none"])
    assert followups.pending_total() == 4
    followups.recount(["a", "b", "c", "d"])  # idempotent
    assert followups.pending_total() == 4


@pytest.mark.parametrize("flush_first", [False, True])
def test_the_first_read_creates_the_group_and_skips_no_entry(
    redis_client: redis.Redis, keys: Keys, flush_first: bool
) -> None:
    """No group yet (a new stream, or a flushed Redis): the reader creates it from the
    stream's start, so entries added before are still delivered."""
    followups = Followups(redis_client, keys)
    if flush_first:
        followups.ensure_group(AGENT)
        redis_client.flushdb()
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    second = add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    assert ids(followups.read(AGENT, "host-1")) == [first, second]
    # and a second ensure does not fail on the existing group (BUSYGROUP)
    followups.ensure_group(AGENT)


def test_claim_stale_without_a_group_claims_nothing(
    redis_client: redis.Redis, keys: Keys
) -> None:
    followups = Followups(redis_client, keys)
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    assert followups.claim_stale(AGENT, "host-1", min_idle_ms=0) == []


# -- announcements on the ready stream ----------------------------------------------------

QUEUE = "queue-a"


def lease_on(client: redis.Redis, keys: Keys, queue: str, agent: str = AGENT) -> None:
    """What a lease records of the agent's queue (the lease-queue hash)."""
    client.hset(keys.lease_queue(), agent, queue)


def announced(client: redis.Redis, keys: Keys, queue: str) -> list[str]:
    raw: Any = client.xrange(keys.ready(queue))
    return [fields[b"agent"].decode() for _id, fields in raw]


def test_add_announces_the_agent_on_the_queue_its_lease_names(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    lease_on(redis_client, keys, QUEUE)
    entry = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    assert ids(followups.entries([AGENT])[0]) == [entry]
    assert announced(redis_client, keys, QUEUE) == [AGENT]
    assert announced(redis_client, keys, "queue-b") == []


def test_add_without_a_lease_writes_the_entry_and_announces_nothing(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    assert followups.waiting(AGENT) == 1
    assert not any(k.decode().startswith(keys.ready("")) for k in redis_client.scan_iter())


def test_add_announces_where_the_lease_is_when_it_moved_meanwhile(
    followups: Followups, redis_client: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue is looked up before the script runs; a lease that moved in between is
    caught by the script, which announces nothing, and the announcement goes where the
    lease is now."""
    lease_on(redis_client, keys, "queue-now")
    monkeypatch.setattr(redis_client, "hmget", lambda *_args: [b"queue-before"])
    entry = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    assert ids(followups.entries([AGENT])[0]) == [entry]  # written once
    assert announced(redis_client, keys, "queue-now") == [AGENT]
    assert announced(redis_client, keys, "queue-before") == []


def test_a_reader_sees_each_announcement_after_its_cursor_once(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    # given a reader that starts at the stream's newest announcement (none yet)
    followups.ensure_group("agent-2")
    for agent in (AGENT, "agent-2"):
        lease_on(redis_client, keys, QUEUE, agent)
    cursor = followups.ready_cursor(QUEUE)
    # when three entries announce two agents
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    add_followup(followups, "agent-2", BATCH_TEXT, BATCH)
    add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    # then one read names each agent once, in first-announcement order
    first = followups.read_ready(QUEUE, cursor, block_ms=None)
    assert first.agents == (AGENT, "agent-2")
    assert first.cursor == followups.ready_cursor(QUEUE)
    # and reading on from there finds nothing more (without waiting)
    assert followups.read_ready(QUEUE, first.cursor, block_ms=None).agents == ()
    # and every reader sees every announcement: nothing is consumed
    assert followups.read_ready(QUEUE, cursor, block_ms=None).agents == (AGENT, "agent-2")


def test_a_read_from_the_newest_announcement_sees_only_later_ones(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    lease_on(redis_client, keys, QUEUE)
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    cursor = followups.ready_cursor(QUEUE)
    assert followups.read_ready(QUEUE, cursor, block_ms=None).agents == ()
    add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    assert followups.read_ready(QUEUE, cursor, block_ms=50).agents == (AGENT,)


def test_the_ready_stream_is_trimmed_to_its_length_limit(
    redis_client: redis.Redis, keys: Keys
) -> None:
    followups = Followups(redis_client, keys, ready_maxlen=5)
    lease_on(redis_client, keys, QUEUE)
    for _ in range(40):
        add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    assert redis_client.xlen(keys.ready(QUEUE)) == 5
    assert followups.waiting(AGENT) == 40  # the entries themselves are never trimmed


def test_announce_stale_announces_only_streams_whose_oldest_entry_is_old_enough(
    followups: Followups, redis_client: redis.Redis, keys: Keys
) -> None:
    # given an agent with an entry and one with an empty stream, both leased on QUEUE
    followups.ensure_group("agent-2")
    for agent in (AGENT, "agent-2"):
        lease_on(redis_client, keys, QUEUE, agent)
    add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    cursor = followups.ready_cursor(QUEUE)
    both = {QUEUE: [AGENT, "agent-2"]}
    # an hour is older than the entry: nothing is announced
    assert followups.announce_stale(both, older_than_ms=3_600_000) == []
    assert followups.read_ready(QUEUE, cursor, block_ms=None).agents == ()
    # any age at all: the agent with the entry is announced again, the other is not
    assert followups.announce_stale(both, older_than_ms=0) == [AGENT]
    assert followups.read_ready(QUEUE, cursor, block_ms=None).agents == (AGENT,)
    assert followups.announce_stale({}, older_than_ms=0) == []


def test_the_projection_dates_the_oldest_entry_by_the_server_clock(
    followups: Followups, redis_client: redis.Redis, settings: Settings
) -> None:
    followups.ensure_group("agent-2")
    first = add_followup(followups, AGENT, SINGLE_TEXT, SINGLE)
    add_followup(followups, AGENT, BATCH_TEXT, BATCH)
    seconds, micros = redis_client.time()
    oldest, empty = (p.oldest_followup_ms for p in
                     Coordination(redis_client, settings).projections([AGENT, "agent-2"]))
    assert oldest == int(first.split("-")[0])
    assert empty is None
    assert oldest is not None and 0 <= seconds * 1000 + micros // 1000 - oldest < 60_000
