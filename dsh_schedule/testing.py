"""pytest fixtures for host authors: an embedded runtime whose clock a test moves
(docs/integrations/README.md#testing-a-host).

Installed with the package as a pytest plugin (the ``pytest11`` entry point
``dsh_schedule``), so a host's own tests just name the fixture::

    def test_the_agent_is_reminded(schedule_runtime):
        host = schedule_runtime.reference_host()     # or your host on .async_plugin()
        schedule_runtime.create_session("chat-1")
        host.open_root("chat-1")
        host.prompt("chat-1", "remind me in an hour", tool_calls=[
            ("schedule_create", {"prompt": "stretch", "after_seconds": 3600})])
        schedule_runtime.advance(3600)
        (delivery,) = host.pump("chat-1")
        assert '"stretch"' in delivery.text

A host that re-creates its agents when their reminders fall due (``on_due_unloaded``,
docs/integrations/README.md#reminders-in-closed-threads) overrides ``schedule_settings``
to turn the mode on::

    @pytest.fixture
    def schedule_settings():
        return Settings(wake_unloaded=True)

Without the entry point (``-p no:dsh_schedule``), ``pytest_plugins = ["dsh_schedule.testing"]``
in a ``conftest.py`` loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from dsh_schedule.runtime import EmbeddedRuntime
    from dsh_schedule.shared.settings import Settings


@pytest.fixture
def schedule_settings() -> Settings:
    """The tunables of ``schedule_runtime`` (the defaults); override it to change them."""
    from dsh_schedule.shared.settings import Settings

    return Settings()


@pytest.fixture
def schedule_runtime(tmp_path: Path, schedule_settings: Settings) -> Iterator[EmbeddedRuntime]:
    """A started ``EmbeddedRuntime`` on a ``ManualClock`` (it moves only by
    ``schedule_runtime.advance(seconds)``) with ``schedule_settings``, its sessions in the
    test's ``tmp_path``; closed at the end of the test."""
    # Imported here: loading the plugin loads neither Redis nor rq.
    from dsh_schedule.runtime import ManualClock, embedded_runtime

    with embedded_runtime(tmp_path / "sessions", settings=schedule_settings,
                          clock=ManualClock()) as runtime:
        yield runtime
