"""The due transaction's batch (worker/due.py): where each agent stands (``Stage``, the
``Due`` and ``Planned`` records, ``WakeBatch``), and its check stage: read each going
agent's log (after a preflight flush and the re-projection of its lost followups) and
decide."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum

import msgspec

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.core.dispatch import DispatchPlan, pending_frame
from dsh_schedule.shared.core.due import DispatchBatch, DispatchOne, Wait, due_decision
from dsh_schedule.shared.core.errors import (
    PersistenceError,
    ScheduleLogError,
    outage_said,
)
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.ledger import LedgerView, Pair, ledger_of
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.transaction import (
    LogTransactions,
    Read,
)
from dsh_schedule.worker.outcome import WakeOutcome as WakeOutcome

log = logging.getLogger("dsh_schedule.worker.due")


class Stage(Enum):
    """Where a going agent's wake stands within its round; an agent whose wake ended is
    no longer going (``WakeBatch.outcomes`` says how it ended)."""

    CHECK = "check"  # to flush, read, re-project and decide
    RECHECK = "recheck"  # just dispatched past its barrier: read and decide (no flush)
    DUE = "due"  # a dispatch is due: claim, write, append
    APPENDED = "appended"  # the dispatch is in the log: the barrier flush confirms it


class Due(msgspec.Struct, frozen=True, kw_only=True):
    """An agent found due: the read it decided on, fenced at its length."""

    agent: str
    read: Read
    decision: DispatchOne | DispatchBatch
    decided_ms: int


class Planned(msgspec.Struct, frozen=True, kw_only=True):
    """A due agent's dispatch, framed and ready to write."""

    due: Due
    plan: DispatchPlan

    @property
    def agent(self) -> str:
        return self.due.agent


class WakeBatch:
    """Where each agent of a batch stands: going (at a ``Stage``) or ended (its
    outcome), the fold each settled agent re-arms from, and who is to be announced."""

    def __init__(self, agents: Sequence[str]) -> None:
        self.agents = list(agents)
        self.going: dict[str, Stage] = dict.fromkeys(agents, Stage.CHECK)
        self.outcomes: dict[str, WakeOutcome] = {}
        self.settled: dict[str, FoldState] = {}
        self.announce: set[str] = set()  # told of their followups once let go

    def at(self, stage: Stage) -> list[str]:
        return [agent for agent, at in self.going.items() if at is stage]

    def stop(self, agent: str, outcome: WakeOutcome) -> None:
        self.going.pop(agent, None)
        self.outcomes[agent] = outcome


class DueCheck:
    """The check stage of the due transactions of ``DueOwner``: read the log and decide."""

    def __init__(self, coordination: Coordination, transactions: LogTransactions,
                 settings: Settings, *, clock: Clock) -> None:
        self._coord = coordination
        self._tx = transactions
        self._settings = settings
        self._clock = clock

    def check(self, batch: WakeBatch) -> list[Due]:
        """Read and decide each going agent once: an agent that just dispatched past its
        barrier is read on this worker's own view of its log, the rest after a preflight
        flush and a re-projection of their lost followups. Returns the agents found due;
        the others are settled or stopped."""
        reads = self._reread(batch)
        checked = self._preflight(batch)
        self._reproject(checked, batch)
        reads.update((agent, read) for agent, (read, _ledger) in checked.items())
        now = self._clock()
        due: list[Due] = []
        for agent in list(batch.going):
            if (read := reads.get(agent)) is None:
                continue
            decision = due_decision(read.state, now)
            if isinstance(decision, Wait):
                batch.settled[agent] = read.state
                batch.stop(agent, WakeOutcome.SETTLED)
            else:
                batch.going[agent] = Stage.DUE
                due.append(Due(agent=agent, read=read, decision=decision, decided_ms=now))
        return due

    def _reread(self, batch: WakeBatch) -> dict[str, Read]:
        """The read after a dispatch whose barrier flush just succeeded, the agent's lock
        still held. No second preflight flush and no re-projection: the barrier confirmed
        this worker's bytes, the followups were written just before them, and only
        ``schedule/change`` records, appended under the lock this worker holds, change
        the decision. An agent whose log cannot be read now gets the full check."""
        reads: dict[str, Read] = {}
        for agent, read in self._tx.load(batch.at(Stage.RECHECK)).items():
            if isinstance(read, Read):
                reads[agent] = read
            elif isinstance(read, (PersistenceError, ScheduleLogError)):
                batch.going[agent] = Stage.CHECK
            else:
                raise read
        return reads

    def _preflight(self, batch: WakeBatch) -> dict[str, tuple[Read, LedgerView]]:
        """The flushed log of each agent to check, and its ledger (what it dispatched and
        has not delivered), the flushes together; a failure stops its agent alone."""
        checked: dict[str, tuple[Read, LedgerView]] = {}
        for agent, read in self._tx.preflight(batch.at(Stage.CHECK)).items():
            with log_context(agent=agent):
                outcome = self._unread(agent, read)
                if outcome is None:
                    assert isinstance(read, Read)
                    try:
                        checked[agent] = (read, ledger_of(read.session))
                    except ScheduleLogError as exc:
                        log.error("cannot re-project followups for %s: %s", agent, exc)
                        outcome = WakeOutcome.CORRUPT_LOG
                    except Exception:
                        log.exception("wake for %s failed", agent)  # spares the rest
                        outcome = WakeOutcome.FAILED
            if outcome is not None:
                batch.stop(agent, outcome)
        return checked

    @staticmethod
    def _unread(agent: str, read: Read | Exception) -> WakeOutcome | None:
        """How a failed preflight ends the agent's wake (None: it read)."""
        if isinstance(read, PersistenceError):
            log.log(failure_level(read), "due preflight for %s failed: %s", agent, read.reason)
            return WakeOutcome.PREFLIGHT_FAILED
        if isinstance(read, ScheduleLogError):
            log.error("corrupt schedule log for %s, arming nothing: %s", agent, read)
            return WakeOutcome.CORRUPT_LOG
        if isinstance(read, Exception):
            log.error("wake for %s failed", agent, exc_info=read)  # spares the rest
            return WakeOutcome.FAILED
        return None

    def _reproject(self, checked: dict[str, tuple[Read, LedgerView]], batch: WakeBatch) -> None:
        """Re-add every lost followup of these agents
        (docs/architecture.md#hosts-followups-and-rebuild): a dispatch in the agent's own
        suffix that no delivered message covers and no stream entry holds gets its
        followup re-added, rendered from the prompts the ledger kept of it by the same
        renderer a dispatch uses, so it is byte-identical to the original frame. One
        pipelined read of the streams of the agents with an undelivered dispatch, one
        script call writing what is missing, unannounced: an agent with an undelivered
        dispatch is announced once let go (a host may have missed it, as when a worker
        died before announcing)."""
        undelivered = [(agent, ledger, missing) for agent, (_read, ledger) in checked.items()
                       if (missing := ledger.undelivered())]
        if not undelivered:
            return
        streams = self._coord.followup_entries([a for a, _l, _m in undelivered])
        lost: list[tuple[str, str, Sequence[Pair]]] = []
        for (agent, ledger, missing), entries in zip(undelivered, streams, strict=True):
            batch.announce.add(agent)
            held: set[Pair] = {p for entry in entries for p in entry.pairs}
            added = [(agent, pending_frame(ledger, group), group.pairs)
                     for group in missing if not any(p in held for p in group.pairs)]
            if added:
                metrics.get().delivery("reprojected", len(added))
                log.info("re-projected %d lost followup(s) for %s", len(added), agent)
            lost.extend(added)
        self._coord.write_followups(lost)


def failure_level(exc: BaseException, level: int = logging.WARNING) -> int:
    """A wake's store failure is said per agent, unless the store said its outage."""
    return logging.DEBUG if outage_said(exc) else level
