"""Which reminders the log says were dispatched, and which were delivered
(docs/architecture.md#hosts-followups-and-rebuild).

The ledger replays the fork's own suffix once and can be continued with new events, so
the host's delivery gate and the worker's re-projection cost only the new tail. It keeps
what they ask about, not the log: the undelivered dispatch groups with the prompts their
frame shows, the group a batch may still continue, and the replay (the fold) itself.
Delivered groups are counted and forgotten. ``LedgerView`` is that answer frozen at one
length; the stores hand one out with every session they load (``Session.ledger``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from dsh_schedule.shared.core.errors import ScheduleLogError
from dsh_schedule.shared.core.events import SCHEDULE_CHANGE, USER_MESSAGE, Event, Session
from dsh_schedule.shared.core.records import decode_change
from dsh_schedule.shared.core.replay import FoldState, Replay

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


class Undelivered(msgspec.Struct, frozen=True, kw_only=True):
    """A dispatch group no delivered message covers, with the prompt of each of its
    records as dispatched (``prompts[i]`` belongs to ``group.pairs[i]``)."""

    group: DispatchGroup
    prompts: tuple[str, ...]


class LedgerView(msgspec.Struct, frozen=True, kw_only=True):
    """A ledger's answers at one log length: its undelivered groups, in log order.

    Plain data: two views of the same log at the same length are equal, and a view never
    changes when the log grows.
    """

    pending: tuple[Undelivered, ...] = ()

    def undelivered(self) -> list[DispatchGroup]:
        """Dispatch groups no delivered message covers, in log order."""
        return [u.group for u in self.pending]

    def deliverable(self, pairs: Iterable[Pair]) -> bool:
        """Whether ``pairs`` are exactly one undelivered dispatch group: the complete
        batch the log recorded, none of it delivered yet."""
        wanted = set(pairs)
        if not wanted:
            return False
        first = next(iter(wanted))
        for undelivered in self.pending:
            if first in undelivered.group.pairs:
                return set(undelivered.group.pairs) == wanted
        return False

    def prompts(self, group: DispatchGroup) -> tuple[str, ...] | None:
        """The prompts of ``group`` as dispatched; None when it is no undelivered group."""
        for undelivered in self.pending:
            if undelivered.group == group:
                return undelivered.prompts
        return None


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

    def undelivered(self) -> list[DispatchGroup]:
        """Dispatch groups no delivered message covers, in log order."""
        return self.view().undelivered()

    def deliverable(self, pairs: Iterable[Pair]) -> bool:
        """Whether ``pairs`` are exactly one undelivered dispatch group."""
        return self.view().deliverable(pairs)

    def _placed(self, number: int, group: DispatchGroup) -> None:
        """Hook: group ``number`` is now ``group`` (a batch's group grows in place)."""

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
        self._placed(number, grown.group)

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


class _History(Ledger):
    """A ledger that also remembers every group it placed."""

    def __init__(self, seed_length: int) -> None:
        super().__init__(seed_length)
        self.groups: dict[int, DispatchGroup] = {}

    def _placed(self, number: int, group: DispatchGroup) -> None:
        self.groups[number] = group


def dispatch_groups(events: Iterable[Event], seed_length: int) -> list[DispatchGroup]:
    """Every dispatch group of the events from ``seed_length`` on, delivered or not, in
    log order. ScheduleLogError at a record that does not replay."""
    history = _History(seed_length)
    history.extend(events)
    return [history.groups[n] for n in sorted(history.groups)]


class LedgerCache:
    """The ledger of each agent's session, for the delivery gate and re-projection.

    A session a store loaded carries its ledger (``Session.ledger``): that one is
    answered and nothing is kept here. For a session without one, one ledger per agent
    is continued, so each call reads only the new tail.
    """

    def __init__(self) -> None:
        self._ledgers: dict[str, Ledger] = {}
        self._lock = threading.Lock()

    def ledger(self, agent: str, session: Session) -> LedgerView:
        """The ledger of ``session``'s own suffix, at exactly its length."""
        with self._lock:
            if session.ledger is not None:
                self._ledgers.pop(agent, None)
                return session.ledger
            ledger = self._ledgers.get(agent)
            seed = session.seed_length
            if ledger is None or ledger.seed_length != seed or ledger.length > len(session.events):
                ledger = Ledger(seed)
            ledger.extend(session.events[ledger.length :])
            self._ledgers[agent] = ledger
            return ledger.view()

    def forget(self, agent: str) -> None:
        with self._lock:
            self._ledgers.pop(agent, None)
