"""A delivery that fails (anything but a Redis or disk outage, which have their own
backoff) is retried with backoff, its failure logged once, and the stream that holds its
followup is not read again meanwhile (docs/architecture.md#hosts-followups-and-rebuild)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.gate import DELIVERY_RETRY_MAX_S
from dsh_schedule.shared.core.errors import EventOutOfBounds
from dsh_schedule.shared.core.events import USER_MESSAGE
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, new_session, reminder_messages


class RefusingDelivery(MemoryStore):
    """A store that refuses every reminder delivery while ``refusing`` is set, the way a
    line past the log's bound is refused, and counts the attempts."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = False
        self.attempts = 0

    def append(self, session_id: str, events: Sequence[Any], expected_seq: int) -> Any:
        if any(e.type == USER_MESSAGE and "source" in e.data for e in events):
            self.attempts += 1
            if self.refusing:
                raise EventOutOfBounds(USER_MESSAGE, "is longer than the bound")
        return super().append(session_id, events, expected_seq)


def test_a_failing_delivery_is_retried_with_backoff_and_logged_once(
    redis_client: redis.Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # given a reminder due whose delivery is refused
    clock = FakeClock()
    store = RefusingDelivery()
    system = EmbeddedSystem(store, settings, clock=clock, sleep=clock.advance,
                            client=redis_client, injected_clock=True)
    session = new_session(store)
    system.host.open_root(session)
    system.step()
    _d, handler = system.host.agents[session].tools["schedule_create"]
    assert not handler({"prompt": "stretch", "after_seconds": 60}).is_error
    store.refusing = True
    clock.advance(60)

    # when the host keeps serving for ten minutes, a step every 1.4 s
    with caplog.at_level(logging.DEBUG):
        for _ in range(430):
            system.step()
            clock.advance(1.4)

    # then the delivery was tried a bounded number of times, with one line for it
    assert 2 <= store.attempts <= 8
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING
                and "deliver" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert reminder_messages(store, session) == []

    # when the store takes deliveries again, the reminder is delivered within the backoff
    store.refusing = False
    for _ in range(int(DELIVERY_RETRY_MAX_S / 1.4) + 30):
        system.step()
        clock.advance(1.4)
    assert len(reminder_messages(store, session)) == 1
