"""The per-agent followup stream (docs/architecture.md#hosts-followups-and-rebuild).

An entry holds the exact framing text and the ``(scheduleId, occurrenceAt)`` pairs it
covers. The stream is a projection: the host delivers an entry only after checking the
log, and lost entries are re-projected from the log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec
import redis

from dsh_schedule.shared.coordination.keys import STREAM_GROUP, Keys
from dsh_schedule.shared.core.ledger import Pair


class FollowupEntry(msgspec.Struct, frozen=True, kw_only=True):
    entry_id: str
    text: str
    pairs: tuple[Pair, ...]


__all__ = ["FollowupEntry", "Followups", "Pair"]

_PAIRS = msgspec.json.Decoder(tuple[Pair, ...])


def _entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> FollowupEntry:
    return FollowupEntry(
        entry_id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        text=fields[b"text"].decode(),
        pairs=_PAIRS.decode(fields[b"pairs"]),
    )


class Followups:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    def add(self, agent: str, text: str, pairs: Sequence[Pair]) -> str:
        encoded = json.dumps([msgspec.to_builtins(p) for p in pairs], separators=(",", ":"))
        entry_id = self._client.xadd(
            self._keys.followups(agent), {"text": text.encode(), "pairs": encoded.encode()}
        )
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def entries(self, agent: str) -> list[FollowupEntry]:
        """Every entry still in the stream, delivered to a consumer or not."""
        raw: Any = self._client.xrange(self._keys.followups(agent))
        return [_entry(entry_id, fields) for entry_id, fields in raw]

    def ensure_group(self, agent: str) -> None:
        """Create the stream's consumer group from its first entry (idempotent)."""
        try:
            self._client.xgroup_create(
                self._keys.followups(agent), STREAM_GROUP, id="0", mkstream=True
            )
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(
        self, agent: str, consumer: str, *, count: int = 16, block_ms: int | None = None
    ) -> list[FollowupEntry]:
        """Entries for this consumer: its own unacknowledged ones first, then new ones.

        The consumer group is created here when Redis has none (a first entry, or a
        flushed Redis); created from the stream's start, it skips no entry.
        """
        try:
            return self._read(agent, consumer, count=count, block_ms=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        self.ensure_group(agent)
        return self._read(agent, consumer, count=count, block_ms=block_ms)

    def _read(
        self, agent: str, consumer: str, *, count: int, block_ms: int | None
    ) -> list[FollowupEntry]:
        key = self._keys.followups(agent)
        found: list[FollowupEntry] = []
        for start in ("0", ">"):
            response: Any = self._client.xreadgroup(
                STREAM_GROUP, consumer, {key: start}, count=count,
                block=block_ms if start == ">" else None,
            )
            for _stream, items in response or []:
                found.extend(_entry(i, f) for i, f in items if f)
            if found:
                break
        return found

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

    def done(self, agent: str, entry_id: str) -> None:
        """Acknowledge and delete an entry, whether it was delivered or dropped."""
        key = self._keys.followups(agent)
        with self._client.pipeline() as pipe:
            pipe.xack(key, STREAM_GROUP, entry_id)
            pipe.xdel(key, entry_id)
            pipe.execute()

    def drop(self, agent: str) -> None:
        self._client.delete(self._keys.followups(agent))

    def waiting(self, agent: str) -> int:
        """How many entries the stream holds (delivered to a consumer or not)."""
        return int(self._client.xlen(self._keys.followups(agent)))
