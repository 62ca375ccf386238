"""Lua scripts queued on pipelines (docs/decisions.md#delivery, "Scripts in pipelines").

redis-py's own way to run a registered script on a pipeline asks Redis whether the script
is loaded (``SCRIPT EXISTS``) before every pipeline that holds one: a round trip more each
time. ``queue_script`` queues an ``EVAL`` of the script's source instead. Redis keeps the
compiled form by its digest, so a repeated ``EVAL`` costs only the bytes of the source,
and it cannot fail because Redis lost its scripts (a flush, a restart).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.client import Pipeline
from redis.commands.core import Script
from redis.typing import EncodableT, KeyT


def queue_script(
    pipe: Pipeline, script: Script, keys: Sequence[KeyT], args: Sequence[EncodableT]
) -> None:
    """Queue ``script`` on ``pipe`` with ``keys`` and ``args``; its reply comes in order."""
    source = script.script
    text = source if isinstance(source, str) else bytes(source).decode()
    pipe.eval(text, len(keys), *keys, *args)
