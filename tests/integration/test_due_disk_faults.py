"""A failure of the disk (or anything else) for one agent at its due moment is owed a
retry with backoff, so the reminders are delivered once the disk recovers, with no tool
call (docs/architecture.md#owed-re-arms)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.worker.outcome import WakeOutcome
from dsh_schedule.worker.retry import RETRY_FIRST_S, RETRY_MAX_S
from tests.support import FakeClock, dispatch_records, new_session, reminder_messages


class FailingDisk(MemoryStore):
    """A store whose ``failing`` operation raises while ``broken`` is set: a disk error
    (``OSError(code)`` as a ``PersistenceError``), or anything unexpected."""

    def __init__(self, failing: str, code: int | None) -> None:
        super().__init__()
        self.failing, self.code, self.broken = failing, code, False

    def _fault(self, operation: str) -> None:
        if not self.broken or operation != self.failing:
            return
        if self.code is None:
            raise RuntimeError("unexpected")
        try:
            raise OSError(self.code, os.strerror(self.code))
        except OSError as exc:
            raise PersistenceError(f"{operation} failed") from exc

    def flush(self, session_id: str) -> None:
        self._fault("flush")
        super().flush(session_id)

    def append(self, session_id: str, events: Sequence[Any], expected_seq: int) -> Any:
        if any(getattr(e, "type", "") == "schedule/change" for e in events):
            self._fault("append")  # the dispatch; the host's own writes go through
        return super().append(session_id, events, expected_seq)


CASES = [
    pytest.param("flush", errno.EIO, WakeOutcome.PREFLIGHT_FAILED, id="preflight-EIO"),
    pytest.param("flush", errno.EACCES, WakeOutcome.PREFLIGHT_FAILED, id="preflight-EACCES"),
    pytest.param("append", errno.EIO, WakeOutcome.DISPATCH_ABANDONED, id="append-EIO"),
    pytest.param("append", errno.EACCES, WakeOutcome.DISPATCH_ABANDONED, id="append-EACCES"),
    pytest.param("flush", None, WakeOutcome.FAILED, id="unexpected"),
]


@pytest.mark.parametrize(("failing", "code", "outcome"), CASES)
def test_reminders_due_while_the_disk_fails_are_delivered_once_it_recovers(
    redis_client: redis.Redis, settings: Settings, failing: str, code: int | None,
    outcome: WakeOutcome,
) -> None:
    # given two sessions with reminders due in 60 s
    clock = FakeClock()
    store = FailingDisk(failing, code)
    system = EmbeddedSystem(store, settings, clock=clock, sleep=clock.advance,
                            client=redis_client, injected_clock=True)
    sessions = [new_session(store, f"s{n}") for n in range(2)]
    for session in sessions:
        system.host.open_root(session)
    system.step()
    for session in sessions:
        for n in range(3):
            _d, handler = system.host.agents[session].tools["schedule_create"]
            assert not handler({"prompt": f"r{n}", "after_seconds": 60}).is_error
    clock.advance(60)
    system.host.plugin.renew_leases()

    # when the disk fails at the due moment
    store.broken = True
    outcomes = system.owner.wake([(session, clock()) for session in sessions])

    # then the wakes fail, and the worker owes each agent a retry with backoff
    assert outcomes == dict.fromkeys(sessions, outcome)
    assert sorted(system.owner.owed.owed()) == sessions
    assert system.owner.repay_owed() == []  # not before its backoff
    clock.advance(RETRY_FIRST_S)
    assert sorted(system.owner.repay_owed()) == sessions
    system.step()  # still failing: owed again, later
    assert sorted(system.owner.owed.owed()) == sessions
    clock.advance(RETRY_FIRST_S)
    assert system.owner.repay_owed() == []

    # when the disk recovers, the worker's beat repays the owed wakes
    store.broken = False
    clock.advance(RETRY_MAX_S)
    system.host.plugin.renew_leases()
    assert sorted(system.owner.repay_owed()) == sessions
    for _ in range(4):
        system.step()

    # then every reminder is delivered once, with no tool call
    for session in sessions:
        assert len(dispatch_records(store, session)) == 3
        assert len(reminder_messages(store, session)) == 3
    assert system.owner.owed.owed() == []
