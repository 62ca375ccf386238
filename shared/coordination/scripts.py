"""Lua scripts queued on pipelines (docs/decisions.md#delivery, "Scripts in pipelines").

redis-py's own way to run a registered script on a pipeline asks Redis whether the script
is loaded (``SCRIPT EXISTS``) before every pipeline that holds one: a round trip more each
time. ``queue_script`` queues an ``EVAL`` of the script's source instead. Redis keeps the
compiled form by its digest, so a repeated ``EVAL`` costs only the bytes of the source,
and it cannot fail because Redis lost its scripts (a flush, a restart).

A batch of many agents is one command, not one per agent (docs/decisions.md#delivery, "A
batch is one command"): ``queue_script_batch`` runs a script written for one item once for
every item of the batch, in one ``EVAL``, since redis-py spends tens of microseconds of
Python on every command it packs and parses.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any, Final

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.typing import EncodableT, KeyT

_LUA: Final = resources.files("dsh_schedule.shared.coordination") / "lua"


@functools.cache
def lua(name: str) -> str:
    """The script of ``lua/<name>.lua``, read once: its body, without the header comment
    that names its KEYS and ARGV (only the body is sent to Redis)."""
    lines = (_LUA / f"{name}.lua").read_text(encoding="utf-8").splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("--"):
        start += 1
    return "".join(lines[start:])


def queue_script(
    pipe: Pipeline, script: Script, keys: Sequence[KeyT], args: Sequence[EncodableT]
) -> None:
    """Queue ``script`` on ``pipe`` with ``keys`` and ``args``; its reply comes in order."""
    source = script.script
    text = source if isinstance(source, str) else bytes(source).decode()
    pipe.eval(text, len(keys), *keys, *args)


_BATCH: Final = lua("batch")  # lua/batch.lua
_BATCH_ITEM: Final = "  -- (the item's script)\n"

_batched: dict[str, str] = {}

# The most items one batched call runs. Redis runs a script to its end before it serves
# anyone else; measured here, a thousand phase claims took it 8.7 ms in one call, and a
# thousand first followups (stream and group created) 25 ms, so a call holds at most a
# hundred and a larger batch is several calls in the same round trip.
SCRIPT_BATCH_MAX: Final = 100


def batch_source(body: str) -> str:
    """The source of the script that runs ``body`` (a script written for one item, its
    keys in ``KEYS`` and arguments in ``ARGV``) for every item of a batch."""
    source = _batched.get(body)
    if source is None:
        source = _batched[body] = _BATCH.replace(_BATCH_ITEM, body + "\n")
    return source


def queue_script_batch(
    pipe: Pipeline, body: str,
    items: Sequence[tuple[Sequence[KeyT], Sequence[EncodableT]]],
) -> int:
    """Queue the calls that run the one-item script ``body`` for each ``(keys, args)`` of
    ``items`` (each item the same number of keys and of arguments), each call atomic and
    at most ``SCRIPT_BATCH_MAX`` items long, so no single call holds Redis for long.
    Returns how many calls were queued: their replies, in order on ``pipe``, are lists of
    the items' replies (``batch_replies`` joins them)."""
    calls = 0
    for start in range(0, len(items), SCRIPT_BATCH_MAX):
        _queue_call(pipe, body, items[start:start + SCRIPT_BATCH_MAX])
        calls += 1
    return calls


def batch_replies(replies: Iterator[Any], calls: int) -> list[Any]:
    """The items' replies of the next ``calls`` replies of a pipeline (the calls one
    ``queue_script_batch`` queued), joined in order."""
    return [reply for _ in range(calls) for reply in next(replies)]


def run_script_batch(
    client: redis.Redis, body: str,
    items: Sequence[tuple[Sequence[KeyT], Sequence[EncodableT]]],
) -> list[Any]:
    """``queue_script_batch`` on a pipeline of its own: one round trip; the items' replies
    (an empty batch sends nothing)."""
    if not items:
        return []
    with client.pipeline(transaction=False) as pipe:
        calls = queue_script_batch(pipe, body, items)
        return batch_replies(iter(pipe.execute()), calls)


def _queue_call(
    pipe: Pipeline, body: str, items: Sequence[tuple[Sequence[KeyT], Sequence[EncodableT]]],
) -> None:
    nk, na = len(items[0][0]), len(items[0][1])
    keys: list[KeyT] = []
    args: list[EncodableT] = [nk, na, len(items)]
    for item_keys, item_args in items:
        if len(item_keys) != nk or len(item_args) != na:
            raise ValueError("every item of a batch takes as many keys and arguments")
        keys.extend(item_keys)
        args.extend(item_args)
    pipe.eval(batch_source(body), len(keys), *keys, *args)
