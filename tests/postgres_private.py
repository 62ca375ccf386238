"""A private PostgreSQL server for the tests that stop, crash or starve the database.

``initdb`` into a directory of its own (trust authentication), a free port on 127.0.0.1,
its socket in that directory: no other server or database is touched. ``crash`` is an
immediate shutdown (no checkpoint, commits not yet flushed to the server's disk lost, a
recovery at the next ``start``), as after a power cut; ``start`` comes back on the same
port. Run as root, the server runs as the ``postgres`` user (PostgreSQL refuses root), and
``on_small_disk`` puts the data directory on a tmpfs of its own so that a test can fill
the server's disk. The binaries are the newest under ``/usr/lib/postgresql/*/bin`` (or
those ``pg_config --bindir`` names).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from tests.children import PRE_EXEC
from tests.postgres_server import in_ci
from tests.redis_server import free_port

START_TIMEOUT_S = 60.0


class PostgresMissing(RuntimeError):
    """No PostgreSQL server binaries (``initdb``, ``postgres``) to run."""


def postgres_bindir() -> Path:
    """The directory of the newest ``initdb`` and ``postgres``."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    if found:
        return found[-1].parent
    config = shutil.which("pg_config")
    if config is not None:
        bindir = Path(subprocess.run([config, "--bindir"], capture_output=True, text=True,
                                     check=True).stdout.strip())
        if (bindir / "postgres").exists():
            return bindir
    raise PostgresMissing(
        "no PostgreSQL server binaries (initdb, postgres): install Debian's `postgresql` "
        "package, which `.ci/run` installs")


def _as_owner() -> list[str]:
    """The command prefix that runs a server binary as the user PostgreSQL accepts."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]


class PrivateServer:
    """One PostgreSQL server this test started; ``url`` names its ``postgres`` database."""

    def __init__(self, small_disk_mb: int | None = None, **settings: str) -> None:
        """``settings``: server settings given on its command line (``-c name=value``)."""
        self.bindir = postgres_bindir()
        self.settings = settings
        self.root = Path(tempfile.mkdtemp(prefix="dsh-test-postgres-"))
        self.mount: Path | None = None
        if small_disk_mb is not None:
            self.mount = self.root / "disk"
            self.mount.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={small_disk_mb}m", "tmpfs",
                            str(self.mount)], check=True, capture_output=True)
        self.data = (self.mount or self.root) / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.proc: subprocess.Popen[bytes] | None = None
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for path in (self.root, *([self.mount] if self.mount else [])):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        subprocess.run(
            [*_as_owner(), str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres",
             "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
            check=True, capture_output=True)

    def start(self) -> PrivateServer:
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [*_as_owner(), str(self.bindir / "postgres"), "-D", str(self.data),
             "-p", str(self.port), "-k", str(self.root), "-c", "listen_addresses=127.0.0.1",
             "-c", "max_connections=60", "-c", "shared_buffers=16MB",
             "-c", "max_wal_size=64MB", "-c", "min_wal_size=32MB",
             *[arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")]],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=PRE_EXEC)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self.proc.returncode}:\n{self.log()}")
            if self.answers():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not answer within {START_TIMEOUT_S} s:\n{self.log()}")

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def crash(self) -> None:
        """An immediate shutdown: what was not on the server's disk is lost."""
        self._stop(signal.SIGQUIT)

    def stop(self) -> None:
        """A fast shutdown: sessions ended, every commit kept."""
        self._stop(signal.SIGINT)

    def _stop(self, how: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(how)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        self.stop()
        if self.mount is not None:
            with contextlib.suppress(subprocess.CalledProcessError):
                subprocess.run(["umount", "-l", str(self.mount)], check=True,
                               capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivateServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def private_server(small_disk_mb: int | None = None, **settings: str) -> PrivateServer:
    """A private server (not started), or the test fails (CI) or is skipped with what is
    missing."""
    try:
        return PrivateServer(small_disk_mb, **settings)
    except PostgresMissing as exc:
        if in_ci():
            pytest.fail(str(exc))
        pytest.skip(str(exc))
