"""The collector settings of the long-running processes (dsh_schedule.shared.collector)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from dsh_schedule.shared.collector import YOUNG_THRESHOLD


def test_a_service_freezes_its_start_up_and_collects_young_objects_less_often() -> None:
    # In a process of its own: the test process keeps its collector as it is.
    probe = textwrap.dedent("""
        import gc
        from dsh_schedule.shared.collector import tune_for_service
        before = gc.get_threshold()
        tune_for_service()
        print(before[0], gc.get_threshold()[0], gc.get_freeze_count() > 0, gc.isenabled())
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    default, tuned, frozen, enabled = done.stdout.split()
    assert int(default) == gc.get_threshold()[0] != YOUNG_THRESHOLD
    assert int(tuned) == YOUNG_THRESHOLD
    assert frozen == "True" and enabled == "True"  # cycles are still collected
