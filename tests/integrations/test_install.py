"""``pip install '.[langgraph]'`` and ``pip install '.[pydantic-ai]'`` each work on their
own in a fresh virtual environment (with the lock file as constraints, as dev.py, CI and
the image install): the adapter imports and builds its tools, the other adapter's
framework is not pulled in."""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tests.integration.test_install import NOT_SOURCE, clean_env

ROOT = Path(__file__).resolve().parents[2]

USE = """
import sys
from dsh_schedule.integrations.{module} import schedule_tools
from dsh_schedule.host.aio import AsyncScheduleTools
tools = schedule_tools(AsyncScheduleTools(None){extra})
print(",".join(t.name for t in tools))
try:
    import {other}
except ImportError:
    print("{other}: not installed")
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("extra", "module", "other", "thread"), [
    ("langgraph", "langgraph", "pydantic_ai", ', "t1"'),
    ("pydantic-ai", "pydantic_ai", "langchain_core", ""),
])
def test_an_extra_installs_its_adapter_alone(tmp_path: Path, extra: str, module: str,
                                             other: str, thread: str) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    constraints = ["--constraint", str(ROOT / "requirements.lock")] \
        if (ROOT / "requirements.lock").exists() else []
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
         *constraints, f"{source}[{extra}]"],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=540,
    )
    assert install.returncode == 0, install.stderr[-4000:]

    used = subprocess.run(
        [str(python), "-c", USE.format(module=module, other=other, extra=thread)],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=120,
    )
    assert used.returncode == 0, used.stderr[-4000:]
    assert used.stdout.splitlines() == [
        "schedule_create,schedule_list,schedule_delete", f"{other}: not installed"]
