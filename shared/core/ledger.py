"""Which reminders the log says were dispatched, and which were delivered
(docs/architecture.md#hosts-followups-and-rebuild).

The ledger replays the fork's own suffix once and can be continued with new events, so
the host's delivery gate and the worker's re-projection cost only the new tail.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, Event, Session
from dsh_schedule.shared.core.records import decode_change
from dsh_schedule.shared.core.replay import Replay

SOURCE_PLUGIN: Final = "tool-schedule"


class Pair(msgspec.Struct, frozen=True, kw_only=True):
    """One delivered occurrence: which reminder, and which of its occurrences."""

    scheduleId: str
    occurrenceAt: str


class DispatchGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Dispatches delivered as one message: a one-shot alone, or one recurring batch.

    ``accepted_at`` is the batch's ``acceptedAt``; None for a one-shot.
    """

    seqs: tuple[int, ...]
    pairs: tuple[Pair, ...]
    accepted_at: str | None = None


def reminder_source(pairs: Iterable[Pair]) -> dict[str, Any]:
    """The ``source`` of the ``user/message`` that delivers a reminder followup."""
    return {
        "kind": "plugin",
        "plugin": SOURCE_PLUGIN,
        "reminders": [msgspec.to_builtins(p) for p in pairs],
    }


class Ledger:
    """Dispatched and delivered pairs of one session's own suffix."""

    def __init__(self, seed_length: int) -> None:
        self.seed_length = seed_length
        self.length = seed_length
        self.groups: list[DispatchGroup] = []
        self._group_of: dict[Pair, int] = {}
        self._pending: set[int] = set()
        self._replay = Replay()
        self._batch_at: str | None = None

    def extend(self, events: Iterable[Event]) -> Ledger:
        """Continue with events after ``self.length`` (already valid by the store's fold)."""
        for event in events:
            if event.seq < self.length:
                continue
            self.length = event.seq + 1
            if event.type == SCHEDULE_CHANGE:
                try:
                    self._change(event)
                except ScheduleLogError as exc:
                    raise ScheduleLogError(exc.reason, seq=event.seq) from None
            elif event.type == USER_MESSAGE:
                self._message(event.data)
        return self

    def undelivered(self) -> list[DispatchGroup]:
        """Dispatch groups no delivered message covers, in log order."""
        return [self.groups[i] for i in sorted(self._pending)]

    def deliverable(self, pairs: Iterable[Pair]) -> bool:
        """Whether ``pairs`` are exactly one undelivered dispatch group: the complete
        batch the log recorded, none of it delivered yet."""
        wanted = set(pairs)
        index = self._group_of.get(next(iter(wanted))) if wanted else None
        if index is None or index not in self._pending:
            return False
        return set(self.groups[index].pairs) == wanted

    def _change(self, event: Event) -> None:
        delivery = self._replay.apply(decode_change(event.data))
        if delivery is None:
            self._batch_at = None
            return
        pair = Pair(scheduleId=delivery.record.id, occurrenceAt=delivery.occurrence_at)
        self._add(event.seq, pair, delivery.accepted_at)

    def _add(self, seq: int, pair: Pair, batch: str | None) -> None:
        if batch is not None and batch == self._batch_at and self.groups:
            last = self.groups[-1]
            self.groups[-1] = DispatchGroup(
                seqs=(*last.seqs, seq), pairs=(*last.pairs, pair), accepted_at=batch
            )
        else:
            self.groups.append(DispatchGroup(seqs=(seq,), pairs=(pair,), accepted_at=batch))
            self._pending.add(len(self.groups) - 1)
        self._group_of[pair] = len(self.groups) - 1
        self._batch_at = batch

    def _message(self, data: Any) -> None:
        source = data.get("source") if isinstance(data, dict) else None
        if not isinstance(source, dict) or source.get("plugin") != SOURCE_PLUGIN:
            return
        for item in source.get("reminders") or []:
            try:
                pair = msgspec.convert(item, type=Pair)
            except msgspec.ValidationError:
                continue
            index = self._group_of.get(pair)
            if index is not None:
                self._pending.discard(index)


class LedgerCache:
    """One continued ledger per agent, so each wake reads only the new tail."""

    def __init__(self) -> None:
        self._ledgers: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def ledger(self, agent: str, session: Session) -> Ledger:
        with self._lock:
            ledger = self._ledgers.get(agent)
            seed = session.seed_length
            if ledger is None or ledger.seed_length != seed or ledger.length > len(session.events):
                ledger = Ledger(seed)
            ledger.extend(session.events[ledger.length :])
            self._ledgers[agent] = ledger
            return ledger

    def forget(self, agent: str) -> None:
        with self._lock:
            self._ledgers.pop(agent, None)
