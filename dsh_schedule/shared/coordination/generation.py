"""The generation marker (docs/architecture.md#the-generation-marker): how a process learns
that Redis lost its data, at once and with one command.

One STRING (``Keys.generation``) holds a random token, written by the first process that
finds it missing. Every process remembers the token it last saw and checks it, about
once a second: a missing marker (a flush, a restart without persistence) or a different
one (another process found it missing first) means Redis lost data since, and the
process restores what it owns at once (a host installs every agent it serves again,
which wakes them) instead of waiting for a lease renewal.
"""

from __future__ import annotations

import uuid
from typing import Final

import redis

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript

_READ_OR_WRITE: Final = LuaScript("generation")


class GenerationMarker:
    """One process's view of the marker; not thread-safe (one loop checks it)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._key = keys.generation()
        self._seen: bytes | None = None

    def lost_data(self) -> bool:
        """Check the marker (one round trip): True when Redis lost data since the last
        check. The first check of a process only learns the token (the process is
        starting, and restores everything anyway)."""
        token = bytes(_READ_OR_WRITE.run(self._client, [self._key], [uuid.uuid4().hex]))
        seen, self._seen = self._seen, token
        return seen is not None and seen != token
