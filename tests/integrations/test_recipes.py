"""What the recipes of docs/integrations/ rely on, checked against the installed SDKs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import httpx2
from agents import FunctionTool

from dsh_schedule.shared.core.catalog import anthropic_tools, tool_definitions

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "integrations"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def nothing(_context: object, _arguments: str) -> str:
    return ""


def offering(*, lifecycle: bool) -> SimpleNamespace:
    """What the recipe reads of a plugin to build its tools: which variant it offers."""
    return SimpleNamespace(tools=SimpleNamespace(calendar=False, lifecycle=lifecycle))


def test_strict_mode_would_require_every_selector_so_the_recipe_turns_it_off() -> None:
    # given the create schema: prompt plus exactly one selector
    create = tool_definitions()[0]
    assert create.input_schema["required"] == ["prompt"]

    # when the SDK builds a strict function tool from it, every property is required
    strict = FunctionTool(name=create.name, description="", params_json_schema=create.input_schema,
                          on_invoke_tool=nothing, strict_json_schema=True)
    assert strict.params_json_schema["required"] == [
        "prompt", "after_seconds", "at", "every_seconds"]

    # then the recipe's tools keep strict mode off and the catalog's schemas as they are
    recipe = load("openai_agents_recipe")
    tools = recipe.schedule_function_tools(offering(lifecycle=False))
    assert [t.strict_json_schema for t in tools] == [False, False, False]
    assert [t.params_json_schema for t in tools] == [d.input_schema for d in tool_definitions()]


def test_the_anthropic_recipe_sends_the_catalogs_tools() -> None:
    recipe = load("anthropic_recipe")
    request = httpx2.Request("POST", "http://model.invalid/v1/messages", json={
        "model": "m", "tools": anthropic_tools(),
        "messages": [{"role": "user", "content": "Remind me in 2 seconds to stretch."}]})
    reply = json.loads(recipe.scripted_model(request).content)
    assert reply["stop_reason"] == "tool_use"
    assert reply["content"][0]["input"] == {"prompt": "stretch", "after_seconds": 2}


def test_with_the_lifecycle_on_the_recipes_offer_the_fourth_tool() -> None:
    # given the catalog's variant with the lifecycle on
    definitions = tool_definitions(lifecycle=True)
    assert [d.name for d in definitions][3:] == ["schedule_update"]

    # then the OpenAI recipe's tools are those four, strict mode off
    tools = load("openai_agents_recipe").schedule_function_tools(offering(lifecycle=True))
    assert [t.name for t in tools] == [d.name for d in definitions]
    assert [t.params_json_schema for t in tools] == [d.input_schema for d in definitions]
    assert {t.strict_json_schema for t in tools} == {False}

    # and the Anthropic recipe's scripted model takes them as it takes the three
    recipe = load("anthropic_recipe")
    request = httpx2.Request("POST", "http://model.invalid/v1/messages", json={
        "model": "m", "tools": anthropic_tools(lifecycle=True),
        "messages": [{"role": "user", "content": "Remind me in 2 seconds to stretch."}]})
    assert json.loads(recipe.scripted_model(request).content)["stop_reason"] == "tool_use"
