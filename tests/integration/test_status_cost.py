"""What ``status`` and the pending-followups gauge cost Redis (docs/architecture.md#operations):
a number of commands that grows with the queues, hosts and workers, never with the agents."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from dsh_schedule.scheduler.process import Reconciler
from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.status import read_status
from tests.redis_server import RedisServer

pytestmark = pytest.mark.redis

HOSTS = ("host-a", "host-b")


@pytest.fixture
def recorder() -> Iterator[metrics.PrometheusMetrics]:
    enabled = metrics.enable()
    try:
        yield enabled
    finally:
        metrics.disable()


def commands_sent(client: redis.Redis) -> int:
    """Every command the server ran since its statistics were reset, those scripts ran
    included, except the reading of the statistics themselves."""
    stats = client.info("commandstats")
    return sum(int(value["calls"]) for name, value in stats.items()
               if name not in ("cmdstat_info", "cmdstat_config|resetstat"))


def grow_to(coord: Coordination, settings: Settings, total: int, have: int) -> None:
    """Live agents up to ``total`` on two hosts, each with one followup entry pending."""
    agents = [f"agent-{i}" for i in range(have, total)]
    for index, host in enumerate(HOSTS):
        coord.leases.install(host, agents[index::2], settings.queue, now_ms=wall_clock_ms(),
                             ttl_s=600)
    coord.followups.add([(agent, "a followup", []) for agent in agents])


def test_status_and_the_gauge_cost_as_many_commands_for_many_agents_as_for_few(
    redis_server: RedisServer, settings: Settings, recorder: metrics.PrometheusMetrics,
) -> None:
    client = redis_server.client()
    coord = Coordination(client, settings)
    reconciler = Reconciler(coord, settings)
    costs: list[tuple[int, int]] = []
    have = 0
    for total in (10, 1_500):
        # given ``total`` live agents, each with a followup pending
        grow_to(coord, settings, total, have)
        have = total
        # when status is read, then when a reconcile pass sets the gauges (once before,
        # so that loading the scripts is not counted)
        read_status(client, settings, now_ms=wall_clock_ms())
        reconciler.reconcile(now_ms=wall_clock_ms())
        client.config_resetstat()
        report = read_status(client, settings, now_ms=wall_clock_ms())
        status_cost = commands_sent(client)
        client.config_resetstat()
        reconciler.reconcile(now_ms=wall_clock_ms())
        gauge_cost = commands_sent(client)
        # then both see every agent and followup
        assert (report.live_agents, report.followups_pending) == (total, total)
        assert [(q.name, q.live_agents) for q in report.queues] == [(settings.queue, total)]
        gauge = recorder.registry.get_sample_value("dsh_schedule_followups_pending")
        assert gauge == total
        costs.append((status_cost, gauge_cost))
    # and neither sent one command more for 1 500 agents than for 10
    assert costs[0] == costs[1]
