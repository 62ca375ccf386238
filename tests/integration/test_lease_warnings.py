"""A host's first lease is no expired one (docs/architecture.md#leases): a fresh host, the
web console's or the reference host's, starts without a warning; a lease that did run out
is still warned about."""

from __future__ import annotations

import logging

import fakeredis
import pytest

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.bridge import HostBridge
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session

BRIDGE_LOG = "dsh_schedule.host.bridge"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == BRIDGE_LOG and record.levelno >= logging.WARNING]


def test_a_fresh_host_without_agents_takes_its_lease_quietly(
    coordination: Coordination, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=BRIDGE_LOG)
    bridge = HostBridge(MemoryStore(), coordination, settings, clock=FakeClock())
    assert bridge.renew() == []
    assert bridge.renew() == []
    assert warnings_of(caplog) == []


def test_a_fresh_embedded_system_starts_without_a_warning(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # the web console without a Redis URL runs one of these
    caplog.set_level(logging.DEBUG, logger=BRIDGE_LOG)
    clock = FakeClock()
    system = EmbeddedSystem(MemoryStore(), settings, clock=clock, sleep=lambda s: None,
                            client=fakeredis.FakeRedis(), injected_clock=True)
    system.step()
    system.step()
    assert warnings_of(caplog) == []


def test_a_lease_that_ran_out_is_still_warned_about(
    coordination: Coordination, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=BRIDGE_LOG)
    clock = FakeClock()
    store = MemoryStore()
    bridge = HostBridge(store, coordination, settings, clock=clock)
    bridge.install(new_session(store, "a1"))
    assert bridge.renew() == []
    clock.advance(settings.lease_ttl_s + 1)  # the host stalled past its lease
    bridge.renew()
    assert warnings_of(caplog) == [
        f"the lease of host {bridge.host} had expired; installing its 1 agent(s) again"]


def test_a_host_that_held_its_lease_without_agents_is_warned_when_it_ran_out(
    coordination: Coordination, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=BRIDGE_LOG)
    clock = FakeClock()
    bridge = HostBridge(MemoryStore(), coordination, settings, clock=clock)
    bridge.renew()
    clock.advance(settings.lease_ttl_s + 1)
    bridge.renew()
    assert len(warnings_of(caplog)) == 1
