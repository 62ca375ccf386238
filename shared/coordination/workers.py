"""Worker liveness, and the wakes a dead worker held
(docs/architecture.md#a-dead-workers-wakes).

Every ``worker`` beats into one ZSET (``Keys.workers``: name -> the epoch ms, on Redis's
clock, by which it beats again), from a thread of its own, so it beats while a wake job
runs too (rq's own worker key lives a job's whole timeout past its last beat). While it
executes a wake job it also holds one entry of ``Keys.worker_holds``: the job and the
agents it carries, written in the same pipelines rq uses to start and end the job, so
holding costs no round trip. A scheduler finds the workers whose beat is overdue in one
read, whatever the number of agents, and wakes again exactly the agents they held, once
those agents' locks and maintenance phases have expired.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final, NamedTuple

import redis
from redis.client import Pipeline
from rq.exceptions import NoSuchJobError
from rq.job import Job

from dsh_schedule.shared.coordination.keys import Keys

# KEYS[1] the workers zset, KEYS[2] the beats zset; ARGV[1] ms until the next beat is due,
# ARGV[2] the worker's name. The beat's score is Redis's clock plus that, so no two
# machines' clocks are compared. Beats a day stale (workers killed long ago) are pruned.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 86400000)
return now
"""

# KEYS[1] the beats zset. Returns {Redis's clock in ms, {name, score, ...}}: every worker
# that beats, and by when it beats again.
_BEATS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')}
"""

# KEYS[1] the workers zset, KEYS[2] the holds hash; ARGV[1] the most workers to return.
# Returns {Redis's clock in ms, {name, score, held or false}...} for every worker whose
# beat is overdue.
_OVERDUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local found = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
                         tonumber(ARGV[1]))
local out = {now}
for i = 1, #found, 2 do
  out[#out + 1] = {found[i], found[i + 1], redis.call('HGET', KEYS[2], found[i]) or false}
end
return out
"""

# KEYS[1] the workers zset, KEYS[2] the holds hash; ARGV[1] the name, ARGV[2] the score it
# was seen with, ARGV[3] the new score ('' removes it and its holds). Changes nothing when
# the score moved meanwhile (the worker beat again, or another scheduler took it): 1 done.
_SWAP = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
return 1
"""

OVERDUE_LIMIT: Final = 100  # dead workers handled per look
MAINTENANCE: Final = b"maintenance:"


class Held(NamedTuple):
    """The wake job a worker was executing, and its agents."""

    job: str
    queue: str
    agents: tuple[str, ...]


class DeadWorker(NamedTuple):
    """A worker whose beat is overdue, as a scheduler took it over."""

    name: str
    held: Held | None
    score: int  # the score it holds while it is being recovered


def encode_held(held: Held) -> str:
    return json.dumps({"job": held.job, "queue": held.queue, "agents": list(held.agents)},
                      separators=(",", ":"))


def decode_held(raw: bytes | str) -> Held | None:
    """The held job of a holds entry; None when it is not one (it is then dropped)."""
    try:
        value = json.loads(raw)
        agents = value["agents"]
        if not (isinstance(value["job"], str) and isinstance(value["queue"], str)
                and isinstance(agents, list) and all(isinstance(a, str) for a in agents)):
            return None
        return Held(value["job"], value["queue"], tuple(agents))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


class WorkerLiveness:
    """The workers' beats and holds under one key prefix."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._overdue = client.register_script(_OVERDUE)
        self._swap = client.register_script(_SWAP)
        self._beats = client.register_script(_BEATS)

    # -- the worker's side ------------------------------------------------------------

    def beat_on(self, pipe: Pipeline, name: str, *, next_within_ms: int) -> None:
        """Queue a beat: ``name`` beats again within ``next_within_ms``."""
        pipe.eval(_BEAT, 2, self.keys.workers(), self.keys.worker_beats(), next_within_ms,
                  name)

    def holding_on(self, pipe: Pipeline | redis.Redis, name: str, held: Held | None) -> None:
        """Queue what ``name`` now executes (None: nothing)."""
        if held is None:
            pipe.hdel(self.keys.worker_holds(), name)
        else:
            pipe.hset(self.keys.worker_holds(), name, encode_held(held))

    def leave(self, name: str) -> None:
        """A worker stopping cleanly: forget its beat and holds."""
        with self.client.pipeline(transaction=False) as pipe:
            pipe.zrem(self.keys.workers(), name)
            pipe.zrem(self.keys.worker_beats(), name)
            pipe.hdel(self.keys.worker_holds(), name)
            pipe.execute()

    # -- health's side ----------------------------------------------------------------

    def beats(self) -> tuple[int, dict[str, int]]:
        """Redis's clock, and each worker that beats with the epoch ms (Redis's clock) by
        which it beats again: overdue, it was killed or hangs. One round trip."""
        now, flat = self._beats(keys=[self.keys.worker_beats()])
        return int(now), {_text(flat[i]): int(float(flat[i + 1]))
                          for i in range(0, len(flat), 2)}

    # -- a scheduler's side -----------------------------------------------------------

    def overdue(self) -> tuple[int, list[tuple[str, int, Held | None]]]:
        """Redis's clock, and every worker whose beat is overdue (at most
        ``OVERDUE_LIMIT``): its name, its score, what it held. One round trip."""
        reply = self._overdue(keys=[self.keys.workers(), self.keys.worker_holds()],
                              args=[OVERDUE_LIMIT])
        now_ms = int(reply[0])
        found: list[tuple[str, int, Held | None]] = []
        for name, score, raw in reply[1:]:
            held = decode_held(raw) if raw else None
            found.append((_text(name), int(float(score)), held))
        return now_ms, found

    def busy_for_ms(self, agents: Sequence[str]) -> int:
        """How long until every one of ``agents`` has neither its lock nor a maintenance
        phase (0: they are all free now). One round trip."""
        if not agents:
            return 0
        with self.client.pipeline(transaction=False) as pipe:
            for agent in agents:
                pipe.pttl(self.keys.lock(agent))
                pipe.get(self.keys.phase(agent))
                pipe.pttl(self.keys.phase(agent))
            replies = pipe.execute()
        wait = 0
        for i in range(0, len(replies), 3):
            lock_ms, phase, phase_ms = replies[i : i + 3]
            wait = max(wait, int(lock_ms))
            if phase is not None and bytes(phase).startswith(MAINTENANCE):
                wait = max(wait, int(phase_ms))
        return wait

    def swap(self, name: str, seen: int, new: int | None) -> bool:
        """Move ``name``'s score from ``seen`` to ``new`` (None: forget it and its
        holds), unless it moved meanwhile; whether it did."""
        return bool(self._swap(keys=[self.keys.workers(), self.keys.worker_holds()],
                               args=[name, seen, "" if new is None else new]))

    def drop_abandoned(self, job_id: str) -> None:
        """Delete the rq job a dead worker was executing, and its entry in rq's started
        registry: its agents are woken again, so rq's own clean-up must not file it as
        failed (``AbandonedJobError``) long after."""
        try:
            Job.fetch(job_id, connection=self.client).delete()
        except NoSuchJobError:
            pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
