"""Every script is a ``lua/`` file run one way (an ``EVAL`` of its source), and a script
written for one item runs for a whole batch in one call (docs/decisions.md#delivery, "A
batch is one command"), on the fake and the real Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from dsh_schedule.shared.coordination import scripts
from dsh_schedule.shared.coordination.scripts import LuaScript

# KEYS[1] a counter; ARGV[1] a step, ARGV[2] a floor. The counter after the step, or nil
# when it would fall below the floor.
_STEP_SOURCE = """
local value = tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1])
if value < tonumber(ARGV[2]) then
  return nil
end
redis.call('SET', KEYS[1], value)
return value
"""


def run_script_batch(client: redis.Redis, body: str, items: list[Any]) -> list[Any]:
    script = LuaScript()
    script.source = body
    return script.run_items(client, items)


_STEP = _STEP_SOURCE


def test_each_item_gets_its_own_keys_arguments_and_reply_in_order(
    redis_client: redis.Redis,
) -> None:
    redis_client.set("b", 5)
    replies = run_script_batch(redis_client, _STEP, [
        (["a"], [2, 0]), (["b"], [-10, 0]), (["b"], [1, 0]), (["a"], [3, 0]),
    ])
    assert replies == [2, None, 6, 5]  # the refused step wrote nothing; items run in order
    assert redis_client.mget(["a", "b"]) == [b"5", b"6"]


def test_an_empty_batch_sends_nothing(redis_client: redis.Redis) -> None:
    assert run_script_batch(redis_client, _STEP, []) == []


def test_items_of_different_shapes_are_refused_before_anything_is_sent(
    redis_client: redis.Redis,
) -> None:
    with pytest.raises(ValueError, match="as many keys and arguments"):
        run_script_batch(redis_client, _STEP, [(["a"], [1, 0]), (["b", "c"], [1, 0])])
    assert redis_client.exists("a") == 0


def test_a_batch_larger_than_one_call_takes_is_split_and_answered_in_order(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scripts, "SCRIPT_BATCH_MAX", 3)
    items = [([f"k{i % 4}"], [1, 0]) for i in range(10)]
    assert run_script_batch(redis_client, _STEP, items) == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]


def test_every_script_file_names_its_keys_and_arguments_and_only_its_body_is_sent() -> None:
    for path in sorted(scripts.resources.files("dsh_schedule.shared.coordination")
                       .joinpath("lua").iterdir()):
        name = path.name.removesuffix(".lua")
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        header = lines[:next(i for i, line in enumerate(lines) if not line.startswith("--"))]
        body = scripts.lua(name)
        # the header comment comes first, and names every KEYS and ARGV the body reads
        assert text.startswith("--"), name
        for word in ("KEYS", "ARGV"):
            if word in body:
                assert any(word in line for line in header), (name, word)
        # what Redis receives is the script without its header
        assert not body.lstrip().startswith("--"), name
        assert text.endswith(body), name


_PACKAGE = Path(scripts.__file__).resolve().parents[2]  # the package's layer folders


def test_no_lua_lives_in_a_python_string_of_the_package() -> None:
    """Every script is a ``lua/`` file with its KEYS/ARGV header (above), none a string."""
    layers = [_PACKAGE / name for name in ("shared", "worker", "scheduler", "dsh_schedule")]
    found = [str(path.relative_to(_PACKAGE)) for layer in layers
             for path in sorted(layer.rglob("*.py"))
             if "redis.call(" in path.read_text(encoding="utf-8")]
    assert found == []


def test_scripts_are_never_registered_so_a_flush_cannot_fail_them() -> None:
    """One way to run a script: ``LuaScript``'s ``EVAL`` (no ``EVALSHA``, no ``SCRIPT LOAD``)."""
    layers = [_PACKAGE / name for name in ("shared", "worker", "scheduler", "dsh_schedule")]
    found = [str(path.relative_to(_PACKAGE)) for layer in layers
             for path in sorted(layer.rglob("*.py"))
             if path.name != "scripts.py"
             and any(word in path.read_text(encoding="utf-8")
                     for word in ("register_script", ".eval(", "evalsha"))]
    assert found == []


def test_a_script_runs_after_redis_lost_every_script(redis_client: redis.Redis) -> None:
    """A ``SCRIPT FLUSH`` (or a restart) between two calls, on a client and on a pipeline."""
    script = LuaScript("generation")
    assert script.run(redis_client, ["marker"], ["first"]) == b"first"
    redis_client.script_flush()
    assert script.run(redis_client, ["marker"], ["second"]) == b"first"
    redis_client.script_flush()
    with redis_client.pipeline(transaction=False) as pipe:
        script.queue(pipe, ["marker"], ["third"])
        LuaScript("phase_claim").queue_items(pipe, [(["p", "w"], ["turn:t", 1000, "0"])])
        assert pipe.execute() == [b"first", [1]]
