"""A regular (not editable) install into a fresh virtual environment
(docs/architecture.md#layout).

The layers ``shared``, ``worker`` and ``scheduler`` (real folders in ``dsh_schedule/``,
linked from the top level) arrive inside the package: the distribution installs exactly
one top-level name, ``dsh_schedule``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "dsh-tool-schedule"
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache",
    ".ruff_cache", ".pytest_cache", ".hypothesis", ".import_linter_cache", "bench-results",
)

INSPECT = """
import importlib.metadata, json
dist = importlib.metadata.distribution({name!r})
print(json.dumps({{
    "top_level": (dist.read_text("top_level.txt") or "").split(),
    "files": [str(f) for f in dist.files or ()],
}}))
"""


def clean_env() -> dict[str, str]:
    """The environment without anything that points Python at this checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
            and not k.startswith("DSH_SCHEDULE_")}


def top_level_names(files: list[str]) -> set[str]:
    """The importable top-level names a wheel's RECORD installs into site-packages."""
    names = set()
    for file in files:
        first = Path(file).parts[0]
        if first in ("..", "__pycache__") or first.endswith((".dist-info", ".data")):
            continue  # scripts, byte code and the distribution's own metadata
        names.add(first.removesuffix(".py"))
    return names


@pytest.mark.slow
def test_a_regular_install_has_one_top_level_name_and_a_working_command(
        tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=NOT_SOURCE)
    assert (source / "shared").is_symlink()
    assert not (source / "dsh_schedule" / "shared").is_symlink()
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
         str(source)],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=240,
    )
    assert install.returncode == 0, install.stderr[-4000:]

    inspected = subprocess.run(
        [str(python), "-c", INSPECT.format(name=DISTRIBUTION)],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=60, check=True,
    )
    installed = json.loads(inspected.stdout)
    assert set(installed["top_level"]) == {"dsh_schedule"}
    assert top_level_names(installed["files"]) == {"dsh_schedule"}
    assert {"dsh_schedule/shared/core/fold.py", "dsh_schedule/worker/process.py",
            "dsh_schedule/scheduler/process.py", "dsh_schedule/py.typed"} <= set(installed["files"])

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    command = subprocess.run(
        [str(env_dir / "bin" / "dsh-schedule"), "--version"],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=60,
    )
    assert (command.returncode, command.stdout, command.stderr) == (
        0, f"dsh-schedule {version}\n", "")


def test_the_license_is_an_spdx_expression_with_its_text_beside_it() -> None:
    """pyproject.toml names the license as an SPDX expression (the table form stops
    building in 2027) and ships the LICENSE file, which holds that license's text."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n\nCopyright (c) ")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
    # Setuptools reads license-files and an SPDX license from 77.0.3 on (PEP 639).
    assert pyproject["build-system"]["requires"] == ["setuptools>=77.0.3"]
    # .ci/run builds and checks the distributions with these.
    assert {"build", "twine"} <= {
        req.split(">")[0].split("=")[0] for req in project["optional-dependencies"]["test"]}
