"""``dev.py``'s first commands (README.md, CONTRIBUTING.md): the usage at once, and nothing
installed for a command it does not run.

Each test runs a copy of ``dev.py`` alone in a scratch directory: there it has no
``pyproject.toml`` to install from, so a command that tried to install would fail, and a
``.venv`` appearing would show it had started to.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEV = Path(__file__).resolve().parents[2] / "dev.py"


def run_dev(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    copy = tmp_path / "dev.py"
    shutil.copy(DEV, copy)
    return subprocess.run([sys.executable, str(copy), *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_prints_the_usage_and_installs_nothing(tmp_path: Path, flag: str) -> None:
    done = run_dev(tmp_path, flag)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("Self-contained project commands")
    assert "python3 dev.py test" in done.stdout
    assert not (tmp_path / ".venv").exists()


def test_no_command_prints_the_usage_and_exits_2_installing_nothing(tmp_path: Path) -> None:
    done = run_dev(tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("Self-contained project commands")
    assert not (tmp_path / ".venv").exists()


def test_an_unknown_command_fails_before_anything_is_installed(tmp_path: Path) -> None:
    done = run_dev(tmp_path, "frobnicate", "-x")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("dev: unknown command 'frobnicate'; use demo, run, test, lint, "
                           "lock (python3 dev.py --help)\n")
    assert not (tmp_path / ".venv").exists()


def test_the_docstring_lists_every_command() -> None:
    tree = ast.parse(DEV.read_text(encoding="utf-8"))
    listed = set(re.findall(r"^ {4}python3 dev\.py (\w+)", ast.get_docstring(tree) or "",
                            re.MULTILINE))
    commands = next(
        ast.literal_eval(node.value) for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMMANDS"
    )
    assert listed == set(commands)
