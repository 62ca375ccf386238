"""Timers of the sessions no host has loaded (docs/architecture.md#unloaded-sessions), on
with ``Settings.wake_unloaded``; its scripts are the ``lua/unloaded_*.lua`` files.

A live agent's timer is its wake. A session no host serves has its timer in one ZSET per
host group (queue): session -> the epoch ms it falls due. It is written when a live agent
is disposed of (from its fold) or retired with its dead host (from its wake's moment), and
rebuilt from the store's index of next due moments at a host's start, after Redis lost
its data and on ``rebuild``. The scheduler's pass (``take_due``) drops the timer of a
session that became live and announces every other due one, once, on the host group's
load request stream, moving its timer on by a doubling backoff: a host that declines or
fails is asked again, never in a tight loop. A host claims a load (``claim``) before it
loads, so two hosts never load one session at once. A stale timer can only be early: the
loaded agent's due transaction decides again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple

import redis

from dsh_schedule.shared.coordination.followups import stream_id_ms
from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import DUE_PAGE, DueEntry, SessionStore

_PARK: Final = LuaScript("unloaded_park")
_WRITE: Final = LuaScript("unloaded_write")
_TAKE: Final = LuaScript("unloaded_take")
_CLAIM: Final = LuaScript("unloaded_claim")

TAKE_MAX: Final = 1000  # timers one pass takes per queue and script call
REQUESTS_MAXLEN: Final = 10_000  # the request stream's approximate length limit
# How long a live session whose lock is held keeps its timer before the pass looks again
# (it may be being disposed of, and its timer must then stay).
LOCKED_RETRY_MS: Final = 1_000
PARK_BATCH: Final = 500  # sessions per park or rebuild script call
REQUESTS_START: Final = "0-0"

Claim = Literal["claimed", "live", "taken"]


class Announced(NamedTuple):
    """A load request the scheduler's pass announced: the session, the how-many-th
    request since its timer was written, and when it is asked again (ms from now)."""

    queue: str
    session: str
    attempt: int
    backoff_ms: int


class LoadRequest(NamedTuple):
    """A load request as a host reads it; ``announced_ms`` on Redis's clock."""

    session: str
    attempt: int
    announced_ms: int


class Outstanding(NamedTuple):
    """What ``status`` shows of one queue: timers of unloaded sessions, and the requests
    outstanding among them."""

    queue: str
    timers: int
    requests: int


class UnloadedTimers:
    """The timers of unloaded sessions of one deployment, and their load requests."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: Settings) -> None:
        self._client = client
        self._keys = keys
        self._first_ms = int(settings.load_retry_s * 1000)
        self._longest_ms = max(int(settings.load_retry_max_s * 1000), self._first_ms)
        self.next_due_ms: int | None = None  # the earliest timer after the last pass

    # -- writing timers ----------------------------------------------------------------

    def park(self, queue: str, moments: Mapping[str, int | None]) -> int:
        """Write each session's timer at its moment (None: remove it) and forget its
        requests outstanding; how many timers were written. Sessions being disposed of:
        call it while their locks are held and before their leases go, so no pass sees
        them unloaded without a timer."""
        items = list(moments.items())
        if not items:
            return 0
        written = 0
        for start in range(0, len(items), PARK_BATCH):
            chunk = items[start:start + PARK_BATCH]
            written += int(_PARK.run(self._client, [
                self._keys.unloaded(queue), self._keys.load_attempts(queue),
                self._keys.unloaded_queues(), self._keys.mover_nudge()], [
                queue, *(part for session, due in chunk for part in (session, _ms(due)))]))
        self._leave_other_queues(queue, [session for session, due in items if due is not None])
        return written

    def _leave_other_queues(self, queue: str, sessions: Sequence[str]) -> None:
        """A session has one timer, on the queue that let it go last: its timers on the
        other queues go (its lease moved from one of them). Not in the park's script: a
        crash between the two leaves a stale timer, which is only ever early."""
        if not sessions:
            return
        members: Any = self._client.smembers(self._keys.unloaded_queues())
        others = [name for name in map(_text, members) if name != queue]
        if not others:
            return
        with self._client.pipeline(transaction=False) as pipe:
            for other in others:
                for start in range(0, len(sessions), PARK_BATCH):
                    chunk = sessions[start:start + PARK_BATCH]
                    pipe.zrem(self._keys.unloaded(other), *chunk)
                    pipe.hdel(self._keys.load_attempts(other), *chunk)
            pipe.execute()

    def park_wakes(self, agents: Sequence[str]) -> int:
        """Park each agent at its wake's moment (retiring a dead host's agents, whose
        logs this process does not read): its scheduled target, or now when its wake is
        queued or running; an agent with no wake has no timer. Two round trips."""
        if not agents:
            return 0
        scheduled = self._keys.scheduled_jobs()
        with self._client.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hmget(self._keys.lease_queue(), list(agents))
            for agent in agents:
                pipe.get(self._keys.current_wake(agent))
            replies = pipe.execute()
        seconds, micros = replies[0]
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        queues, wakes = replies[1], replies[2:]
        with self._client.pipeline(transaction=False) as pipe:
            for wake in wakes:
                pipe.zscore(scheduled, wake if wake is not None else "")
            scores = pipe.execute()
        by_queue: dict[str, dict[str, int | None]] = {}
        for agent, queue, wake, score in zip(agents, queues, wakes, scores, strict=True):
            if wake is None or queue is None:
                continue
            moment = now_ms if score is None else round(float(score) * 1000)
            by_queue.setdefault(_text(queue), {})[agent] = moment
        return sum(self.park(queue, moments) for queue, moments in by_queue.items())

    def rebuild(self, store: SessionStore, queue: str, *, now_ms: int,
                page: int = DUE_PAGE) -> int:
        """Write from the store's index the timer of every session of ``queue``'s store
        that has a next due moment and that no live host serves, unless an earlier one is
        there; how many were written. One page of the index at a time: the store folds
        again only the logs that grew since their entry."""
        written = 0
        after: str | None = None
        while True:
            entries = store.due_index(after=after, limit=page)
            written += self._rebuild_page(queue, entries, now_ms)
            if len(entries) < page:
                return written
            after = entries[-1].session_id

    def _rebuild_page(self, queue: str, entries: Sequence[DueEntry], now_ms: int) -> int:
        return self._write(queue, "min", [(e.session_id, e.due_ms) for e in entries], now_ms)

    def offer(self, queue: str, moments: Mapping[str, int | None], *, now_ms: int) -> int:
        """Write the timer of each of these sessions that no live host serves at its
        moment (None: remove it), from a transaction's own fold, its lock held (a tool
        call on a session no host has loaded); a live session is left to its wake. How
        many timers were written."""
        return self._write(queue, "set", list(moments.items()), now_ms)

    def _write(self, queue: str, mode: str, items: Sequence[tuple[str, int | None]],
               now_ms: int) -> int:
        written = 0
        for start in range(0, len(items), PARK_BATCH):
            chunk = items[start:start + PARK_BATCH]
            written += int(_WRITE.run(self._client, [
                self._keys.unloaded(queue), self._keys.load_attempts(queue),
                self._keys.unloaded_queues(), self._keys.agent_host(), self._keys.hosts(),
                self._keys.mover_nudge()], [
                queue, now_ms, mode,
                *(part for session, due in chunk for part in (session, _ms(due)))]))
        return written

    # -- the scheduler's pass ----------------------------------------------------------

    def take_due(self, now_ms: int) -> list[Announced]:
        """Announce every unloaded session whose timer is due at ``now_ms`` (drop the
        timers of sessions that became live); one script call per queue and
        ``TAKE_MAX`` due timers, plus one read of the queues. Afterwards ``next_due_ms``
        is the earliest timer left (None: none)."""
        announced: list[Announced] = []
        earliest: int | None = None
        for queue in sorted(_text(q) for q in self._client.smembers(
                self._keys.unloaded_queues())):
            while True:
                reply: Any = _TAKE.run(self._client, [
                    self._keys.unloaded(queue), self._keys.load_attempts(queue),
                    self._keys.load_requests(queue), self._keys.hosts(),
                    self._keys.agent_host()], [
                    now_ms, TAKE_MAX, self._first_ms, self._longest_ms, self._keys.lock(""),
                    REQUESTS_MAXLEN, LOCKED_RETRY_MS])
                first, taken = reply
                announced.extend(Announced(queue, _text(s), int(a), int(b))
                                 for s, a, b in taken)
                if len(taken) < TAKE_MAX:
                    break
            if first:
                due = round(float(first))
                earliest = due if earliest is None else min(earliest, due)
        self.next_due_ms = earliest
        return announced

    # -- hosts ---------------------------------------------------------------------------

    def read_requests(self, queue: str, cursor: str, *, block_ms: int | None,
                      count: int) -> tuple[str, list[LoadRequest]]:
        """The load requests on ``queue``'s stream after ``cursor`` (at most ``count``,
        waiting up to ``block_ms`` for one), and the cursor to read on from."""
        reply: Any = self._client.xread({self._keys.load_requests(queue): cursor},
                                        count=count, block=block_ms)
        requests: list[LoadRequest] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                cursor = _text(entry_id)
                session = fields.get(b"session")
                if session is None:
                    continue
                requests.append(LoadRequest(_text(session), int(fields.get(b"attempt", 1)),
                                            stream_id_ms(cursor)))
        return cursor, requests

    def newest_request(self, queue: str) -> str:
        """The id of the newest request on ``queue``'s stream (``REQUESTS_START``: none):
        a host starting reads from there, since every timer older is announced again."""
        newest: Any = self._client.xrevrange(self._keys.load_requests(queue), count=1)
        return _text(newest[0][0]) if newest else REQUESTS_START

    def claim(self, sessions: Sequence[str], host: str, *, now_ms: int,
              ttl_ms: int) -> list[Claim]:
        """Claim the load of each of ``sessions`` for ``host`` for ``ttl_ms``, in order
        (one round trip): ``live`` when a live host serves it, ``taken`` when another host
        claimed it, else ``claimed``."""
        agent_host, hosts = self._keys.agent_host(), self._keys.hosts()
        replies = _CLAIM.run_items(self._client, [
            ([agent_host, hosts, self._keys.loading(session)], [session, now_ms, host, ttl_ms])
            for session in sessions])
        return [_text(reply) for reply in replies]  # type: ignore[misc]  # the script's words

    def release(self, sessions: Sequence[str]) -> None:
        """Forget the load claims of ``sessions`` (their loads ended, loaded or not): one
        command per ``PARK_BATCH``."""
        for start in range(0, len(sessions), PARK_BATCH):
            self._client.delete(*map(self._keys.loading, sessions[start:start + PARK_BATCH]))

    def outstanding(self) -> list[Outstanding]:
        """Per queue with timers: how many timers and requests outstanding (one round
        trip after the read of the queues)."""
        queues = sorted(_text(q) for q in self._client.smembers(self._keys.unloaded_queues()))
        with self._client.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.zcard(self._keys.unloaded(queue))
                pipe.hlen(self._keys.load_attempts(queue))
            counts = pipe.execute() if queues else []
        return [Outstanding(queue, int(counts[2 * i]), int(counts[2 * i + 1]))
                for i, queue in enumerate(queues)]


def _ms(due: int | None) -> str:
    return "" if due is None else str(int(due))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["Announced", "Claim", "LoadRequest", "Outstanding", "UnloadedTimers",
           "REQUESTS_START"]

