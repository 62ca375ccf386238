"""Agent phase: who owns the agent right now, a turn or maintenance
(docs/architecture.md#hosts-followups-and-rebuild).

One key per agent holds ``<kind>:<token>`` with a TTL. Claims and releases are Lua scripts
so that a claim and the registration of an idle waiter are one atomic step.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Final

import redis
from redis.typing import EncodableT

from dsh_schedule.shared.coordination.keys import Keys
from dsh_schedule.shared.coordination.scripts import LuaScript

_CLAIM: Final = LuaScript("phase_claim")
_RELEASE: Final = LuaScript("phase_release")
_RENEW: Final = LuaScript("phase_renew")


class Release(Enum):
    NOT_OWNER = 0
    RELEASED = 1
    WAITER_WOKEN = 2


class AgentPhase:
    """Claims and releases of the per-agent phase key."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self._client = client
        self._keys = keys

    def _args(self, agent: str) -> list[str]:
        return [self._keys.phase(agent), self._keys.idle_waiter(agent)]

    def claim_turn(self, agent: str, token: str, ttl_s: float) -> bool:
        """Claim the phase for a turn; False while maintenance or another turn holds it."""
        return self.claim([agent], "turn", token, ttl_s)[0]

    def claim(
        self, agents: Sequence[str], kind: str, token: str, ttl_s: float
    ) -> list[bool]:
        """Claim the phase for maintenance (kind ``maintenance``: a held phase registers
        an idle waiter) or a turn (kind ``turn``, ``claim_turn``) for many agents under
        one token, in one round trip: one script call claims them all, each claim as the
        single-agent script makes it. Whether each was claimed."""
        if kind not in ("maintenance", "turn"):
            raise ValueError(f"unknown phase kind {kind!r}")
        waiter = "1" if kind == "maintenance" else "0"
        args: list[EncodableT] = [f"{kind}:{token}", int(ttl_s * 1000), waiter]
        replies = _CLAIM.run_items(self._client, [(self._args(agent), args) for agent in agents])
        return [bool(r) for r in replies]

    def release(self, agents: Sequence[str], kind: str, token: str) -> list[Release]:
        """Release the phases of many agents held under one token, in one round trip: a
        phase another owner holds is left alone (``NOT_OWNER``)."""
        args = [f"{kind}:{token}"]
        replies = _RELEASE.run_items(self._client, [(self._args(agent), args) for agent in agents])
        return [Release(int(r)) for r in replies]

    def renew(self, agents: Sequence[str], kind: str, token: str, ttl_s: float) -> list[bool]:
        """Extend the TTL of the phases of many agents held under one token, in one round
        trip; False for a phase this owner no longer holds."""
        args: list[EncodableT] = [f"{kind}:{token}", int(ttl_s * 1000)]
        replies = _RENEW.run_items(self._client,
                                   [([self._keys.phase(agent)], args) for agent in agents])
        return [bool(r) for r in replies]

    def forget(self, agents: Sequence[str]) -> None:
        """Drop the phase keys of many agents, in one round trip."""
        if agents:
            self._client.delete(*(key for agent in agents for key in self._args(agent)))
