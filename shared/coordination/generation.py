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

import redis

from dsh_schedule.shared.coordination.keys import Keys

# KEYS[1] the marker; ARGV[1] a fresh token. Returns the marker, written first when it was
# missing.
_READ_OR_WRITE = """
local token = redis.call('GET', KEYS[1])
if token then return token end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""


class GenerationMarker:
    """One process's view of the marker; not thread-safe (one loop checks it)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._key = keys.generation()
        self._script = client.register_script(_READ_OR_WRITE)
        self._seen: bytes | None = None

    def lost_data(self) -> bool:
        """Check the marker (one round trip): True when Redis lost data since the last
        check. The first check of a process only learns the token (the process is
        starting, and restores everything anyway)."""
        token = bytes(self._script(keys=[self._key], args=[uuid.uuid4().hex]))
        seen, self._seen = self._seen, token
        return seen is not None and seen != token
