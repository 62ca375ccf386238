#!/usr/bin/env python3
"""Self-contained project commands for a machine that has only Python.

    python3 dev.py demo    # the main job, on embedded defaults
    python3 dev.py test    # the whole test suite
    python3 dev.py lint    # ruff and mypy --strict on the packages

Each command creates ``.venv`` on first use and reinstalls when pyproject.toml changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed"


def _ensure_venv() -> None:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    if not (BIN / "python").exists():
        print("dev: creating .venv", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev: installing the project and its test extra", file=sys.stderr)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    # "compat" editable mode is a plain path entry, so PYTHONPATH can shadow the checkout.
    subprocess.run(
        [*pip, "-e", f"{ROOT}[test]", "--config-settings", "editable_mode=compat"], check=True
    )
    STAMP.write_text(digest)


def _redis_answers(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _ensure_redis() -> None:
    """The suite's real-Redis tests need 127.0.0.1:6379; start a local server if we can."""
    if _redis_answers():
        return
    server = shutil.which("redis-server")
    if server is None:
        print("dev: no Redis on 127.0.0.1:6379 and no redis-server to start;"
              " the real-Redis tests will fail", file=sys.stderr)
        return
    subprocess.run(
        [server, "--daemonize", "yes", "--bind", "127.0.0.1", "--port", "6379",
         "--save", "", "--appendonly", "no"],
        check=True,
    )
    for _ in range(50):
        if _redis_answers():
            return
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("test", [])
    _ensure_venv()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if command == "test":
        _ensure_redis()
        return subprocess.call([str(BIN / "python"), "-m", "pytest", *rest], cwd=ROOT, env=env)
    if command == "lint":
        ruff = subprocess.call([str(BIN / "ruff"), "check", "."], cwd=ROOT, env=env)
        mypy = subprocess.call([str(BIN / "mypy")], cwd=ROOT, env=env)
        return ruff or mypy
    if command == "demo":
        return subprocess.call([str(BIN / "dsh-schedule"), "demo", *rest], cwd=ROOT, env=env)
    if command == "run":
        return subprocess.call([str(BIN / "dsh-schedule"), *rest], cwd=ROOT, env=env)
    print(f"dev: unknown command {command!r}; use demo, test, lint or run", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
