"""The PostgreSQL session store's appends and their durability (shared/store/postgres.py):
the append statement, ``flush_many`` (one synchronous commit for a batch), the appends
of unknown outcome resolved, and the appends a crashed server lost committed again at
the same fence."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg import errors as pg_errors

from dsh_schedule.shared.core.due import next_due_moment_ms
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.events import Event, NewEvent
from dsh_schedule.shared.core.fold import check_candidate
from dsh_schedule.shared.store.codec import encode_event, number_events
from dsh_schedule.shared.store.foldcache import touches_schedule
from dsh_schedule.shared.store.port import missing_session
from dsh_schedule.shared.store.postgres_cache import SessionEntry
from dsh_schedule.shared.store.postgres_outage import Unconfirmed, Unflushed, connection_lost
from dsh_schedule.shared.store.postgres_reading import PostgresReading
from dsh_schedule.shared.store.postgres_schema import (
    APPEND,
    APPEND_MANY,
    EVENTS,
    SESSIONS,
    row_key,
)

logger = logging.getLogger("dsh_schedule.shared.store.postgres")

_T = TypeVar("_T")

# What makes a flush's synchronous commit wait for the server's disk: a transactional
# message in its log (any wal_level, any role; a logical decoder sees an empty message
# with this prefix).
FLUSH_MARK = ("SELECT set_config('synchronous_commit', 'on', true), "
              "pg_logical_emit_message(true, 'dsh-schedule-flush', '')")


class _Prepared(NamedTuple):
    """One session's append, checked against its entry and ready for the statement."""

    session_id: str
    token: int
    expected: int
    candidates: tuple[Event, ...]
    lines: list[bytes]
    schedule: bool
    due: int | None


class PostgresAppending(PostgresReading):
    """Appending to the sessions of a ``PostgresStore`` and making the appends durable."""

    def _settle(self, session_id: str) -> None:
        """Resolve this store's append of unknown outcome to the session, if any, before
        the log is read or appended to: a log read without it, or an append fenced past
        it, would leave it behind (``_confirm``; ``PersistenceError`` while it cannot)."""
        if not self._unconfirmed and not self._unflushed:  # without the lock
            return
        with self._unconfirmed_lock:
            pending = self._unconfirmed.get(session_id)
            kept = self._unflushed.get(session_id)
        if pending is not None:
            self._confirm(session_id, row_key(session_id), pending)
        elif kept is not None and kept.epoch != self._reach.epoch:
            # The server failed since: find out now whether it kept them (and commit them
            # again at the same fence if it did not), before the log moves on without them.
            failure = self.flush_many([session_id]).get(session_id)
            if failure is not None:
                raise failure

    def append_durably(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int
    ) -> tuple[tuple[Event, ...], PersistenceError | None]:
        """``append`` then ``flush`` of the session (``port.AppendsDurably``): the
        append's statement commits synchronously, so the flush after it has nothing left
        to make durable and sends nothing, unless an earlier append of this store to the
        session awaits its flush (then it is checked as ``flush`` checks it). The events
        appended (raising as ``append``), and the flush's failure (None: durable)."""
        self._settle(session_id)
        appended = self._append(session_id, events, expected_seq, durable=True)
        return appended, self.flush_many([session_id]).get(session_id)

    def _append(
        self, session_id: str, events: Sequence[NewEvent], expected_seq: int, *,
        durable: bool = False,
    ) -> tuple[Event, ...]:
        key = row_key(session_id)
        for attempt in range(2):
            entry = self._entry_at(session_id, expected_seq)
            with entry.lock:
                prepared = self._prepare(session_id, entry, events, expected_seq)
                if not prepared.candidates:
                    return ()
                candidates, lines = prepared.candidates, prepared.lines
                params = {
                    "id": key, "token": entry.token, "expected": expected_seq,
                    "length": expected_seq + len(candidates), "schedule": prepared.schedule,
                    "due": prepared.due, "seqs": [e.seq for e in candidates], "lines": lines,
                    "durable": durable,
                }
                written = self._write_append(session_id, params, entry.token, candidates, lines)
                if written == len(candidates):
                    self._appended(entry, prepared, durable=durable)
                    return candidates
                if written < 0:
                    return candidates  # unknown outcome: kept unconfirmed, flush tells
            # Nothing written: the length moved (or the row was made again) since the entry
            # was caught up; catch up once more and fence against that.
            self._cache.drop(session_id)
            if attempt:
                break
        entry = self._entry_at(session_id, expected_seq)
        raise FenceConflict(expected_seq, entry.length)

    def _prepare(self, session_id: str, entry: SessionEntry, events: Sequence[NewEvent],
                 expected_seq: int) -> _Prepared:
        """The append of ``events`` at ``expected_seq``, checked against the session's
        entry (its lock held): ``FenceConflict`` when the entry stands elsewhere, the
        ``schedule/change`` invariant checked (``ScheduleLogError``) and the next due
        moment derived for the index."""
        if entry.length != expected_seq:
            raise FenceConflict(expected_seq, entry.length)
        candidates = number_events(events, expected_seq)
        lines = [encode_event(e)[:-1] for e in candidates]
        schedule = bool(candidates) and touches_schedule(candidates)
        due = None
        if schedule:
            due = next_due_moment_ms(check_candidate(entry.digest.fold(), candidates))
        return _Prepared(session_id, entry.token, expected_seq, candidates, lines, schedule,
                         due)

    def _appended(self, entry: SessionEntry, prepared: _Prepared, *, durable: bool) -> None:
        """Note a committed append (the entry's lock held): kept for the flush to check
        unless committed synchronously, and fed to the entry."""
        session_id, candidates, lines = prepared.session_id, prepared.candidates, prepared.lines
        with self._unconfirmed_lock:
            kept = self._unflushed.get(session_id)
            # Committed synchronously: durable, and so is every commit before it (the
            # server's log is one sequence); earlier appends of this store to the session
            # are still checked by the flush.
            if not durable or kept is not None:
                self._unflushed[session_id] = Unflushed.after(
                    kept, prepared.token, candidates, lines, self._reach.epoch)
        entry.feed(candidates, [len(line) + 1 for line in lines], lines[-1])
        self._cache.settle(session_id, entry)

    def append_many(
        self, items: Sequence[tuple[str, Sequence[NewEvent], int]]
    ) -> dict[str, tuple[Event, ...] | Exception]:
        """``append`` for many sessions (``many.AppendsMany``), each fenced at its own
        length, in one statement: each one's events appended, or what failed for it alone
        (``FenceConflict``, a ``ScheduleLogError``, a ``PersistenceError``). A session
        whose fence did not hold in the statement is tried again alone, as ``append``
        tries; so is every one when the server refused the statement itself. One whose
        reply was lost leaves every append in it unconfirmed, as ``append`` does."""
        results: dict[str, tuple[Event, ...] | Exception] = {}
        ready: list[tuple[SessionEntry, _Prepared, Sequence[NewEvent]]] = []
        if len({session_id for session_id, _, _ in items}) != len(items):
            raise ValueError("a session is appended to twice in one batch")
        for session_id, events, expected_seq in items:
            try:
                self._settle(session_id)
                entry = self._entry_at(session_id, expected_seq)
                with entry.lock:
                    prepared = self._prepare(session_id, entry, events, expected_seq)
            except Exception as exc:  # that session's alone
                results[session_id] = exc
                continue
            if not prepared.candidates:
                results[session_id] = ()
            else:
                ready.append((entry, prepared, events))
        if len(ready) <= 1:
            for _entry, prepared, events in ready:
                results[prepared.session_id] = self._one(prepared.session_id, events,
                                                         prepared.expected)
            return results
        try:
            fenced = self._write_many([prepared for _, prepared, _ in ready])
        except PersistenceError as exc:
            if exc.errno is not None:  # an outage: nothing was written
                results.update((prepared.session_id, exc) for _, prepared, _ in ready)
                return results
            fenced = set()  # the statement was refused: each one alone
        if fenced is None:  # unknown outcome: kept unconfirmed, flush tells
            results.update((p.session_id, p.candidates) for _, p, _ in ready)
            return results
        for entry, prepared, events in ready:
            session_id = prepared.session_id
            if row_key(session_id) not in fenced:
                self._cache.drop(session_id)  # the log moved, or the statement was refused
                results[session_id] = self._one(session_id, events, prepared.expected)
                continue
            with entry.lock:
                if entry.length == prepared.expected and entry.token == prepared.token:
                    self._appended(entry, prepared, durable=False)
                else:  # fed meanwhile by another thread: read again when next asked
                    self._cache.drop(session_id)
                    with self._unconfirmed_lock:
                        self._unflushed[session_id] = Unflushed.after(
                            self._unflushed.get(session_id), prepared.token,
                            prepared.candidates, prepared.lines, self._reach.epoch)
            results[session_id] = prepared.candidates
        return results

    def _one(self, session_id: str, events: Sequence[NewEvent], expected_seq: int
             ) -> tuple[Event, ...] | Exception:
        try:
            return self._append(session_id, events, expected_seq)
        except Exception as exc:  # that session's alone
            return exc

    def _write_many(self, prepared: Sequence[_Prepared]) -> set[str] | None:
        """The statement appending ``prepared``: the row keys of the sessions whose fence
        held, or None when its outcome is unknown (each append recorded for ``flush``)."""
        params: dict[str, Any] = {
            "ids": [], "tokens": [], "expected": [], "lengths": [], "schedule": [], "due": [],
            "line_ids": [], "seqs": [], "lines": []}
        for p in prepared:
            key = row_key(p.session_id)
            params["ids"].append(key)
            params["tokens"].append(p.token)
            params["expected"].append(p.expected)
            params["lengths"].append(p.expected + len(p.candidates))
            params["schedule"].append(p.schedule)
            params["due"].append(p.due)
            params["line_ids"].extend([key] * len(p.candidates))
            params["seqs"].extend(e.seq for e in p.candidates)
            params["lines"].extend(p.lines)
        fenced = self._sent(f"append to {len(prepared)} sessions",
                            lambda conn: set(self._execute_append_many(conn, params)))
        if fenced is not None:
            return fenced
        for p in prepared:
            self._cache.drop(p.session_id)
            with self._unconfirmed_lock:
                self._unconfirmed[p.session_id] = Unconfirmed(p.token, p.candidates, p.lines)
        logger.warning("append to %d sessions: outcome unknown, the connection was lost "
                       "after the statement was sent", len(prepared))
        return None

    def flush_many(self, session_ids: Sequence[str], *, again: bool = True
                   ) -> dict[str, PersistenceError]:
        """``flush`` for many sessions, the failures by session: the appends of unknown
        outcome resolved one by one, then one synchronously committed transaction for
        all the rest, which makes every earlier commit durable (the server's log is one
        sequence) and checks that each session still holds this store's last append to it
        (a server that crashed before its log reached the disk lost it: appended again
        at the same fence when the log has not moved on since, ``again``) and that the
        sessions not cached exist. No query when nothing was appended or looked up."""
        failed: dict[str, PersistenceError] = {}
        ids = list(dict.fromkeys(session_ids))
        for session_id in ids:
            row_key(session_id)
            with self._unconfirmed_lock:
                pending = self._unconfirmed.get(session_id)
            if pending is not None:
                try:
                    self._confirm(session_id, row_key(session_id), pending)
                except PersistenceError as exc:
                    failed[session_id] = exc
        rest = [session_id for session_id in ids if session_id not in failed]
        for session_id in rest:
            try:
                self._flush_primitive(session_id)
            except PersistenceError as exc:
                failed[session_id] = exc
        rest = [session_id for session_id in rest if session_id not in failed]
        with self._unconfirmed_lock:
            appended = {sid: self._unflushed[sid] for sid in rest if sid in self._unflushed}
        unknown = [sid for sid in rest if sid not in appended and self._cache.get(sid) is None]
        if not appended and not unknown:
            return failed
        try:
            found, lines = self._sync(unknown, appended)
        except PersistenceError as exc:
            failed.update((sid, exc) for sid in [*appended, *unknown])
            return failed
        for session_id in unknown:
            if session_id not in found:
                failed[session_id] = missing_session(session_id)
        for session_id, record in appended.items():
            with self._unconfirmed_lock:
                if self._unflushed.get(session_id) is record:
                    del self._unflushed[session_id]
            token, line, length = lines.get(session_id, (None, None, None))
            if (token, line) == (record.token, record.lines[-1]):
                continue
            self._cache.drop(session_id)
            stop = record.first + len(record.events)
            if again and token == record.token and length is not None and \
                    record.first <= length < stop:
                failure = self._append_again(session_id, record, length)
                if failure is None:
                    continue
            failed[session_id] = PersistenceError(
                f"session {session_id!r} lost appended events (the server lost commits "
                "that had not reached its disk)")
        return failed

    def _append_again(self, session_id: str, record: Unflushed, length: int
                      ) -> PersistenceError | None:
        """Append the lines a crashed server lost at the fence they had, and flush them:
        those from ``length`` on, once the server holds the ones before as they were (a
        later synchronous commit of another session made those durable)."""
        kept = length - record.first
        try:
            with self._connection(f"read session {session_id!r}") as conn:
                found = [bytes(r[0]) for r in conn.execute(
                    f"SELECT line FROM {EVENTS} WHERE session_id = %s AND seq >= %s AND "
                    "seq < %s ORDER BY seq", (row_key(session_id), record.first, length))]
            if found != record.lines[:kept]:
                raise PersistenceError("the log holds other lines")
            self._append(session_id, [NewEvent(type=e.type, time=e.time, data=e.data)
                                      for e in record.events[kept:]], length)
        except (FenceConflict, ScheduleLogError, PersistenceError) as exc:
            return PersistenceError(f"session {session_id!r}: {exc}")
        logger.warning("session %r: appended again the %d event(s) the server lost in a "
                       "crash", session_id, len(record.events) - kept)
        return self.flush_many([session_id], again=False).get(session_id)

    def _sync(self, unknown: list[str], appended: dict[str, Unflushed]
              ) -> tuple[set[str], dict[str, tuple[int, bytes | None, int]]]:
        """One synchronously committed transaction: the ids of ``unknown`` that exist, and
        for each of ``appended`` its row token, the line at its last recorded seq (None:
        none) and its length."""
        keys = {row_key(sid): sid for sid in unknown}
        wanted = {row_key(sid): (sid, record.first + len(record.events) - 1)
                  for sid, record in appended.items()}
        exists = f"SELECT id FROM {SESSIONS} WHERE id = ANY(%s)"
        lines: dict[str, tuple[int, bytes | None, int]] = {}
        with self._connection("confirm sessions durable", writes=bool(wanted)) as conn:
            if not wanted:  # nothing to make durable: existence alone, one statement
                return {keys[row[0]] for row in conn.execute(exists, (list(keys),))}, lines
            with conn.transaction():
                # Synchronously committed, with a record of its own in the server's log: a
                # transaction that wrote none (an id alone, txid_current()) commits without
                # waiting for the disk whatever synchronous_commit says.
                conn.execute(FLUSH_MARK)
                found = {keys[row[0]] for row in conn.execute(exists, (list(keys),))} \
                    if keys else set()
                rows = conn.execute(
                    f"SELECT w.id, s.token, e.line, s.length "
                    f"FROM unnest(%s::text[], %s::bigint[]) "
                    f"AS w (id, seq) JOIN {SESSIONS} s ON s.id = w.id LEFT JOIN {EVENTS} e "
                    "ON e.session_id = w.id AND e.seq = w.seq",
                    (list(wanted), [seq for _, seq in wanted.values()])).fetchall()
                for key, token, line, length in rows:
                    lines[wanted[key][0]] = (int(token), None if line is None else bytes(line),
                                             int(length))
        return found, lines

    # -- overridable primitives (tests inject faults here) --------------------------------

    def _execute_append(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> int:
        """Run the append statement; the number of lines it inserted."""
        return conn.execute(APPEND, params).rowcount

    def _execute_append_many(self, conn: psycopg.Connection[Any], params: dict[str, Any]
                             ) -> list[str]:
        """Run the statement appending to many sessions; the row key of each line it
        inserted."""
        return [row[0] for row in conn.execute(APPEND_MANY, params).fetchall()]

    def _flush_primitive(self, session_id: str) -> None:
        """Called for each session a flush confirms, before the synchronous commit
        (nothing of its own to do)."""

    # -- internals ------------------------------------------------------------------------

    def _write_append(self, session_id: str, params: dict[str, Any], token: int,
                      candidates: tuple[Event, ...], lines: list[bytes]) -> int:
        """The append statement: the lines inserted (0: the fence did not hold), or -1
        when its outcome is unknown (recorded for ``flush``)."""

        def run(conn: psycopg.Connection[Any]) -> int:
            try:
                return self._execute_append(conn, params)
            except pg_errors.UniqueViolation:
                return 0  # a writer that did not take the fence got there first

        written = self._sent(f"append to session {session_id!r}", run)
        if written is not None:
            return written
        self._cache.drop(session_id)
        with self._unconfirmed_lock:
            self._unconfirmed[session_id] = Unconfirmed(token, candidates, lines)
        logger.warning("append to session %r: outcome unknown, the connection was lost "
                       "after the statement was sent", session_id)
        return -1

    def _sent(self, what: str, run: Callable[[psycopg.Connection[Any]], _T]) -> _T | None:
        """``run`` a writing statement on a pooled connection: its result, or None when the
        connection was lost after the statement was sent (committed or not: the caller
        records it unconfirmed); any other failure is ``_connection``'s
        ``PersistenceError``."""
        sent = False
        try:
            with self._connection(what, writes=True) as conn:
                try:
                    sent = True
                    return run(conn)
                except psycopg.Error:
                    if conn.broken:
                        raise
                    sent = False  # the server answered: it rolled the statement back
                    raise
        except PersistenceError as exc:
            if not (sent and connection_lost(exc)):
                raise
        return None

    def _confirm(self, session_id: str, key: str, pending: Unconfirmed) -> None:
        """Find out whether an append of unknown outcome committed; commit it at the same
        fence when it did not and the log has not moved since. ``PersistenceError`` unless
        the lines are committed on return (once the log has moved on without them, they
        are forgotten: that flush says so, later ones confirm the rest)."""
        first = pending.events[0].seq
        row, found = self._committed(session_id, key, pending)
        if row is not None and int(row[0]) == pending.token:
            if found == pending.lines:
                with self._unconfirmed_lock:  # committed: the flush makes it durable
                    self._unflushed[session_id] = Unflushed.after(
                        self._unflushed.get(session_id), pending.token, pending.events,
                        pending.lines, self._reach.epoch)
                self._forget(session_id, pending)
                return
            if not found and int(row[1]) == first:
                again = [NewEvent(type=e.type, time=e.time, data=e.data) for e in pending.events]
                try:
                    self._append(session_id, again, first)
                except (FenceConflict, ScheduleLogError):
                    # Moved on meanwhile: not kept, unless by another confirm of the same
                    # append (the outage's end, ``_after_outage``, or another thread)
                    if self._committed(session_id, key, pending)[1] == pending.lines:
                        self._forget(session_id, pending)
                        return
                else:
                    with self._unconfirmed_lock:
                        confirmed = self._unconfirmed.get(session_id) is pending
                    if confirmed:
                        self._forget(session_id, pending)
                        return
                    raise PersistenceError(f"session {session_id!r} could not be confirmed "
                                           "durable")
        self._forget(session_id, pending)
        raise PersistenceError(
            f"an append to session {session_id!r} of unknown outcome was not kept")

    def _committed(self, session_id: str, key: str, pending: Unconfirmed
                   ) -> tuple[tuple[Any, ...] | None, list[bytes]]:
        """The session's row (token, length; None: none) and its committed lines where
        ``pending`` was sent."""
        first = pending.events[0].seq
        with self._connection(f"confirm session {session_id!r}") as conn:
            row = conn.execute(f"SELECT token, length FROM {SESSIONS} WHERE id = %s",
                               (key,)).fetchone()
            found = [bytes(r[0]) for r in conn.execute(
                f"SELECT line FROM {EVENTS} WHERE session_id = %s AND seq >= %s AND seq < %s "
                "ORDER BY seq", (key, first, first + len(pending.events))).fetchall()]
        return row, found

    def _forget(self, session_id: str, pending: Unconfirmed) -> None:
        with self._unconfirmed_lock:
            if self._unconfirmed.get(session_id) is pending:
                del self._unconfirmed[session_id]

    def _after_outage(self) -> None:
        """Find out whether the server kept this store's appends it had not confirmed when
        it failed, and append again at the same fence those it lost in a crash: the
        processes that made them have moved on (a turn delivered, a followup acknowledged)
        and may never flush those sessions again."""
        epoch = self._reach.epoch
        with self._unconfirmed_lock:
            ids = [sid for sid, kept in self._unflushed.items() if kept.epoch != epoch]
        for exc in self.flush_many(ids).values():
            if not exc.outage_said:  # else checked again when the next outage ends
                logger.warning("after the outage: %s", exc.reason)
