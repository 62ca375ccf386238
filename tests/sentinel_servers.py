"""A Sentinel deployment for tests, on 127.0.0.1 and free ports: a primary, a replica
and three sentinels, each a ``redis-server`` process this code started (a sentinel is
``redis-server CONF --sentinel``, which is all ``redis-sentinel`` is), each in its own
directory, nothing saved. ``failover`` asks the sentinels to promote the replica and
waits until they name it and it takes writes."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from tests.children import PRE_EXEC
from tests.redis_server import START_TIMEOUT_S, free_port, redis_server_binary

SERVICE = "schedule"
SENTINELS = 3
QUORUM = 2


class _Process:
    def __init__(self, name: str, directory: Path, args: list[str]) -> None:
        self.name = name
        self.directory = directory
        self.port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def start(self, binary: str, extra: list[str]) -> None:
        self.proc = subprocess.Popen(
            [binary, *self.args, "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--logfile", str(self.log_path),
             "--daemonize", "no", *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=PRE_EXEC,
        )

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def answers(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class SentinelGroup:
    """A primary, a replica of it and three sentinels watching them as ``SERVICE``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        data = ["--save", "", "--appendonly", "no"]
        self.servers = [_Process(f"redis-{i}", directory / f"redis-{i}", data)
                        for i in range(2)]
        self.sentinels = [_Process(f"sentinel-{i}", directory / f"sentinel-{i}", [])
                          for i in range(SENTINELS)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelGroup:
        binary = redis_server_binary()
        first, second = self.servers
        first.start(binary, [])
        second.start(binary, ["--replicaof", "127.0.0.1", str(first.port)])
        self._wait(lambda: first.answers() and second.answers(), "the two servers")
        self._wait(lambda: second.client().info("replication").get("master_link_status")
                   == "up", "the replica's link")
        for sentinel in self.sentinels:
            conf = sentinel.directory / "sentinel.conf"
            conf.write_text(
                f"sentinel monitor {SERVICE} 127.0.0.1 {first.port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n",
                encoding="utf-8")
            sentinel.args = [str(conf), "--sentinel"]
            sentinel.start(binary, [])
        self._wait(self._sentinels_agree, "the sentinels to see the replica and each other")
        return self

    def primary_port(self, sentinel: int = 0) -> int | None:
        try:
            with self.sentinels[sentinel].client() as client:
                found = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except redis.RedisError:
            return None
        return int(found[1]) if found else None

    def _sentinels_agree(self) -> bool:
        ports = {self.primary_port(i) for i in range(SENTINELS)}
        if ports != {self.servers[0].port}:
            return False
        try:
            with self.sentinels[0].client() as client:
                master = client.execute_command("SENTINEL", "MASTER", SERVICE)
        except redis.RedisError:
            return False
        # redis-py parses the reply into a dict of bytes names and values
        return (int(master[b"num-slaves"]) >= 1
                and int(master[b"num-other-sentinels"]) >= SENTINELS - 1)

    def failover(self, *, kill: bool = False) -> int:
        """Promote the replica: ask for it (``SENTINEL FAILOVER``), or SIGKILL the primary
        and let the sentinels agree it is down; returns the new primary's port once every
        sentinel names it and it takes writes."""
        old = self.primary_port()
        if kill:
            next(s for s in self.servers if s.port == old).stop()
        else:
            with self.sentinels[0].client() as client:
                client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        new = next(s for s in self.servers if s.port != old)

        def done() -> bool:
            if {self.primary_port(i) for i in range(SENTINELS)} != {new.port}:
                return False
            try:
                with new.client() as client:
                    return client.info("replication").get("role") == "master"
            except redis.RedisError:
                return False

        self._wait(done, "the failover", timeout=60)
        return new.port

    def _wait(self, condition: object, what: str, timeout: float = START_TIMEOUT_S * 3) -> None:
        assert callable(condition)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.05)
        logs = "\n".join(f"--- {p.name}:\n{p.log_tail()}" for p in [*self.servers,
                                                                     *self.sentinels])
        raise RuntimeError(f"waited {timeout:g} s for {what}\n{logs}")

    def close(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            process.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
