"""Which reminders the log says were dispatched, and which were delivered
(docs/architecture.md#hosts-followups-and-rebuild).

The ledger replays the fork's own suffix once and can be continued with new events, so
the host's delivery gate and the worker's re-projection cost only the new tail. It keeps
what they ask about, not the log: the undelivered dispatch groups with the prompts their
frame shows, the group a batch may still continue, and the replay (the fold) itself.
Delivered groups are counted and forgotten. ``LedgerView`` (``delivered``) is that answer
frozen at one length; the stores hand one out with every session they load
(``Session.ledger``), and ``ledger_of`` replays one for a session without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.delivered import DispatchGroup as DispatchGroup
from dsh_schedule.shared.core.delivered import LedgerView as LedgerView
from dsh_schedule.shared.core.delivered import Pair as Pair
from dsh_schedule.shared.core.delivered import Undelivered as Undelivered
from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, Event, Session
from dsh_schedule.shared.core.records import decode_change
from dsh_schedule.shared.core.replay import FoldState, Replay

SOURCE_PLUGIN: Final = "tool-schedule"


def reminder_source(pairs: Iterable[Pair]) -> dict[str, Any]:
    """The ``source`` of the ``user/message`` that delivers a reminder followup."""
    return {
        "kind": "plugin",
        "plugin": SOURCE_PLUGIN,
        "reminders": [msgspec.to_builtins(p) for p in pairs],
    }


class Ledger:
    """Dispatched and delivered pairs of one session's own suffix, continued as it grows.

    Mutable and not thread-safe. Its size follows the schedule state (active records,
    ids created, undelivered groups), never the number of events it has read.
    """

    def __init__(self, seed_length: int) -> None:
        self.seed_length = seed_length
        self.length = seed_length
        self.dispatched = 0  # dispatch groups so far, delivered ones included
        self._last: Undelivered | None = None  # the newest group: a batch may continue it
        self._pending: dict[int, Undelivered] = {}  # by group number, in log order
        self._group_of: dict[Pair, int] = {}  # the pairs of pending groups only
        self._replay = Replay()
        self._batch_at: str | None = None
        self._state: FoldState | None = None
        self._view: LedgerView | None = None

    def extend(self, events: Iterable[Event]) -> Ledger:
        """Continue with events after ``self.length`` (already valid by the store's fold).

        ScheduleLogError, carrying the event's ``seq``, at a record that does not replay;
        the ledger then holds everything before it.
        """
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

    def state(self) -> FoldState:
        """The fold of the events read so far: the ledger replays exactly what the fold
        does, through the same rules."""
        if self._state is None:
            self._state = self._replay.state()
        return self._state

    def view(self) -> LedgerView:
        """The ledger's answers as of now, frozen."""
        if self._view is None:
            self._view = LedgerView(pending=tuple(self._pending.values()))
        return self._view

    def _change(self, event: Event) -> None:
        delivery = self._replay.apply(decode_change(event.data))
        self._state = None
        if delivery is None:
            self._batch_at = None
            return
        pair = Pair(scheduleId=delivery.record.id, occurrenceAt=delivery.occurrence_at)
        self._add(event.seq, pair, delivery.record.prompt, delivery.accepted_at)

    def _add(self, seq: int, pair: Pair, prompt: str, batch: str | None) -> None:
        last = self._last
        if batch is not None and batch == self._batch_at and last is not None:
            number = self.dispatched - 1
            group = DispatchGroup(
                seqs=(*last.group.seqs, seq), pairs=(*last.group.pairs, pair), accepted_at=batch
            )
            grown = Undelivered(group=group, prompts=(*last.prompts, prompt))
            if number in self._pending:
                self._pending[number] = grown
                self._group_of[pair] = number
            # else: the batch's group was already delivered; its late member stays covered.
        else:
            number = self.dispatched
            self.dispatched += 1
            grown = Undelivered(
                group=DispatchGroup(seqs=(seq,), pairs=(pair,), accepted_at=batch),
                prompts=(prompt,),
            )
            self._pending[number] = grown
            self._group_of[pair] = number
        self._last = grown
        self._batch_at = batch
        self._view = None

    def _message(self, data: Any) -> None:
        # Any other host's message may land here: odd shapes cover nothing, never raise.
        source = data.get("source") if isinstance(data, dict) else None
        if not isinstance(source, dict) or source.get("plugin") != SOURCE_PLUGIN:
            return
        reminders = source.get("reminders")
        if not isinstance(reminders, list):
            return
        for item in reminders:
            try:
                pair = msgspec.convert(item, type=Pair)
            except msgspec.ValidationError:
                continue
            number = self._group_of.get(pair)
            if number is not None:
                self._deliver(number)

    def _deliver(self, number: int) -> None:
        covered = self._pending.pop(number)
        for pair in covered.group.pairs:
            self._group_of.pop(pair, None)
        self._view = None


def ledger_of(session: Session) -> LedgerView:
    """The ledger of ``session``'s own suffix, at exactly its length: the one its store
    kept (``Session.ledger``), else replayed from its events. ScheduleLogError at a
    record that does not replay."""
    if session.ledger is not None:
        return session.ledger
    ledger = Ledger(session.seed_length)
    ledger.extend(session.events)
    return ledger.view()
