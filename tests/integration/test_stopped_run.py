"""A test run stopped with SIGTERM or Ctrl-C ends every process its tests started
(``tests/children.py``): a redis-server, a ``dsh-schedule worker``, a plain child, and a
child started from a thread that has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import children
from tests.support import wait_until

ROOT = Path(__file__).resolve().parents[2]

TINY = '''
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.redis_server import RedisServer
from tests.support import Processes, process_env

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_that_holds_its_children(tmp_path):
    server = RedisServer(tmp_path / "redis").start()
    processes = Processes(tmp_path, process_env(server.url(), tmp_path / "sessions"))
    worker = processes.spawn("worker", "worker")
    child = subprocess.Popen(SLEEP)
    from_thread = []
    thread = threading.Thread(target=lambda: from_thread.append(subprocess.Popen(SLEEP)))
    thread.start()
    thread.join()
    pids = [server.proc.pid, worker.pid, child.pid, from_thread[0].pid]
    Path(os.environ["PIDS_FILE"]).write_text(" ".join(map(str, pids)))
    time.sleep(600)
'''


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_leaves_no_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    # Given a pytest run whose test has started a redis-server, a worker and two children
    (tmp_path / "run").mkdir()
    tiny = tmp_path / "run" / "test_tiny.py"
    tiny.write_text(TINY)
    pids_file = tmp_path / "pids"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSH_SCHEDULE_")}
    env["PIDS_FILE"] = str(pids_file)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.children", "-p", "no:cacheprovider",
         "-q", str(tiny)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    pids: list[int] = []
    try:
        assert wait_until(pids_file.exists, timeout=60), "the tiny test did not start"
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(alive(pid) for pid in pids)
        # When the run alone gets SIGTERM or SIGINT (not its process group)
        run.send_signal(sig)
        output, _ = run.communicate(timeout=60)
        # Then it ends as interrupted, and every process its test started is gone
        assert run.returncode == pytest.ExitCode.INTERRUPTED, output
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10), (
            [pid for pid in pids if alive(pid)], output)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_suite_notes_every_child_its_tests_start(pytestconfig: pytest.Config) -> None:
    # the suite's own conftest loads the plugin the run above was given with -p
    assert pytestconfig.pluginmanager.has_plugin(children.__name__)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child in children.running()
    finally:
        child.kill()
        child.wait()
    assert child not in children.running()
