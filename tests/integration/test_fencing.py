"""A holder whose lock expired while it was paused cannot slip in a stale decision.

The per-agent lock has a TTL; the append's expected-length fence is what protects the
log (docs/architecture.md#session-logs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import msgspec
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, Event, NewEvent
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from tests.support import FakeClock, dispatch_records, new_session, reminder_messages, value


class PausingStore(MemoryStore):
    """Pauses the first append of a given operation until released."""

    def __init__(self, operation: str) -> None:
        super().__init__()
        self.operation = operation
        self.paused = threading.Event()
        self.resume = threading.Event()
        self.conflicts = 0

    def append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[Event, ...]:
        ours = any(e.type == SCHEDULE_CHANGE and e.data["operation"] == self.operation
                   for e in events)
        if ours and not self.paused.is_set() and threading.current_thread().name == "paused":
            self.paused.set()
            self.resume.wait(10)
        try:
            return super().append(session_id, events, expected_seq)
        except Exception:
            self.conflicts += 1
            raise


def _short_lock(settings: Settings) -> Settings:
    return msgspec.structs.replace(
        settings, lock_ttl_s=0.3, maintenance_ttl_s=0.3, tool_lock_wait_s=2.0
    )


def test_expired_tool_holder_is_refused_and_re_decides(
    redis_client: redis.Redis, settings: Settings
) -> None:
    store = PausingStore("create")
    session = new_session(store)
    clock = FakeClock()
    quick = _short_lock(settings)
    tools = ScheduleTools(store, Coordination(redis_client, quick), quick, clock)
    results: list[str] = []
    paused = threading.Thread(
        name="paused",
        target=lambda: results.append(
            tools.call(session, "schedule_create", {"prompt": "slow", "after_seconds": 60}).content
        ),
    )
    paused.start()
    assert store.paused.wait(5)
    time.sleep(0.4)  # the paused holder's lock expires
    fast = tools.call(session, "schedule_create", {"prompt": "fast", "after_seconds": 60})
    store.resume.set()
    paused.join()
    assert value(fast.content)["id"] == "schedule-1"
    assert value(results[0])["id"] == "schedule-2"
    assert store.conflicts == 1
    state = fold(store.read(session).events)
    assert [(r.id, r.prompt) for r in state.active] == [
        ("schedule-1", "fast"), ("schedule-2", "slow")
    ]


def test_expired_worker_cannot_deliver_and_the_reminder_arrives_once(
    redis_client: redis.Redis, settings: Settings
) -> None:
    store = PausingStore("dispatch")
    clock = FakeClock()
    system = EmbeddedSystem(store, _short_lock(settings), clock=clock, sleep=clock.advance,
                            client=redis_client, injected_clock=True)
    session = new_session(store)
    system.host.open_root(session)
    _d, create = system.host.agents[session].tools["schedule_create"]
    create({"prompt": "x", "after_seconds": 2})
    clock.advance(3)
    paused = threading.Thread(name="paused", target=system.owner.wake,
                              args=([(session, None)],))
    paused.start()
    assert store.paused.wait(5)
    time.sleep(0.4)  # the paused worker's lock expires; the next wake goes ahead
    system.owner.wake([(session, None)])[session]
    store.resume.set()
    paused.join()
    for _ in range(3):
        system.step()
    dispatches = dispatch_records(store, session)
    delivered = reminder_messages(store, session)
    assert len(dispatches) == 1
    assert len(delivered) == 1
    assert store.conflicts == 1
    assert system.coordination.followups.waiting(session) == 0
