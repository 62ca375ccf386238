"""The Lua scripts (docs/decisions.md#delivery, "Scripts in pipelines"), run one way.

Every script is a file of ``lua/`` whose header comment names its KEYS and ARGV, and
every script runs as an ``EVAL`` of its source (``LuaScript``): on a client, queued on a
pipeline, or once per item of a batch. redis-py's registered scripts ask Redis whether the
script is loaded (``SCRIPT EXISTS``) before every pipeline that holds one, a round trip
more each time, and an ``EVALSHA`` fails on a Redis that lost its scripts (a flush, a
restart). Redis keeps an ``EVAL``'s compiled form by its digest, so a repeated ``EVAL``
costs only the bytes of the source, and it cannot fail that way.

A batch of many agents is one command, not one per agent (docs/decisions.md#delivery, "A
batch is one command"): ``LuaScript.run_items`` runs a script written for one item once
for every item of the batch, in one ``EVAL``, since redis-py spends tens of microseconds of
Python on every command it packs and parses.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any, Final

import redis
from redis.client import Pipeline
from redis.typing import EncodableT, KeyT

_LUA: Final = resources.files("dsh_schedule.shared.coordination") / "lua"

Item = tuple[Sequence[KeyT], Sequence[EncodableT]]


@functools.cache
def lua(name: str) -> str:
    """The script of ``lua/<name>.lua``, read once: its body, without the header comment
    that names its KEYS and ARGV (only the body is sent to Redis)."""
    lines = (_LUA / f"{name}.lua").read_text(encoding="utf-8").splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("--"):
        start += 1
    return "".join(lines[start:])


_BATCH_ITEM: Final = "  -- (the item's script)\n"

# The most items one batched call runs. Redis runs a script to its end before it serves
# anyone else; measured here, a thousand phase claims took it 8.7 ms in one call, and a
# thousand first followups (stream and group created) 25 ms, so a call holds at most a
# hundred and a larger batch is several calls in the same round trip.
SCRIPT_BATCH_MAX: Final = 100


class LuaScript:
    """The script of the files ``lua/<name>.lua`` of ``names``, their bodies joined in
    order (a file of helper functions first, e.g. ``followup_count``), sent as ``EVAL``.

    ``run``/``queue``: one call, its keys in ``KEYS`` and arguments in ``ARGV``.
    ``run_items``/``queue_items``: a script written for one item, run for each
    ``(keys, args)`` of a batch (``lua/batch.lua``), at most ``SCRIPT_BATCH_MAX`` items to
    a call so no single call holds Redis for long, each call atomic."""

    def __init__(self, *names: str) -> None:
        self.names = names
        self.source = "".join(lua(name) for name in names)

    def run(self, client: redis.Redis, keys: Sequence[KeyT],
            args: Sequence[EncodableT] = ()) -> Any:
        """The script's reply (one round trip)."""
        return client.eval(self.source, len(keys), *keys, *args)

    def queue(self, pipe: Pipeline, keys: Sequence[KeyT],
              args: Sequence[EncodableT] = ()) -> None:
        """Queue the script on ``pipe``; its reply comes in order."""
        pipe.eval(self.source, len(keys), *keys, *args)

    @functools.cached_property
    def _per_item(self) -> str:
        return lua("batch").replace(_BATCH_ITEM, self.source + "\n")

    def queue_items(self, pipe: Pipeline, items: Sequence[Item]) -> int:
        """Queue the calls that run the script for each item (each item the same number
        of keys and of arguments). Returns how many calls were queued: their replies, in
        order on ``pipe``, are lists of the items' replies (``item_replies`` joins them)."""
        calls = 0
        for start in range(0, len(items), SCRIPT_BATCH_MAX):
            self._queue_call(pipe, items[start:start + SCRIPT_BATCH_MAX])
            calls += 1
        return calls

    def run_items(self, client: redis.Redis, items: Sequence[Item]) -> list[Any]:
        """``queue_items`` on a pipeline of its own: one round trip; the items' replies
        (an empty batch sends nothing)."""
        if not items:
            return []
        with client.pipeline(transaction=False) as pipe:
            calls = self.queue_items(pipe, items)
            return item_replies(iter(pipe.execute()), calls)

    def _queue_call(self, pipe: Pipeline, items: Sequence[Item]) -> None:
        nk, na = len(items[0][0]), len(items[0][1])
        keys: list[KeyT] = []
        args: list[EncodableT] = [nk, na, len(items)]
        for item_keys, item_args in items:
            if len(item_keys) != nk or len(item_args) != na:
                raise ValueError("every item of a batch takes as many keys and arguments")
            keys.extend(item_keys)
            args.extend(item_args)
        pipe.eval(self._per_item, len(keys), *keys, *args)


def item_replies(replies: Iterator[Any], calls: int) -> list[Any]:
    """The items' replies of the next ``calls`` replies of a pipeline (the calls one
    ``LuaScript.queue_items`` queued), joined in order."""
    return [reply for _ in range(calls) for reply in next(replies)]
