"""The parts of the process phases (idle, burst, memory) that are not timings: reading
/proc, Redis counters and session logs, choosing phases, and judging targets at scale."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec
import pytest

from dsh_schedule.loadtest.command import (
    PHASES,
    PROCESS_PHASES,
    add_arguments,
    build_plan,
    select_phases,
)
from dsh_schedule.loadtest.figures import (
    BurstFigure,
    CpuWindow,
    Figures,
    IdleFigure,
    LatenessFigure,
    ProcessMemoryFigure,
)
from dsh_schedule.loadtest.host import read_ids
from dsh_schedule.loadtest.process_costs import (
    CpuReading,
    ProcessMemory,
    cores_between,
    parse_commandstats,
    parse_stat_cpu_ticks,
    parse_status_memory,
)
from dsh_schedule.loadtest.report import summary_rows, targets
from dsh_schedule.loadtest.sessions import (
    DELIVERY,
    DISPATCH,
    SessionTails,
    reminder_mark,
    served_session,
)
from dsh_schedule.loadtest.stats import latency
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.instant import format_instant
from tests.support import T0

# -- /proc --------------------------------------------------------------------------------

# Fields 14 and 15 (utime, stime) are 7 and 3; the command name holds spaces and ")".
STAT = ("4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 7 3 0 0 20 0 3 0 "
        "123456 45678912 9876 18446744073709551615 1 1 0 0 0 0 0 16781312 17474 0 0 0 17 1 "
        "0 0 0 0 0")


def test_cpu_ticks_are_utime_plus_stime_counted_after_the_command_name() -> None:
    assert parse_stat_cpu_ticks(STAT) == 10


@pytest.mark.parametrize("text", ["", "4242 python3 S 1", "4242 (python3) S 1 2 3"])
def test_a_line_without_the_fields_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_stat_cpu_ticks(text)


def test_resident_memory_is_read_in_bytes() -> None:
    status = "Name:\tpython3\nVmPeak:\t  500000 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    assert parse_status_memory(status) == ProcessMemory(rss_bytes=100 * 2**20,
                                                        hwm_bytes=200 * 2**20)


def test_a_process_without_memory_lines_has_none() -> None:
    assert parse_status_memory("Name:\tzombie\nState:\tZ (zombie)\n") == ProcessMemory(
        rss_bytes=None, hwm_bytes=None)


def _reading(at: float, cpu: dict[str, float | None], redis_cpu: float | None, commands: int,
             own: int = 0, calls: dict[str, int] | None = None) -> CpuReading:
    return CpuReading(at=at, cpu_s=cpu, redis_cpu_s=redis_cpu, redis_commands=commands,
                      own_commands=own, calls=calls or {})


def test_cores_are_cpu_seconds_per_second_of_each_process_and_the_server() -> None:
    first = _reading(100.0, {"host": 1.0, "worker-1": 2.0}, 10.0, 1000)
    last = _reading(110.0, {"host": 1.5, "worker-1": 2.0}, 10.2, 1201)
    window = cores_between(first, last)
    assert window.seconds == 10.0
    assert window.cores == {"host": 0.05, "worker-1": 0.0, "redis-server": 0.02}
    # 201 more, less the first reading's INFO stats: 200 commands in 10 s.
    assert window.commands_per_s == 20.0


def test_the_readings_own_commands_are_not_counted() -> None:
    first = _reading(0.0, {}, 1.0, 50, own=1)
    last = _reading(2.0, {}, 1.0, 52, own=1)
    assert cores_between(first, last).commands_per_s == 0.0


def test_commands_are_counted_by_type_busiest_first_without_the_readings() -> None:
    first = _reading(0.0, {}, 0.0, 100, calls={"info": 5, "xread": 10, "get": 1})
    last = _reading(2.0, {}, 0.0, 134, calls={"info": 7, "xread": 12, "get": 31, "zadd": 2})
    window = cores_between(first, last)
    assert list(window.commands_by_type.items()) == [("get", 15.0), ("xread", 1.0),
                                                     ("zadd", 1.0)]
    # 34 more, less the first reading's INFO stats and INFO commandstats.
    assert window.commands_per_s == 16.0


def test_commandstats_are_read_per_command() -> None:
    info = {"cmdstat_get": {"calls": 3, "usec": 9}, "cmdstat_xinfo|stream": {"calls": 1},
            "errorstat_ERR": {"count": 1}, "cmdstat_odd": 7}
    assert parse_commandstats(info) == {"get": 3, "xinfo|stream": 1}


def test_a_process_that_could_not_be_read_has_no_figure() -> None:
    window = cores_between(_reading(0.0, {"host": None}, None, 0),
                           _reading(1.0, {"host": 2.0}, None, 1))
    assert window.cores == {"host": None, "redis-server": None}


def test_readings_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError):
        cores_between(_reading(1.0, {}, 0.0, 0), _reading(1.0, {}, 0.0, 0))


# -- session logs -------------------------------------------------------------------------


def _line(kind: str, time: int, data: object) -> bytes:
    return json.dumps({"type": kind, "seq": 0, "time": time, "data": data}).encode()


DISPATCH_LINE = _line("schedule/change", 5, {"version": 1, "operation": "dispatch", "id": "a"})
DELIVERY_LINE = _line("user/message", 7, {
    "content": [{"type": "text", "text": "due"}],
    "source": {"kind": "plugin", "plugin": "schedule",
               "reminders": [{"scheduleId": "a", "occurrenceAt": "2026-12-01T12:00:00.000Z"}]}})


@pytest.mark.parametrize(("line", "mark"), [
    (DISPATCH_LINE, (DISPATCH, 5)),
    (DELIVERY_LINE, (DELIVERY, 7)),
    (_line("schedule/change", 1, {"version": 1, "operation": "create", "id": "a"}), None),
    (_line("user/message", 1, {"content": [], "source": {"kind": "user", "rpcId": "r"}}), None),
    (_line("turn/start", 1, {"turn": 0}), None),
    (b'{"type":"session","version":0,"id":"s","createdAt":1}', None),
    (b"{not json", None),
    (b"[1, 2]", None),
])
def test_a_line_marks_a_dispatch_or_a_delivery(line: bytes, mark: tuple[str, int] | None) -> None:
    assert reminder_mark(line) == mark


def test_tails_read_only_what_came_after_and_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"type":"session"}\n' + DISPATCH_LINE + b"\n")  # before: not read
    tails = SessionTails({"a": path})
    assert tails.poll() == 1 and tails.dispatched == {}
    with path.open("ab") as file:
        file.write(DISPATCH_LINE.replace(b'"time": 5', b'"time": 6') + b"\n")
        file.write(DELIVERY_LINE[:20])  # a torn line: not yet
    assert tails.poll() == 1
    assert tails.dispatched == {"a": 6} and tails.delivered == {}
    with path.open("ab") as file:
        file.write(DELIVERY_LINE[20:] + b"\n")
    assert tails.poll() == 0
    assert tails.delivered == {"a": 7}


def test_tails_forget_a_session_nothing_will_come_in(tmp_path: Path) -> None:
    paths = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    for path in paths.values():
        path.write_bytes(b'{"type":"session"}\n')
    tails = SessionTails(paths)
    tails.forget(["b"])
    with paths["a"].open("ab") as file:
        file.write(DELIVERY_LINE + b"\n")
    assert tails.poll() == 0


@pytest.mark.parametrize("length", [0, 10, 1000])
def test_a_served_session_passes_the_invariant_with_one_reminder_already_due(length: int) -> None:
    events = served_session(length, now_ms=T0)
    assert [e.seq for e in events] == list(range(length + 1))
    assert [e.time for e in events] == sorted(e.time for e in events)
    state = fold(events)
    due = [r for r in state.active if r.scheduledAt <= format_instant(T0)]
    assert [r.id for r in due] == ["schedule-served"]


def test_host_ids_are_one_a_line() -> None:
    assert read_ids("a\nb\n\n c-1\n") == ["a", "b", " c-1"]


# -- phases and sizes ---------------------------------------------------------------------


def test_every_phase_runs_by_default_the_process_ones_only_with_redis() -> None:
    assert select_phases(None, redis=True) == list(PHASES)
    assert select_phases(None, redis=False) == [p for p in PHASES if p not in PROCESS_PHASES]
    assert select_phases("memory, idle", redis=True) == ["idle", "memory"]


@pytest.mark.parametrize(("text", "redis"), [
    ("idle", False), ("create,burst", False), ("nope", True), (",", True),
])
def test_a_phase_that_cannot_run_is_refused(text: str, redis: bool) -> None:
    with pytest.raises(SystemExit):
        select_phases(text, redis=redis)


def _plan(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return msgspec.to_builtins(build_plan(parser.parse_args(list(argv)), "lt0"))  # type: ignore[no-any-return]


def test_the_process_phases_default_to_the_targets_scale_and_shrink_for_smoke() -> None:
    full = _plan("--redis", "redis://127.0.0.1:6379/0")
    assert (full["idle_agents"], full["burst_agents"], full["memory_sessions"],
            full["memory_events"]) == (20_000, 10_000, 1_000, 10_000)
    smoke = _plan("--redis", "redis://127.0.0.1:6379/0", "--smoke")
    assert smoke["idle_agents"] == 20 and smoke["idle_window_s"] == 2
    assert _plan("--idle-agents", "500")["idle_agents"] == 500
    with pytest.raises(SystemExit):
        _plan("--burst-agents", "0")


# -- targets ------------------------------------------------------------------------------

NO_LATENCY = latency([])


def _window(per_1000: float) -> CpuWindow:
    return CpuWindow(seconds=60.0, processes={"host": 0.01, "worker-1": 0.0, "scheduler": 0.01,
                                              "redis-server": 0.02},
                     total_cores=0.04, cores_per_1000_agents=per_1000, commands_per_s=100.0,
                     commands_by_type={"xread": 1.0}, redis_cpu_from="proc")


def _idle(agents: int, per_1000: float) -> IdleFigure:
    return IdleFigure(agents=agents, host_processes=1, workers=2, ready_seconds=1.0,
                      warmup_s=10, ours=_window(per_1000), bare=_window(0.0001), ratio=20.0,
                      ratio_commands=1.0)


def _burst(agents: int, p99_ms: float) -> BurstFigure:
    lat = latency([p99_ms])
    return BurstFigure(agents=agents, created=agents, errors=0, due_at="x", slack_s=1.0,
                       dispatched=agents, delivered=agents, missing=0, followup=lat,
                       session=lat, bare_jobs=agents, bare=lat, bare_slack_s=1.0, ratio_p99=1.0)


def _memory(sessions: int, events: int, served: int, rss_mib: int) -> ProcessMemoryFigure:
    rss = rss_mib * 2**20
    return ProcessMemoryFigure(sessions=sessions, events_per_session=events, session_bytes=1,
                               served=served, seconds=1.0, worker_rss_bytes=rss,
                               worker_hwm_bytes=rss, worker_start_rss_bytes=rss,
                               host_rss_bytes=rss, host_hwm_bytes=rss, scheduler_rss_bytes=rss,
                               bare_worker_rss_bytes=rss, note=None)


def _late(reminders: int, session_p99: float) -> LatenessFigure:
    return LatenessFigure(hosts=1, reminders=reminders, delivered=reminders, missing=0,
                          window_s=12, mover_interval_s=0.2, followup=latency([10.0]),
                          session=latency([session_p99]), bare=latency([10.0]), ratio_p99=1.0)


def _met(figures: Figures, name: str, real_redis: bool = True) -> bool | None:
    rows = {t.name: t for t in targets(figures, real_redis=real_redis)}
    return rows[name].met


IDLE = "idle cores per 1 000 agents, all processes (20 000 agents)"
BURST_FOLLOWUP = "burst due->followup p99 ms (10 000 agents)"
BURST_SESSION = "burst due->session p99 ms (10 000 agents)"
WORKER_RSS = "worker RSS MiB after 1 000 x 10 000"
HOST_RSS = "host RSS MiB after 1 000 x 10 000"
LATE_SESSION = "lateness due->session p99 ms (400 reminders)"


@pytest.mark.parametrize(("figures", "name", "met"), [
    (Figures(idle=_idle(20_000, 0.0015)), IDLE, True),
    (Figures(idle=_idle(20_000, 0.0025)), IDLE, False),
    (Figures(idle=_idle(19_999, 0.0015)), IDLE, None),
    (Figures(burst=_burst(10_000, 900.0)), BURST_FOLLOWUP, True),
    (Figures(burst=_burst(10_000, 1200.0)), BURST_FOLLOWUP, False),
    (Figures(burst=_burst(10_000, 1200.0)), BURST_SESSION, True),
    (Figures(burst=_burst(10_000, 6000.0)), BURST_SESSION, False),
    (Figures(burst=_burst(500, 100.0)), BURST_SESSION, None),
    (Figures(process_memory=_memory(1000, 10_000, 1000, 250)), WORKER_RSS, True),
    (Figures(process_memory=_memory(1000, 10_000, 1000, 350)), HOST_RSS, False),
    (Figures(process_memory=_memory(1000, 10_000, 999, 250)), WORKER_RSS, None),
    (Figures(process_memory=_memory(100, 10_000, 100, 250)), WORKER_RSS, None),
    (Figures(lateness=_late(400, 90.0)), LATE_SESSION, True),
    (Figures(lateness=_late(400, 110.0)), LATE_SESSION, False),
    (Figures(lateness=_late(80, 10.0)), LATE_SESSION, None),
])
def test_each_new_target_is_judged_at_its_scale(figures: Figures, name: str,
                                                met: bool | None) -> None:
    assert _met(figures, name) is met
    assert _met(figures, name, real_redis=False) is None


def test_the_summary_shows_small_core_figures_with_their_digits() -> None:
    rows = {row[0]: row for row in summary_rows(Figures(idle=_idle(20_000, 0.0021)))}
    assert rows["idle cores per 1,000 agents (20,000 agents)"][1] == "0.0021"
    assert rows["idle cores by process"][1] == ("host 0.01, workers 0.00, scheduler 0.01, "
                                                "redis-server 0.02")
