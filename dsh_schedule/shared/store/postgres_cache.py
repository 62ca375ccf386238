"""What the PostgreSQL session store keeps of the sessions it served (shared/store/
postgres.py): per session its row token, header, length, fold and ledger and a window of
the latest events, least recently used first within a budget; and the events of a log,
the older ones read back from the table when asked for (``TableEvents``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from dsh_schedule.shared.core.events import Event, EventSequence, SessionHeader
from dsh_schedule.shared.store.foldcache import LogDigest
from dsh_schedule.shared.store.sessioncache import RECENT_BYTES, RECENT_EVENTS, evict_oldest

# Events older than the window are fetched this many at a time.
CHUNK_EVENTS: Final[int] = 256

_ENTRY_BYTES: Final = 1024
_EVENT_BYTES: Final = 400
_LINE_FACTOR: Final = 2


class SessionEntry:
    """What the store keeps of one session: its row token, header, length (the digest's),
    fold and ledger, and a window of the latest events. Guarded by ``lock``."""

    def __init__(self, token: int, header: SessionHeader) -> None:
        self.lock = threading.Lock()
        self.token = token
        self.header = header
        self.digest = LogDigest(header.seedLength or 0)
        self.recent: list[Event] = []
        self._sizes: list[int] = []
        self.charged = 0
        # The line of the last event fed (None: none yet): a catch-up reads the row at that
        # seq again and starts over when it differs (a server that lost commits on a crash
        # and took other appends in their place since).
        self.last_line: bytes | None = None

    @property
    def length(self) -> int:
        return self.digest.length

    def feed(self, events: Sequence[Event], sizes: Sequence[int], last_line: bytes | None
             ) -> None:
        if events:
            self.last_line = last_line
        self.digest.feed(events)
        recent = self.recent + list(events)
        kept_sizes = self._sizes + list(sizes)
        cut = max(0, len(recent) - RECENT_EVENTS)
        total = sum(kept_sizes[cut:])
        while cut < len(recent) and total > RECENT_BYTES:
            total -= kept_sizes[cut]
            cut += 1
        # New lists: the views handed out keep reading the old ones.
        self.recent = recent[cut:]
        self._sizes = kept_sizes[cut:]

    def cost(self) -> int:
        return (_ENTRY_BYTES + len(self.header.id) + _EVENT_BYTES * len(self.recent)
                + _LINE_FACTOR * sum(self._sizes) + self.digest.cost())


class EntryCache:
    """The entries, least recently used first, within ``budget_bytes`` (the entry just
    used is kept even when it alone is larger; a settle looks only at the entries it
    drops). Thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, SessionEntry] = OrderedDict()
        self._total = 0

    def get(self, session_id: str) -> SessionEntry | None:
        with self._lock:
            entry = self._entries.get(session_id)
            if entry is not None:
                self._entries.move_to_end(session_id)
            return entry

    def put(self, session_id: str, entry: SessionEntry) -> None:
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._total -= old.charged
            entry.charged = 0
            self._entries[session_id] = entry

    def drop(self, session_id: str) -> None:
        with self._lock:
            old = self._entries.pop(session_id, None)
            if old is not None:
                self._total -= old.charged

    def settle(self, session_id: str, entry: SessionEntry) -> None:
        cost = entry.cost()
        with self._lock:
            if self._entries.get(session_id) is not entry:
                return
            self._total += cost - entry.charged
            entry.charged = cost
            self._total = evict_oldest(self._entries, self._total, self.budget_bytes,
                                       session_id)

    def total(self) -> tuple[int, int]:
        """The entries held and their accounted bytes (read by
        ``PostgresReading.cache_stats``, for tests)."""
        with self._lock:
            return len(self._entries), self._total


class TableEvents(EventSequence):
    """The first ``length`` events of one session row, the latest few held in memory and
    older ones fetched from the events table ``CHUNK_EVENTS`` at a time. Rows never
    change once committed; a session whose row was made again since (another token) is
    refused, never read as this log."""

    __slots__ = ("_chunk", "_fetch", "_length", "_recent", "_recent_start")

    def __init__(self, fetch: Callable[[int, int], list[Event]], length: int,
                 recent: list[Event]) -> None:
        self._fetch = fetch
        self._length = length
        self._recent = recent  # never changed in place: the entry makes new lists
        self._recent_start = length - len(recent)
        self._chunk: tuple[int, list[Event]] | None = None

    def __iter__(self) -> Iterator[Event]:
        index = 0
        while index < self._recent_start:
            stop = min(index + CHUNK_EVENTS, self._recent_start)
            yield from self._fetch(index, stop)
            index = stop
        yield from self._recent

    def __repr__(self) -> str:
        return f"TableEvents(length={self._length}, in_memory={len(self._recent)})"

    def _event(self, index: int) -> Event:
        if index >= self._recent_start:
            return self._recent[index - self._recent_start]
        number = index // CHUNK_EVENTS
        cached = self._chunk
        if cached is None or cached[0] != number:
            start = number * CHUNK_EVENTS
            cached = (number, self._fetch(start, min(start + CHUNK_EVENTS, self._recent_start)))
            self._chunk = cached
        return cached[1][index - number * CHUNK_EVENTS]
