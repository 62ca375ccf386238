"""What the JSONL store keeps of the sessions it served, and within which budget
(docs/architecture.md#session-logs): the fold, the ledger, the offsets and a window of
recent events, never the whole log; older events read back from the file; least recently
used sessions dropped once the accounted bytes pass ``cache_mb``, and folded again from
their file when next used."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.core.dispatch import pending_frame
from dsh_schedule.shared.core.errors import FenceConflict, PersistenceError
from dsh_schedule.shared.core.events import (
    SCHEDULE_CHANGE,
    STEP_START,
    TURN_START,
    USER_MESSAGE,
    Event,
    NewEvent,
    Session,
    SessionHeader,
)
from dsh_schedule.shared.core.ledger import Pair, ledger_of, reminder_source
from dsh_schedule.shared.core.timecontext import derive_zone_context
from dsh_schedule.shared.settings import Settings, SettingsError
from dsh_schedule.shared.store import sessioncache
from dsh_schedule.shared.store.codec import encode_event, encode_header
from dsh_schedule.shared.store.jsonl import JsonlStore, read_session_file
from dsh_schedule.shared.store.lazylog import MARK_EVERY
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.shared.store.port import SessionStore
from dsh_schedule.shared.store.postgres_cache import EntryCache, SessionEntry
from dsh_schedule.shared.store.sessioncache import RECENT_EVENTS

T0 = 1_764_579_600_000  # 2025-12-01T09:00:00.000Z
BERLIN = "Europe/Berlin"
MIB = 1024 * 1024


def change(data: dict[str, Any]) -> NewEvent:
    return NewEvent(type=SCHEDULE_CHANGE, time=T0, data={"version": 1, **data})


def at_create(schedule_id: str, prompt: str, when: str = "2025-12-01T08:00:00.000Z") -> NewEvent:
    schedule = {"id": schedule_id, "kind": "at", "prompt": prompt, "scheduledAt": when}
    return change({"operation": "create", "schedule": schedule})


def every_create(schedule_id: str, prompt: str) -> NewEvent:
    schedule = {"id": schedule_id, "kind": "every", "prompt": prompt, "everySeconds": 600,
                "scheduledAt": "2025-12-01T08:00:00.000Z"}
    return change({"operation": "create", "schedule": schedule})


def dispatch(schedule_id: str, accepted_at: str | None = None) -> NewEvent:
    data: dict[str, Any] = {"operation": "dispatch", "id": schedule_id}
    if accepted_at is not None:
        data["acceptedAt"] = accepted_at
    return change(data)


def note(i: int, size: int = 40) -> NewEvent:
    """A non-schedule event whose line length depends only on ``size``."""
    return NewEvent(type="tool/result", time=T0 + i, data={"content": "x" * size, "i": i % 10})


def turn(number: int, zone: str = BERLIN) -> list[NewEvent]:
    user = {"kind": "user", "rpcId": f"r{number}", "clientTimeZone": zone}
    reading = {"kind": "plugin", "plugin": "time-context"}
    return [
        NewEvent(type=TURN_START, time=T0, data={"turn": number}),
        NewEvent(type=USER_MESSAGE, time=T0, data={"content": [], "source": user}),
        NewEvent(type=USER_MESSAGE, time=T0, data={"content": [], "source": reading}),
        NewEvent(type=STEP_START, time=T0, data={"turn": number, "step": 0}),
    ]


def header(session_id: str) -> SessionHeader:
    return SessionHeader(id=session_id, createdAt=T0, timeZone=BERLIN)


def fill(store: SessionStore, session_id: str, batches: list[list[NewEvent]]) -> None:
    if not store.exists(session_id):
        store.create(header(session_id))
    for batch in batches:
        store.append(session_id, batch, len(store.read(session_id).events))


def scheduled_history(filler: int) -> list[list[NewEvent]]:
    """A log with a delivered one-shot, an undelivered one-shot, an undelivered recurring
    batch, active records, ``filler`` ordinary events and an open turn at the end."""
    first = Pair(scheduleId="schedule-1", occurrenceAt="2025-12-01T08:00:00.000Z")
    delivered = {"content": [], "source": reminder_source([first])}
    return [
        [at_create("schedule-1", "first"), dispatch("schedule-1")],
        [NewEvent(type=USER_MESSAGE, time=T0, data=delivered)],
        [note(i) for i in range(filler // 2)],
        [at_create("schedule-2", "second"), every_create("schedule-3", "third"),
         at_create("schedule-4", "later", "2026-12-01T08:00:00.000Z")],
        [dispatch("schedule-2"), dispatch("schedule-3", "2025-12-01T09:00:00.000Z")],
        [note(i) for i in range(filler - filler // 2)],
        turn(7),
    ]


def answers(session: Session) -> dict[str, Any]:
    """What the callers of a store ask of a session: its length, the delivery gate, the
    re-projected frames and the time context."""
    ledger = ledger_of(session)
    groups = ledger.undelivered()
    return {
        "length": len(session.events),
        "undelivered": groups,
        "deliverable": [ledger.deliverable(g.pairs) for g in groups],
        "frames": [pending_frame(ledger, g) for g in groups],
        "zone": derive_zone_context(session),
    }


# -- eviction -------------------------------------------------------------------------------


def test_an_evicted_session_is_read_again_and_answers_the_same(tmp_path: Path) -> None:
    # given a long session with schedule history, in a store that keeps one session only
    store = JsonlStore(tmp_path, cache_mb=0)
    fill(store, "long", scheduled_history(filler=3 * MARK_EVERY * 10))
    session, state = store.load("long")
    before = answers(session)
    # when another session is used, the first one is dropped
    fill(store, "other", [[note(1)]])
    store.load("other")
    assert store.cached_bytes("long") is None
    # then reading it again parses the whole file and folds it to the same state
    again, again_state = store.load("long")
    assert store.parsed_bytes("long") == store.path("long").stat().st_size
    assert again_state == state
    assert again.ledger == session.ledger
    assert answers(again) == before
    assert list(again.events) == list(read_session_file(store.path("long")).events)


def test_the_file_store_answers_what_the_in_memory_store_answers(tmp_path: Path) -> None:
    # given the same history in both stores
    stores: list[SessionStore] = [MemoryStore(), JsonlStore(tmp_path, cache_mb=0)]
    for store in stores:
        fill(store, "s1", scheduled_history(filler=500))
    memory, jsonl = (store.load("s1") for store in stores)
    # then the fold, the ledger and every answer agree
    assert memory[1] == jsonl[1]
    assert memory[0].ledger == jsonl[0].ledger
    assert answers(memory[0]) == answers(jsonl[0])
    assert len(answers(jsonl[0])["undelivered"]) == 2  # the history does hold some


def test_the_cache_keeps_the_most_recently_used_sessions_within_its_budget(
    tmp_path: Path,
) -> None:
    # given sessions of the same shape, and a budget of about three of them
    probe = JsonlStore(tmp_path / "probe")
    fill(probe, "s", [[note(i) for i in range(20)]])
    probe.load("s")
    one = probe.cached_bytes("s")
    assert one is not None
    budget = 3.5 * one
    store = JsonlStore(tmp_path / "store", cache_mb=budget / MIB)
    names = [f"s{i}" for i in range(10)]
    for name in names:
        fill(store, name, [[note(i) for i in range(20)]])
    # when every session is used in turn, then the cache never passes its budget
    for name in names:
        store.load(name)
        stats = store.cache_stats()
        kept = [store.cached_bytes(n) for n in names]
        assert stats.accounted_bytes == sum(b for b in kept if b is not None)
        assert stats.accounted_bytes <= budget
    # and it keeps the three most recently used
    assert [n for n in names if store.cached_bytes(n) is not None] == names[-3:]
    # when an older one is used again, then it is kept and the least recent one dropped
    store.load("s7")
    store.load("s0")
    assert [n for n in names if store.cached_bytes(n) is not None] == ["s0", "s7", "s9"]


def test_a_session_larger_than_the_budget_is_kept_alone_while_in_use(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path, cache_mb=0)
    fill(store, "a", [[note(1)]])
    fill(store, "b", [[note(1)]])
    store.load("a")
    store.load("b")
    stats = store.cache_stats()
    assert (stats.entries, stats.budget_bytes) == (1, 0)
    assert store.cached_bytes("b") == stats.accounted_bytes > 0


class _CountingEntries(OrderedDict[str, sessioncache.CachedSession]):
    """The cache's entries, counting every entry an iteration over them hands out."""

    visited = 0

    def __iter__(self) -> Iterator[str]:
        for session_id in super().__iter__():
            self.visited += 1
            yield session_id


def test_a_settle_over_budget_looks_at_the_entries_it_drops_only() -> None:
    """Eviction costs O(entries dropped), not O(entries cached): a cache full of sessions
    that drops one per use looks at about one entry per use."""
    # given a cache holding 2 000 entries, at its budget
    one = sessioncache.CachedSession().cost()
    cache = sessioncache.SessionCache(budget_bytes=2_000 * one)
    for i in range(2_000):
        cache.settle(f"s{i}", cache.entry(f"s{i}"))
    counting = _CountingEntries(cache._entries)
    cache._entries = counting
    # when 1 000 more sessions are used, each pushing the oldest out
    for i in range(2_000, 3_000):
        cache.settle(f"s{i}", cache.entry(f"s{i}"))
    # then each settle looked at the one entry it dropped (a whole copy is 2 000 per use)
    assert cache.stats().entries == 2_000
    assert next(iter(counting)) == "s1000"
    assert counting.visited <= 1_000 + 1
    # and the entry just used is never dropped, even when it is the oldest (a peek)
    peeked = cache.peek("s1000")
    assert peeked is not None
    cache.budget_bytes = one
    cache.settle("s1000", peeked)
    assert list(cache._entries) == ["s1000"]


class _CountingRows(OrderedDict[str, SessionEntry]):
    """The PostgreSQL store's cached entries, counting what an iteration hands out."""

    visited = 0

    def __iter__(self) -> Iterator[str]:
        for session_id in super().__iter__():
            self.visited += 1
            yield session_id


def test_the_postgres_store_cache_settles_looking_at_the_entries_it_drops_only() -> None:
    """The same bound for the PostgreSQL store's entries (a settle that copied every key
    made a burst over 10 000 sessions quadratic)."""
    # given a cache holding 2 000 entries, at its budget
    def entry(i: int) -> SessionEntry:
        return SessionEntry(i, SessionHeader(id=f"s{i:05d}", createdAt=0))

    one = entry(0).cost()
    cache = EntryCache(budget_bytes=2_000 * one)
    for i in range(2_000):
        cache.put(f"s{i:05d}", made := entry(i))
        cache.settle(f"s{i:05d}", made)
    counting = _CountingRows(cache._entries)
    cache._entries = counting
    # when 1 000 more sessions are used, each pushing the oldest out
    for i in range(2_000, 3_000):
        cache.put(f"s{i:05d}", made := entry(i))
        cache.settle(f"s{i:05d}", made)
    # then each settle looked at the one entry it dropped
    assert cache.total()[0] == 2_000
    assert next(iter(counting)) == "s01000"
    assert counting.visited <= 1_000 + 1
    # and the entry just used is kept, even alone over the budget
    kept = cache.get("s01000")
    assert kept is not None
    cache.budget_bytes = one // 2
    cache.settle("s01000", kept)
    assert list(cache._entries) == ["s01000"]


def test_a_negative_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cache_mb"):
        JsonlStore(tmp_path, cache_mb=-1)


# -- what an entry costs --------------------------------------------------------------------


def test_a_long_sessions_entry_does_not_grow_with_non_schedule_events(tmp_path: Path) -> None:
    # given a session with some schedule state and 1 000 ordinary events
    store = JsonlStore(tmp_path)
    fill(store, "s1", [[at_create("schedule-1", "kept")], [note(i) for i in range(999)]])
    store.load("s1")
    short = store.cached_bytes("s1")
    file_short = store.path("s1").stat().st_size
    # when 9 000 more ordinary events are appended
    fill(store, "s1", [[note(i) for i in range(999, 10_000)]])
    session, _ = store.load("s1")
    long = store.cached_bytes("s1")
    assert short is not None and long is not None
    # then the entry grew by about one file offset per MARK_EVERY events (and the window's
    # lines by a digit of seq), not by the events: under 1 % of what the log grew
    grew = store.path("s1").stat().st_size - file_short
    assert grew > 9_000 * 40
    assert 0 < long - short < grew / 100
    assert session.events.in_memory <= RECENT_EVENTS  # type: ignore[attr-defined]
    # while schedule state does count
    fill(store, "s1", [[at_create(f"schedule-{i}", "p" * 200) for i in range(2, 12)]])
    store.load("s1")
    grown = store.cached_bytes("s1")
    assert grown is not None and grown - long > 10 * 200


def test_a_reread_entry_costs_what_the_incremental_one_did(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    fill(store, "s1", scheduled_history(filler=700))
    store.load("s1")
    fresh = JsonlStore(tmp_path)
    fresh.load("s1")
    assert fresh.cached_bytes("s1") == store.cached_bytes("s1")


# -- events read back from the file -----------------------------------------------------------


def test_events_beyond_the_window_read_back_from_the_file(tmp_path: Path) -> None:
    # given a log of lines of many lengths, longer than the window and several marks
    store = JsonlStore(tmp_path)
    fill(store, "s1", [[note(i, size=(i * 37) % 300) for i in range(k, k + 50)]
                       for k in range(0, 500, 50)])
    expected = list(read_session_file(store.path("s1")).events)
    # when a fresh store reads it
    events = JsonlStore(tmp_path).read("s1").events
    # then every way of looking at the events sees the log
    assert len(events) == 500
    assert list(events) == expected
    assert [events[i] for i in range(500)] == expected
    assert [events[i] for i in range(499, -1, -1)] == expected[::-1]
    assert events[-500] == expected[0] and events[-1] == expected[-1]
    assert events[100:300] == tuple(expected[100:300])
    assert events[::-7] == tuple(expected[::-7])
    assert events == expected
    with pytest.raises(IndexError):
        events[500]


def test_a_view_keeps_its_length_while_the_log_grows(tmp_path: Path) -> None:
    store = JsonlStore(tmp_path)
    fill(store, "s1", [[note(i) for i in range(100)]])
    view = store.read("s1").events
    before = list(view)
    # when far more than the window is appended
    fill(store, "s1", [[note(i, size=3) for i in range(100, 400)]])
    # then the view still is the log it was
    assert len(view) == 100
    assert list(view) == before
    assert [view[i] for i in range(100)] == before


def test_a_view_of_a_replaced_file_refuses_to_read_older_events(tmp_path: Path) -> None:
    # given a view of a long log
    store = JsonlStore(tmp_path)
    fill(store, "s1", [[note(i) for i in range(300)]])
    view = store.read("s1").events
    # when the file is replaced by another log of the same length
    other = Event(type="other", seq=0, time=0, data=None)
    lines = [encode_header(header("s1"))]
    lines += [encode_event(Event(type="other", seq=i, time=0, data=None)) for i in range(300)]
    (tmp_path / "replacement").write_bytes(b"".join(lines))
    os.replace(tmp_path / "replacement", store.path("s1"))
    # then what it holds in memory is still the old log, and nothing older is read
    assert view[-1].type == "tool/result"
    with pytest.raises(PersistenceError, match="replaced"):
        view[0]
    assert store.read("s1").events[0] == other


def test_the_time_context_of_an_open_turn_longer_than_the_window(tmp_path: Path) -> None:
    # given an open turn whose start lies far outside the window
    events: list[list[NewEvent]] = [[note(i) for i in range(100)], turn(3)]
    events += [[note(i) for i in range(3 * RECENT_EVENTS)]]
    memory = MemoryStore()
    store = JsonlStore(tmp_path)
    for s in (memory, store):
        fill(s, "s1", events)
    session, _ = JsonlStore(tmp_path).load("s1")
    # then the rule reads back to the turn's start and answers as on the whole log
    context = derive_zone_context(session)
    assert context == derive_zone_context(memory.read("s1"))
    assert (context.has_reading, context.client_zones) == (True, (BERLIN,))


# -- parsing in blocks ----------------------------------------------------------------------


def test_lines_longer_than_a_read_block_parse_as_a_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a store that reads 64 bytes at a time, and lines far longer, with a torn tail
    monkeypatch.setattr(sessioncache, "READ_BLOCK", 64)
    writer = JsonlStore(tmp_path)
    fill(writer, "s1", [[note(i, size=(i * 53) % 400) for i in range(40)]])
    torn = b'{"type":"note","seq":40,'
    with writer.path("s1").open("ab") as f:
        f.write(torn)
    # when / then it reads exactly what the whole-file reader reads
    reader = JsonlStore(tmp_path)
    assert list(reader.read("s1").events) == list(read_session_file(writer.path("s1")).events)
    assert len(reader.read("s1").events) == 40
    # and the second read, the file unchanged, parsed nothing again
    assert reader.parsed_bytes("s1") == writer.path("s1").stat().st_size
    # while a read after the file changed parses only the torn tail again, and the rest
    with writer.path("s1").open("ab") as f:
        f.write(b'"time":1,"data":{}}\n')
    assert len(reader.read("s1").events) == 41
    assert reader.parsed_bytes("s1") == writer.path("s1").stat().st_size + len(torn)


# -- threads --------------------------------------------------------------------------------


def test_threads_on_many_sessions_in_a_small_cache_lose_nothing(tmp_path: Path) -> None:
    # given a cache that holds about one session, and threads using several
    store = JsonlStore(tmp_path, cache_mb=0.01)
    names = [f"s{i}" for i in range(4)]
    for name in names:
        store.create(header(name))
    errors: list[BaseException] = []

    def work(tag: int) -> None:
        try:
            for i in range(60):
                name = names[(tag + i) % len(names)]
                while True:
                    length = len(store.read(name).events)
                    try:
                        store.append(name, [note(i)], length)
                        break
                    except FenceConflict:
                        continue  # another thread appended first
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # then every append is there, in order, in every session
    assert errors == []
    total = 0
    for name in names:
        events = list(JsonlStore(tmp_path).read(name).events)
        assert [e.seq for e in events] == list(range(len(events)))
        total += len(events)
    assert total == 4 * 60
    assert store.cache_stats().accounted_bytes <= max(0.01 * MIB, max(
        store.cached_bytes(n) or 0 for n in names))


# -- the setting ----------------------------------------------------------------------------


def test_the_cache_budget_is_a_setting() -> None:
    assert Settings.from_env({}).cache_mb == 256
    assert Settings.from_env({"DSH_SCHEDULE_CACHE_MB": "64"}).cache_mb == 64
    assert Settings.from_env({"DSH_SCHEDULE_CACHE_MB": "64"}, cache_mb=0).cache_mb == 0
    for bad in ["-1", "1.5", "lots"]:
        with pytest.raises(SettingsError, match="cache_mb"):
            Settings.from_env({"DSH_SCHEDULE_CACHE_MB": bad})
