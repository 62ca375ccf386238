"""The quickstarts of docs/integrations/README.md run as written, on the embedded runtime,
with the examples' scripted models standing in for a real one; and the host test it shows
passes with the ``schedule_runtime`` fixture."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic_ai.models.function import FunctionModel

from dsh_schedule.runtime import EmbeddedRuntime

ROOT = Path(__file__).resolve().parents[2]
INTEGRATIONS = ROOT / "docs" / "integrations"
README = (INTEGRATIONS / "README.md").read_text(encoding="utf-8")


def code_under(heading: str) -> str:
    """The first ``python`` block after ``heading`` in the README."""
    section = README[README.index(f"\n{heading}\n"):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, heading
    return found.group(1)


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, INTEGRATIONS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


def run_main(code: str, model: Any) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(code, "quickstart", "exec"), namespace)  # noqa: S102 - the README's code
    asyncio.run(asyncio.wait_for(namespace["main"](model), 60))


def test_the_langgraph_quickstart_answers_the_reminder(capsys: pytest.CaptureFixture[str]) -> None:
    model = example("langgraph_example").ScriptedChatModel()
    run_main(code_under("### LangGraph quickstart"), model)
    assert capsys.readouterr().out == "Reminder: time to stretch!\n"


def test_the_pydantic_ai_quickstart_answers_the_reminder(
        capsys: pytest.CaptureFixture[str]) -> None:
    model = FunctionModel(example("pydantic_ai_example").scripted_model)
    run_main(code_under("### Pydantic AI quickstart"), model)
    assert capsys.readouterr().out == "Reminder: time to stretch!\n"


@pytest.mark.parametrize("recipe", ["openai_agents_recipe", "anthropic_recipe"])
def test_the_recipes_quickstart_runs_the_recipe(recipe: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = code_under("### OpenAI Agents SDK and Anthropic SDK quickstart")
    body = "from dsh_schedule import embedded_runtime\n\nasync def main(converse):\n" + \
        textwrap.indent(code, "    ")
    run_main(body, example(recipe).converse)
    assert "model answered: Reminder: time to stretch!" in capsys.readouterr().out


def test_the_host_test_it_shows_passes(schedule_runtime: EmbeddedRuntime) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(code_under("## Testing a host"), "host test", "exec"), namespace)  # noqa: S102
    namespace["test_the_agent_is_reminded"](schedule_runtime)


def test_the_closed_thread_quickstart_reopens_the_thread_and_answers_the_reminder(
        capsys: pytest.CaptureFixture[str]) -> None:
    model = example("langgraph_example").ScriptedChatModel()
    run_main(code_under("### Reminders in closed threads"), model)
    assert capsys.readouterr().out == "Reminder: time to stretch!\n"


def test_the_closed_session_host_test_it_shows_passes(tmp_path: Path) -> None:
    from dsh_schedule.runtime import ManualClock, embedded_runtime
    from dsh_schedule.shared.settings import Settings

    namespace: dict[str, Any] = {}
    section = README[README.index("A reminder in a session no host has loaded"):]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None
    exec(compile(found.group(1), "host test", "exec"), namespace)  # noqa: S102
    with embedded_runtime(tmp_path / "sessions", settings=Settings(wake_unloaded=True),
                          clock=ManualClock()) as runtime:
        namespace["test_a_closed_session_is_reminded"](runtime)
