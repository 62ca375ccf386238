"""The load test's own parts that are not timings: its session fixtures pass the v1
invariant, its statistics and its Redis URL handling say what they promise (issue 6)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dsh_schedule.loadtest.figures import Figures, RebuildFigure
from dsh_schedule.loadtest.process_runtime import RedisRuntime, with_db
from dsh_schedule.loadtest.report import targets
from dsh_schedule.loadtest.sessions import ACTIVE_KEPT, conversation, reminders
from dsh_schedule.loadtest.stats import (
    ArmCurve,
    arm_curve,
    cost_ratio,
    latency,
    percentile,
    rate_ratio,
)
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE
from dsh_schedule.shared.core.fold import fold
from tests.support import T0


@pytest.mark.parametrize("length", [0, 1, 9, 10, 333, 334, 1000, 10_000])
def test_a_prefilled_session_has_its_length_and_passes_the_invariant(length: int) -> None:
    events = conversation(length, start_ms=T0)
    state = fold(events)
    assert [e.seq for e in events] == list(range(length))
    assert len(state.active) <= ACTIVE_KEPT


def test_a_long_session_is_mostly_ordinary_work_with_a_few_hundred_changes() -> None:
    events = conversation(100_000, start_ms=T0)
    changes = sum(1 for e in events if e.type == SCHEDULE_CHANGE)
    assert 200 <= changes <= 400
    assert {e.type for e in events} >= {"turn/start", "user/message", "tool/call",
                                        "tool/result", "assistant/message", "turn/end"}


def test_rebuild_sessions_hold_distinct_future_reminders() -> None:
    state = fold(reminders(10, agent_index=7, base_ms=T0))
    assert [r.id for r in state.active] == [f"schedule-{k}" for k in range(1, 11)]
    assert len({r.scheduledAt for r in state.active}) == 10


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([], 50, None),
    ([5.0], 99, 5.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
    ([float(i) for i in range(1, 101)], 99, 99.0),
    ([float(i) for i in range(1, 101)], 100, 100.0),
])
def test_percentiles_are_nearest_rank(values: list[float], p: float,
                                      expected: float | None) -> None:
    assert percentile(values, p) == expected


def test_an_empty_latency_has_a_count_and_no_figures() -> None:
    empty = latency([])
    assert (empty.count, empty.p50_ms, empty.p99_ms, empty.max_ms) == (0, None, None, None)


@pytest.mark.parametrize(("ours", "bare", "cost", "rate"), [
    (2.0, 1.0, 2.0, 0.5),
    (1.0, 4.0, 0.25, 4.0),
    (None, 1.0, None, None),
    (1.0, None, None, None),
    (0.0, 0.0, None, None),
])
def test_ratios_say_how_many_times_the_bare_cost(ours: float | None, bare: float | None,
                                                  cost: float | None,
                                                  rate: float | None) -> None:
    assert cost_ratio(ours, bare) == cost
    assert rate_ratio(ours, bare) == rate


@pytest.mark.parametrize(("url", "expected"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/15"),
    ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379/15"),
    ("redis://:secret@host:1/3?socket_timeout=5&db=2", "redis://:secret@host:1/15?socket_timeout=5"),
    ("rediss://host/1", "rediss://host/15"),
    ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=15"),
])
def test_the_rebuild_database_is_another_database_of_the_same_server(url: str,
                                                                     expected: str) -> None:
    assert with_db(url, 15) == expected


def _runtime(tmp_path: Path, store: str | None = None) -> RedisRuntime:
    """A runtime that sends Redis nothing until it starts workers, a mover or closes."""
    return RedisRuntime("redis://127.0.0.1:1/0", tmp_path / "sessions", prefix="t:",
                        queue="t", workers=1, logs=tmp_path / "logs", tags=("t",),
                        store=store)


def test_a_runtime_names_the_store_it_is_given_to_its_processes(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:1/postgres"
    given, default = _runtime(tmp_path, store=url), _runtime(tmp_path)
    assert given.child_env()["DSH_SCHEDULE_STORE"] == given.settings.store_name == url
    assert "DSH_SCHEDULE_STORE" not in default.child_env()
    assert default.settings.store_name == str(tmp_path / "sessions")


def test_a_runtime_reports_its_processes_that_exited_by_role(tmp_path: Path) -> None:
    rt = _runtime(tmp_path)
    rt.start_named("probe", ["-c", "raise SystemExit(3)"])
    rt.start_named("sleeper", ["-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while "probe" not in rt.exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.exited() == {"probe": 3}
    finally:
        rt.stop("sleeper")
        rt.stop("probe")


def test_targets_not_measured_are_neither_met_nor_missed() -> None:
    rows = targets(Figures(), real_redis=True)
    assert len(rows) == 16  # the lifecycle added two (issue 39)
    assert all(t.measured is None and t.met is None for t in rows)


@pytest.mark.parametrize(("agents", "records", "real_redis", "met"), [
    (10_000, 10, True, True),
    (20_000, 10, True, True),
    (1_000, 10, True, None),
    (10_000, 3, True, None),
    (20_000, 3, True, None),
    (10_000, 10, False, None),
])
def test_the_rebuild_target_is_judged_only_at_its_scale_on_real_redis(
    agents: int, records: int, real_redis: bool, met: bool | None
) -> None:
    figure = RebuildFigure(agents=agents, records_per_agent=records, db=15,
                           lease_restore_seconds=1.0, enqueue_seconds=0.1, seconds=1.0,
                           armed=agents, cold_seconds=1.0, bare_seconds=1.0, ratio=1.0)
    rows = {t.name: t for t in targets(Figures(rebuild=figure), real_redis=real_redis)}
    assert rows["rebuild seconds (10 000 agents x 10)"].met is met


@pytest.mark.parametrize(("samples", "curve"), [
    # a flat rate: the first and the last tenth armed as fast
    ([(1.0, 100), (5.0, 500), (9.0, 900), (10.0, 1000)], ArmCurve(
        first_tenth_per_s=100.0, last_tenth_per_s=100.0)),
    # a rate that bends: the last tenth ten times slower than the first
    ([(1.0, 100), (5.0, 900), (15.0, 1000)], ArmCurve(
        first_tenth_per_s=100.0, last_tenth_per_s=10.0)),
    # samples too coarse to resolve the last tenth
    ([(2.0, 900), (2.0, 1000)], ArmCurve(first_tenth_per_s=450.0, last_tenth_per_s=None)),
    ([], ArmCurve(first_tenth_per_s=None, last_tenth_per_s=None)),
])
def test_the_arming_curve_is_the_rate_of_the_first_and_the_last_tenth(
        samples: list[tuple[float, int]], curve: ArmCurve) -> None:
    assert arm_curve(samples, 1000) == curve
