#!/usr/bin/env python3
"""Self-contained project commands for a machine that has only Python.

    python3 dev.py demo        # the main job, on embedded defaults
    python3 dev.py run ARGS…   # dsh-schedule ARGS… from .venv (e.g. run web, run --version)
    python3 dev.py test        # the whole test suite (pytest arguments may follow)
    python3 dev.py lint        # ruff, mypy --strict and lint-imports; fails if any fails
    python3 dev.py lock        # refresh requirements.lock from pyproject.toml's ranges
    python3 dev.py --help      # this text (no command at all prints it too, and exits 2)

Each command creates ``.venv`` on first use and reinstalls when pyproject.toml or
requirements.lock changes; the install takes its versions from requirements.lock. ``demo``
installs the project alone; the other commands add its test extra. A command this script
does not know, or none, installs nothing.

``test``, ``demo`` and ``run`` become the process they start, so a signal that stops
``dev.py`` (SIGTERM, Ctrl-C) reaches it directly.

The tests start their own redis-server on a free port and stop it at the end; with
DSH_SCHEDULE_TEST_REDIS=redis://HOST:PORT/DB in the environment (passed through as is)
they use that database instead, and only ever FLUSHDB it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed"
LOCK = ROOT / "requirements.lock"
TEST_REDIS_ENV = "DSH_SCHEDULE_TEST_REDIS"


def _constraints() -> list[str]:
    return ["--constraint", str(LOCK)] if LOCK.exists() else []


def _stamp(extra: str | None) -> str:
    """What an install from this checkout's inputs with ``extra`` leaves in STAMP."""
    inputs = (ROOT / "pyproject.toml").read_bytes() + (LOCK.read_bytes() if LOCK.exists() else b"")
    return f"{hashlib.sha256(inputs).hexdigest()} {extra or '-'}"


def _ensure_venv(extra: str | None) -> None:
    """A ``.venv`` holding the project (and ``extra``, when named) at the lock's versions.

    The demo needs only the project itself (a few seconds to install); the tests and the
    linters need the test extra (the frameworks, the browser driver, the linters), which
    takes a minute or two the first time. An install with the test extra serves the demo
    too, so the demo never installs less over it.
    """
    wanted = _stamp(extra)
    have = STAMP.read_text() if STAMP.exists() else ""
    if have in (wanted, _stamp("test")):
        return
    started = time.monotonic()
    if not (BIN / "python").exists():
        print("dev: creating .venv", file=sys.stderr, flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    what = "the project and its test extra" if extra else "the project (no extras)"
    print(f"dev: installing {what} into .venv …", file=sys.stderr, flush=True)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    target = f"{ROOT}[{extra}]" if extra else str(ROOT)
    # "compat" editable mode is a plain path entry, so PYTHONPATH can shadow the checkout.
    subprocess.run(
        [*pip, *_constraints(), "-e", target, "--config-settings", "editable_mode=compat"],
        check=True,
    )
    STAMP.write_text(wanted)
    print(f"dev: installed in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def _lock() -> int:
    """Resolve the project with its test extra in a scratch venv, from pyproject.toml's
    ranges alone, and pin every distribution it installed in requirements.lock."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        venv.EnvBuilder(with_pip=True).create(scratch)
        python = str(Path(scratch) / ("Scripts" if os.name == "nt" else "bin") / "python")
        subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                        f"{ROOT}[test]"], check=True)
        frozen = subprocess.run(
            [python, "-m", "pip", "freeze", "--disable-pip-version-check", "--all"],
            check=True, capture_output=True, text=True,
        ).stdout.splitlines()
    pins = sorted(
        (line for line in frozen
         if "==" in line and not line.lower().startswith(("dsh-tool-schedule==", "pip==",
                                                          "setuptools==", "wheel=="))),
        key=str.lower,
    )
    LOCK.write_text(
        "# Exact versions for reproducible installs: CI, dev.py and the image install with\n"
        "# this file as constraints. Refresh with `python3 dev.py lock`.\n" + "\n".join(pins)
        + "\n"
    )
    print(f"dev: wrote {len(pins)} pins to {LOCK.name}", file=sys.stderr)
    return 0


def _report_test_redis() -> None:
    """Say which Redis the real-Redis tests will use (tests/conftest.py decides)."""
    named = os.environ.get(TEST_REDIS_ENV)
    if named:
        print(f"dev: real-Redis tests use {TEST_REDIS_ENV}={named} (FLUSHDB only)",
              file=sys.stderr)
    elif shutil.which("redis-server") is None:
        print(f"dev: redis-server is not on PATH and {TEST_REDIS_ENV} is not set;"
              " the real-Redis tests will fail", file=sys.stderr)


def _lint(env: dict[str, str]) -> int:
    """ruff, mypy --strict and the import-layer contracts; non-zero when any fails."""
    failed = []
    for name, args in (("ruff", ["check", "."]), ("mypy", []), ("lint-imports", [])):
        if subprocess.call([str(BIN / name), *args], cwd=ROOT, env=env) != 0:
            failed.append(name)
    if failed:
        print(f"dev: lint failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


COMMANDS = ("demo", "run", "test", "lint", "lock")
HELP = ("-h", "--help", "help")


def _usage() -> str:
    return (__doc__ or "").strip() + "\n"


def _become(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` in place of this process where the system allows it (so a signal
    meant for the run reaches it), else as a child; its exit status."""
    if os.name == "posix":
        os.chdir(ROOT)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(argv[0], argv, env)
    return subprocess.call(argv, cwd=ROOT, env=env)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in HELP:
        # No command is a mistake (exit 2, the usage on stderr); asking for help is not.
        (sys.stdout if argv else sys.stderr).write(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"dev: unknown command {command!r}; use {', '.join(COMMANDS)} "
              "(python3 dev.py --help)", file=sys.stderr)
        return 2
    if command == "lock":
        return _lock()
    _ensure_venv(None if command == "demo" else "test")
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if command == "test":
        _report_test_redis()
        return _become([str(BIN / "python"), "-m", "pytest", *rest], env)
    if command == "lint":
        return _lint(env)
    if command == "demo":
        return _become([str(BIN / "dsh-schedule"), "demo", *rest], env)
    return _become([str(BIN / "dsh-schedule"), *rest], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
