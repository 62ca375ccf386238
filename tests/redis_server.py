"""A private ``redis-server`` for tests: 127.0.0.1, a free port, its own directory,
nothing saved to disk.

The test session runs one of these for every real-Redis test (see ``tests/conftest.py``)
unless ``DSH_SCHEDULE_TEST_REDIS`` names a database to use instead (which the tests then
only ever FLUSHDB), and tests that stop, kill or restart Redis start another one of their
own either way; so without that variable no test ever touches a server it did not start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from tests.children import PRE_EXEC

TEST_REDIS_ENV = "DSH_SCHEDULE_TEST_REDIS"
START_TIMEOUT_S = 10.0


class RedisServerMissing(RuntimeError):
    """No ``redis-server`` executable to start."""


def redis_server_binary() -> str:
    """The ``redis-server`` on PATH; RedisServerMissing, with what to do, when there is none."""
    found = shutil.which("redis-server")
    if found is None:
        raise RedisServerMissing(
            "redis-server is not on PATH, so the test suite cannot start its own Redis. "
            "Install Redis (for example `apt-get install redis-server`), or set "
            f"{TEST_REDIS_ENV} to a database the suite may FLUSHDB, for example "
            "redis://127.0.0.1:6379/9"
        )
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers(port: int, host: str = "127.0.0.1") -> bool:
    """True when a Redis on ``host:port`` answers PING."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.settimeout(0.5)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process this code started, on 127.0.0.1.

    ``start`` picks a free port (or keeps the port of an earlier start, so ``restart``
    comes back where clients expect it). ``kill`` is SIGKILL: with ``--save ""`` and
    ``--appendonly no`` the next start is empty, as after a real crash with no persistence.
    On Linux the server also ends when the thread that started it ends, so start it from
    the thread that outlives it (the test's own).
    """

    def __init__(self, directory: Path | None = None, port: int | None = None) -> None:
        self._own_directory = directory is None
        self.directory = (
            Path(tempfile.mkdtemp(prefix="dsh-test-redis-")) if directory is None else directory
        )
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    # -- addresses ------------------------------------------------------------------

    def url(self, db: int = 0) -> str:
        if self.port is None:
            raise RuntimeError("the test Redis has not been started")
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db))

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no redis log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- life cycle -----------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> RedisServer:
        """Start the server and wait until it answers; RuntimeError when it cannot."""
        if self.running:
            return self
        binary = redis_server_binary()
        self.directory.mkdir(parents=True, exist_ok=True)
        fixed = self.port is not None
        # A free port can be taken between the probe and the bind; try a few.
        for _attempt in range(1 if fixed else 5):
            port = self.port if self.port is not None else free_port()
            if self._launch(binary, port):
                self.port = port
                return self
            if not fixed:
                self.port = None
        raise RuntimeError(
            f"redis-server did not start on 127.0.0.1:{self.port or 'a free port'}; "
            f"its log ({self.log_path}):\n{self.log_tail()}"
        )

    def _launch(self, binary: str, port: int) -> bool:
        for stale in ("dump.rdb", "appendonly.aof"):  # nothing may survive a restart
            (self.directory / stale).unlink(missing_ok=True)
        shutil.rmtree(self.directory / "appendonlydir", ignore_errors=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory),
             "--logfile", str(self.log_path), "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=PRE_EXEC,  # only prctl(2) between fork and exec
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            if answers(port):
                return True
            time.sleep(0.02)
        self._end(signal.SIGKILL)
        return False

    def kill(self) -> None:
        """SIGKILL the server (a crash: everything in memory is gone)."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """Stop the server (SIGTERM; SIGKILL if it does not exit)."""
        self._end(signal.SIGTERM)

    def restart(self) -> RedisServer:
        """Start again, empty, on the same port."""
        self.kill()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove the directory this object created."""
        self.stop()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _end(self, sig: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a stopped server cannot act on SIGTERM
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc is not None else None
        return f"RedisServer(port={self.port}, pid={pid}, dir={os.fspath(self.directory)!r})"
