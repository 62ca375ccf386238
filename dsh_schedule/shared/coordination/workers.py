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
from dsh_schedule.shared.coordination.scripts import LuaScript

_BEAT: Final = LuaScript("worker_beat")
_BEATS: Final = LuaScript("worker_beats")
_OVERDUE: Final = LuaScript("worker_overdue")
_SWAP: Final = LuaScript("worker_swap")

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

    # -- the worker's side ------------------------------------------------------------

    def beat_on(self, pipe: Pipeline, name: str, *, next_within_ms: int) -> None:
        """Queue a beat: ``name`` beats again within ``next_within_ms``."""
        _BEAT.queue(pipe, [self.keys.workers(), self.keys.worker_beats()],
                    [next_within_ms, name])

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
        now, flat = _BEATS.run(self.client, [self.keys.worker_beats()])
        return int(now), {_text(flat[i]): int(float(flat[i + 1]))
                          for i in range(0, len(flat), 2)}

    # -- a scheduler's side -----------------------------------------------------------

    def overdue(self) -> tuple[int, list[tuple[str, int, Held | None]]]:
        """Redis's clock, and every worker whose beat is overdue (at most
        ``OVERDUE_LIMIT``): its name, its score, what it held. One round trip."""
        reply = _OVERDUE.run(self.client, [self.keys.workers(), self.keys.worker_holds()],
                             [OVERDUE_LIMIT])
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
        return bool(_SWAP.run(self.client, [self.keys.workers(), self.keys.worker_holds()],
                              [name, seen, "" if new is None else new]))

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
