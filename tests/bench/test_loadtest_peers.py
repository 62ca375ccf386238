"""The parts of ``loadtest --peers`` that need no process: the peers' delivery line, our
ratio to the best peer, the peer columns of the summary table, and the flag's checks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dsh_schedule.loadtest import command
from dsh_schedule.loadtest.figures import (
    BurstFigure,
    CpuWindow,
    Figures,
    IdleFigure,
    PeerBurst,
    PeerIdle,
    peers_figure,
)
from dsh_schedule.loadtest.peers import PEERS, delivered_line, read_lines
from dsh_schedule.loadtest.report import Result, peer_cells, render_table
from dsh_schedule.loadtest.stats import latency, machine


def _window(total: float, commands: float) -> CpuWindow:
    return CpuWindow(seconds=2.0, processes={"worker-1": total / 2, "redis-server": total / 2},
                     total_cores=total, cores_per_1000_agents=total * 10,
                     commands_per_s=commands, commands_by_type={"zrangebyscore": commands},
                     redis_cpu_from="proc")


def _idle() -> IdleFigure:
    return IdleFigure(agents=100, host_processes=1, workers=2, ready_seconds=1.0, warmup_s=1,
                      ours=_window(0.02, 10.0), bare=_window(0.01, 5.0), ratio=2.0,
                      ratio_commands=2.0, bytes_per_agent=900.0)


def _burst() -> BurstFigure:
    lat = latency([100.0, 200.0, 300.0])
    return BurstFigure(agents=3, created=3, errors=0, due_at="x", slack_s=1.0, dispatched=3,
                       delivered=3, missing=0, followup=lat, session=lat, bare_jobs=3, bare=lat,
                       bare_slack_s=1.0, ratio_p99=1.0)


def _peers() -> tuple[list[PeerIdle], list[PeerBurst]]:
    idle = [PeerIdle(peer=name, jobs=100, workers=2, ours=_window(total, commands),
                     bytes_per_job=size)
            for name, total, commands, size in zip(PEERS, (0.04, 0.01, 0.02), (2.0, 20.0, 5.0),
                                                   (300.0, 600.0, None), strict=True)]
    burst = [PeerBurst(peer=name, jobs=3, workers=2, ran=3, slack_s=1.0,
                       latency=latency([v, v, v]))
             for name, v in zip(PEERS, (400.0, 2000.0, 50.0), strict=True)]
    return idle, burst


def test_the_peers_line_is_read_back_as_due_to_ran(tmp_path: Path) -> None:
    delivered_line(str(tmp_path), "a1", 1_000)
    delivered_line(str(tmp_path), "a2", 2_000)
    delivered_line(str(tmp_path), "probe-1", 0)
    line = json.loads((tmp_path / "a1.jsonl").read_text())
    assert set(line) == {"due", "ran"} and line["due"] == 1_000
    lags = read_lines(tmp_path)
    assert len(lags) == 2  # the probe is left out


def test_our_figures_are_divided_by_the_best_peer() -> None:
    idle, burst = _peers()
    figure = peers_figure(_idle(), _burst(), idle, burst)
    assert figure.ratio_idle_cores == 2.0  # 0.02 over the best peer's 0.01
    assert figure.ratio_idle_commands == 5.0  # 10 over 2
    assert figure.ratio_idle_bytes == 3.0  # 900 over 300; a peer with no figure is left out
    assert figure.ratio_burst_p50 == 4.0  # 200 over 50
    assert figure.ratio_burst_p99 is not None


def test_without_a_figure_of_ours_there_is_no_ratio() -> None:
    idle, burst = _peers()
    figure = peers_figure(None, None, idle, burst)
    assert figure.ratio_idle_cores is None and figure.ratio_burst_p99 is None


def test_the_summary_table_gains_a_column_per_peer_and_the_ratio() -> None:
    idle, burst = _peers()
    figures = Figures(idle=_idle(), burst=_burst(),
                      peers=peers_figure(_idle(), _burst(), idle, burst))
    cells = peer_cells(figures)
    assert all(len(row) == len(PEERS) + 1 for row in cells.values())
    result = Result(version=1, mode="redis", started_at="x", seconds=1.0, command=[],
                    machine=machine(None), plan={}, figures=figures, targets=[], notes=[])
    lines = render_table(result).splitlines()
    for name in PEERS:
        assert f"peer {name} (2 workers)" in lines[0]
    assert lines[0].rstrip().endswith("ours vs best peer")
    burst_row = next(line for line in lines if line.startswith("burst due->followup"))
    assert "4.00x p50" in burst_row


def test_without_peers_the_table_keeps_its_four_columns() -> None:
    result = Result(version=1, mode="redis", started_at="x", seconds=1.0, command=[],
                    machine=machine(None), plan={}, figures=Figures(idle=_idle()), targets=[],
                    notes=[])
    assert "peer" not in render_table(result).splitlines()[0]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("argv", [
    ("--peers",),
    ("--peers", "--redis", "redis://x", "--phases", "memory"),
])
def test_peers_need_a_redis_and_the_idle_or_burst_phase(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit, match="--peers"):
        command.run(_args(*argv))
