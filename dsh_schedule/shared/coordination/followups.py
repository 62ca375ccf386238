"""The per-agent followup stream and the per-queue ready stream
(docs/architecture.md#hosts-followups-and-rebuild).

An entry holds the exact framing text and the ``(scheduleId, occurrenceAt)`` pairs it
covers. The stream is a projection: the host delivers an entry only after checking the
log, and lost entries are re-projected from the log.

An entry is written unannounced (``add``); *announcing* the agent (``announce``)
adds its id to the ready stream of the queue its lease names, which is what a host serving
that queue blocks on. A host therefore learns of a followup without polling every agent's
stream. The due transaction announces its agents once it lets them go, so that a host
does not come for an agent it cannot yet take; ``add`` writes and announces at once. An
announcement is only a hint: a lost one (a host killed while holding it, a trimmed ready
stream, a lease that moved) leaves the entry in the agent's stream, where the reconcile
pass finds it once it is older than the stale age and wakes the agent, whose re-arm
announces it again (``announce_stale``). The ready stream is trimmed to ``READY_MAXLEN``
entries on every announcement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
import redis

from dsh_schedule.shared.coordination.keys import STREAM_GROUP, Keys
from dsh_schedule.shared.coordination.scripts import LuaScript
from dsh_schedule.shared.core.ledger import Pair

READY_MAXLEN: Final = 10_000
READ_COUNT: Final = 16  # the most entries one read of an agent's stream returns
READY_START: Final = "0-0"
_ANNOUNCE_ATTEMPTS: Final = 4


class FollowupEntry(msgspec.Struct, frozen=True, kw_only=True):
    entry_id: str
    text: str
    pairs: tuple[Pair, ...]


__all__ = [
    "READ_COUNT", "READY_MAXLEN", "READY_START", "FollowupEntry", "Followups", "Pair", "ReadyRead",
    "StreamRead", "stream_id_ms",
]

_PAIRS = msgspec.json.Decoder(tuple[Pair, ...])
_PAIRS_ENCODER: Final = msgspec.json.Encoder()

# lua/followup_count.lua (recount) goes before every script that writes a followup stream.
_ADD: Final = LuaScript("followup_count", "followup_add")
_ANNOUNCE: Final = LuaScript("announce")
_ANNOUNCE_STALE: Final = LuaScript("announce_stale")
_DONE: Final = LuaScript("followup_count", "followup_done")
_READ: Final = LuaScript("followup_read")
_XLEN: Final = LuaScript("followup_length")
_DROP: Final = LuaScript("followup_count", "followup_drop")
_RECOUNT: Final = LuaScript("followup_count", "followup_recount")


def _entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> FollowupEntry:
    return FollowupEntry(
        entry_id=_text(entry_id),
        text=fields[b"text"].decode(),
        pairs=_PAIRS.decode(fields[b"pairs"]),
    )


def _fields(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A stream entry's fields from a script's flat ``field, value, ...`` list."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _encode_pairs(pairs: Sequence[Pair]) -> bytes:
    """``[{"scheduleId":…,"occurrenceAt":…},…]``, compact, as ``_PAIRS`` decodes it."""
    return _PAIRS_ENCODER.encode(list(pairs))


def stream_id_ms(entry_id: str) -> int:
    """The server's epoch millisecond at which a stream entry was added (its id's first
    part)."""
    return int(entry_id.partition("-")[0])


class StreamRead(msgspec.Struct, frozen=True):
    """One read of an agent's followup stream: its entries, and whether it took every
    entry the stream held for this consumer at the time (``drained``)."""

    entries: list[FollowupEntry]
    drained: bool


class ReadyRead(msgspec.Struct, frozen=True):
    """What one read of a ready stream found: the cursor to read on from, and the agents
    announced after the old cursor (first announcement order, each once)."""

    cursor: str
    agents: tuple[str, ...]


class Followups:
    def __init__(
        self, client: redis.Redis, keys: Keys, *, ready_maxlen: int = READY_MAXLEN,
        default_queue: str = "",
    ) -> None:
        self._client = client
        self._keys = keys
        # Where an agent whose lease-queue entry is missing is announced: where its wakes
        # are routed (``Leases`` falls back to the same queue); '' announces it nowhere.
        self._default_queue = default_queue
        self._ready_maxlen = ready_maxlen

    def add(self, items: Sequence[tuple[str, str, Sequence[Pair]]]) -> list[str]:
        """Write many ``(agent, text, pairs)`` entries in one round trip (one script call),
        unannounced: the caller, which holds the agents, announces them with
        ``announce`` once it lets them go. The entry ids, in order."""
        written = _ADD.run_items(self._client, [
            (self._counted(agent), [text.encode(), _encode_pairs(pairs), STREAM_GROUP, agent])
            for agent, text, pairs in items
        ])
        return [_text(entry_id) for entry_id in written]

    def announce(self, agents: Sequence[str]) -> None:
        """Announce each agent on the ready stream of the queue its lease names (a lease
        whose queue entry was lost: the default queue, where its wakes go too; no lease:
        no announcement): one round trip looks up the queues, one more announces them all
        (one script call). An agent whose lease moved in between, or whose queue entry is
        missing, is announced again where the script says."""
        pending = list(dict.fromkeys(agents))
        if not pending:
            return
        found: list[Any] = self._client.hmget(self._keys.lease_queue(), pending)
        queues = {agent: _text(q) if isinstance(q, bytes | str) else ""
                  for agent, q in zip(pending, found, strict=True)}
        for _attempt in range(_ANNOUNCE_ATTEMPTS):
            replies = _ANNOUNCE.run_items(self._client, [
                ([self._keys.lease_queue(), self._keys.ready(queues[agent]),
                  self._keys.agent_host()],
                 [agent, queues[agent], self._ready_maxlen, self._default_queue])
                for agent in pending
            ])
            moved = []
            for agent, reply in zip(pending, replies, strict=True):
                if not reply[0]:
                    queues[agent] = _text(reply[1])  # the lease moved: announce there
                    moved.append(agent)
            if not moved:
                return
            pending = moved
        raise redis.RedisError(f"the lease of {', '.join(pending)} kept moving while "
                               "announcing a followup")

    def entries(self, agents: Sequence[str]) -> list[list[FollowupEntry]]:
        """Every entry still in each agent's stream, delivered to a consumer or not, in one
        pipelined round trip."""
        with self._client.pipeline(transaction=False) as pipe:
            for agent in agents:
                pipe.xrange(self._keys.followups(agent))
            replies: list[Any] = pipe.execute()
        return [[_entry(entry_id, fields) for entry_id, fields in raw] for raw in replies]

    def ensure_group(self, agent: str) -> None:
        """Create the stream's consumer group from its first entry (idempotent)."""
        try:
            self._client.xgroup_create(
                self._keys.followups(agent), STREAM_GROUP, id="0", mkstream=True
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, agent: str, consumer: str, *, count: int = READ_COUNT) -> list[FollowupEntry]:
        """Entries for this consumer: its own unacknowledged ones first, else new ones.

        The consumer group is created here when Redis has none (a first entry, or a
        flushed Redis); created from the stream's start, it skips no entry. An agent
        with no stream has nothing to read, and is left without one: an idle live agent
        holds no empty stream.
        """
        return self.read_streams([agent], consumer, count=count)[agent].entries

    def read_streams(
        self, agents: Sequence[str], consumer: str, *, count: int = READ_COUNT
    ) -> dict[str, StreamRead]:
        """``read`` (without blocking) for many agents, in one script call: for each, this
        consumer's unacknowledged entries, else its new ones, and whether the read took
        every entry its stream held for this consumer then (``drained``; never said of a
        stream that had no consumer group yet). A stream without a consumer group yet
        gets one, as ``read`` says, and is read again."""
        pending = list(dict.fromkeys(agents))
        found, ungrouped = self._read_script(pending, consumer, count)
        streams = [agent for agent in ungrouped
                   if self._client.exists(self._keys.followups(agent))]
        for agent in streams:
            self.ensure_group(agent)
        for agent, read in self._read_script(streams, consumer, count)[0].items():
            found[agent] = StreamRead(read.entries, drained=False)
        return {agent: found.get(agent, StreamRead([], drained=False)) for agent in pending}

    def _read_script(
        self, agents: Sequence[str], consumer: str, count: int
    ) -> tuple[dict[str, StreamRead], list[str]]:
        """One script call per hundred agents: what each agent's read found, and the
        agents whose stream or its consumer group is missing."""
        found: dict[str, StreamRead] = {}
        ungrouped: list[str] = []
        replies = _READ.run_items(self._client, [
            ([self._keys.followups(agent)], [STREAM_GROUP, consumer, count])
            for agent in agents
        ])
        for agent, (ok, value, drained) in zip(agents, replies, strict=True):
            if not ok:
                error = _text(value)
                # Redis says NOGROUP; the embedded server says the key must exist.
                if "NOGROUP" not in error and "key to exist" not in error:
                    raise redis.ResponseError(error)
                ungrouped.append(agent)
                continue
            found[agent] = StreamRead(
                [_entry(entry_id, _fields(flat)) for entry_id, flat in value if flat],
                drained=bool(drained))
        return found, ungrouped

    def done(self, entries: Sequence[tuple[str, str]]) -> None:
        """Acknowledge and delete entries, ``(agent, entry id)`` each, whether delivered or
        dropped, in one round trip."""
        if not entries:
            return
        _DONE.run_items(self._client, [(self._counted(agent),
                                                 [STREAM_GROUP, entry_id, agent])
                                                for agent, entry_id in entries])

    def claim_stale(self, agent: str, consumer: str, *, min_idle_ms: int) -> list[FollowupEntry]:
        """Take over entries another consumer read but never acknowledged (a crashed host)."""
        try:
            result: Any = self._client.xautoclaim(
                self._keys.followups(agent), STREAM_GROUP, consumer, min_idle_ms, "0-0"
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return []
        items = result[1] if len(result) > 1 else []
        return [_entry(i, f) for i, f in items if f]

    def drop(self, agents: Sequence[str]) -> None:
        """Delete the followup streams of many agents, in one round trip."""
        _DROP.run_items(self._client, [(self._counted(agent), [agent]) for agent in agents])

    def waiting(self, agent: str) -> int:
        """How many entries the stream holds (delivered to a consumer or not)."""
        return int(self._client.xlen(self._keys.followups(agent)))

    def waiting_many(self, agents: Sequence[str]) -> list[int]:
        """``waiting`` for many agents, in one round trip."""
        replies = _XLEN.run_items(self._client,
                                  [([self._keys.followups(agent)], []) for agent in agents])
        return [int(n) for n in replies]

    # -- the counter ----------------------------------------------------------------

    def pending_total(self) -> int:
        """How many entries the followup streams hold together, every agent's: one read
        of the counter the followup scripts keep (``Keys.followup_total``)."""
        raw: Any = self._client.get(self._keys.followup_total())
        return max(int(raw), 0) if raw is not None else 0

    def recount(self, agents: Sequence[str]) -> None:
        """Count the agents' streams again (a count lost, or streams an older version
        wrote): a script call per hundred agents, in one round trip."""
        _RECOUNT.run_items(self._client, [(self._counted(agent), [agent]) for agent in agents])

    def _counted(self, agent: str) -> list[str]:
        """The keys of a script that writes the agent's stream and keeps the counter."""
        return [self._keys.followups(agent), self._keys.followup_counts(),
                self._keys.followup_total()]

    # -- staleness --------------------------------------------------------------------

    def announce_stale(
        self, agents_by_queue: Mapping[str, Sequence[str]], *, older_than_ms: int
    ) -> list[str]:
        """Announce again, on its queue's ready stream, each agent whose oldest entry was
        added at least ``older_than_ms`` ago by the server's clock: a followup a live host
        would long have taken, so its announcement (or its reader) was lost. One script
        call; returns the agents announced."""
        calls = [(queue, agent) for queue, agents in agents_by_queue.items() for agent in agents]
        if not calls:
            return []
        keys = [k for queue, agent in calls
                for k in (self._keys.followups(agent), self._keys.ready(queue))]
        positions: list[Any] = _ANNOUNCE_STALE.run(
            self._client, keys,
            [older_than_ms, self._ready_maxlen, *(agent for _queue, agent in calls)],
        )
        return [calls[int(i) - 1][1] for i in positions]

    # -- the ready stream ------------------------------------------------------------

    def ready_cursor(self, queue: str) -> str:
        """The id of the newest announcement on the queue's ready stream (``READY_START``
        when it holds none): a reader starting here sees every later announcement."""
        newest: Any = self._client.xrevrange(self._keys.ready(queue), count=1)
        return _text(newest[0][0]) if newest else READY_START

    def read_ready(
        self, queue: str, cursor: str, *, block_ms: int | None, count: int = 1_000
    ) -> ReadyRead:
        """The agents announced on the queue's ready stream after ``cursor``, at most
        ``count`` announcements, in one call that waits up to ``block_ms`` for the first
        (None: returns at once). Nothing is consumed: every reader of the queue sees every
        announcement, and the stream is trimmed by length, not by readers."""
        response: Any = self._client.xread(
            {self._keys.ready(queue): cursor}, count=count,
            block=block_ms if block_ms else None,
        )
        agents: dict[str, None] = {}
        for _stream, items in response or []:
            for entry_id, fields in items:
                cursor = _text(entry_id)
                agent = fields.get(b"agent")
                if agent is not None:
                    agents[_text(agent)] = None
        return ReadyRead(cursor, tuple(agents))
