"""Loading sessions on demand (docs/architecture.md#unloaded-sessions): a host's answer to
the load requests the scheduler announces for unloaded sessions whose timer is due, and
the idle sessions a host serving every session lets go.

``DueLoads`` runs in a thread of its own beside the host's loop: it rebuilds the timers of
its store's unloaded sessions from the store's index at its start and whenever Redis lost
its data (the generation marker), reads the host group's load request stream, claims
each request (a session a live host serves is a no-op; a claim another host holds is
its), and calls the host's ``on_due_unloaded`` callback, at most
``Settings.load_concurrency`` at once. The callback loads the session (creates its root
agent, which installs Schedule); the new lease wakes it, and the existing path delivers
what is due. A callback that raises or loads nothing leaves the timer where the
scheduler moved it, one backoff step on: the host group is asked again then.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Final

import redis

from dsh_schedule.shared import metrics
from dsh_schedule.shared.clock import Clock
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.generation import GenerationMarker
from dsh_schedule.shared.coordination.outage import DiskOutage, Outage, is_outage
from dsh_schedule.shared.coordination.unloaded import LoadRequest
from dsh_schedule.shared.core.errors import PersistenceError
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.port import SessionStore

log = logging.getLogger(__name__)

DueUnloaded = Callable[[str], object]

READ_BLOCK_S: Final = 1.0  # the longest one wait for a load request
LOAD_BATCH: Final = 100  # requests read, and sessions installed together, at a time


class DueLoads:
    """The load requests of one host: started with ``start``, ended with ``stop``.

    ``serves(session)`` says whether this host serves the session now (then a request is
    a no-op); ``on_due_unloaded(session)`` loads it, and a return value of ``False``
    declines (as does loading nothing)."""

    def __init__(
        self, store: SessionStore, coordination: Coordination, settings: Settings, *,
        host: str, clock: Clock, serves: Callable[[str], bool],
        on_due_unloaded: DueUnloaded,
        installing: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._store = store
        self._coord = coordination
        self._settings = settings
        self._host = host
        self._clock = clock
        self._serves = serves
        self._callback = on_due_unloaded
        self._installing = installing
        self._timers = coordination.unloaded
        self._slots = threading.BoundedSemaphore(settings.load_concurrency)
        self._pool = ThreadPoolExecutor(max_workers=settings.load_concurrency,
                                        thread_name_prefix="dsh-schedule-load")
        self._loading: set[str] = set()
        self._state = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._generation = GenerationMarker(coordination.client, coordination.keys)
        self._claim_ms = int(settings.lease_ttl_s * 1000)
        # Set once the first rebuild is done and requests are read from here on.
        self.listening = threading.Event()
        self._answered: str | None = None  # the last request whose batch has ended

    @property
    def queue(self) -> str:
        return self._settings.queue

    def start(self) -> None:
        """Rebuild the timers and answer requests in a thread of its own."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dsh-schedule-loads",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop reading requests; loads already started run to their end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._pool.shutdown(wait=True)

    def rebuild(self) -> int:
        """Write the timer of every unloaded session of the store from its index (the
        store folds again only the logs that grew since their entry); how many."""
        written = self._timers.rebuild(self._store, self.queue, now_ms=self._clock())
        log.info("timers of unloaded sessions rebuilt from the store's index: %d written",
                 written)
        return written

    def answered(self) -> bool:
        """Whether every request announced so far has been answered (loaded, declined or
        a no-op): what an embedded runtime waits for before its next passes."""
        return (self.listening.is_set()
                and self._timers.newest_request(self.queue) == self._answered)

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        outage = Outage(log, "load requests")
        # A rebuild the store fails (a disk outage, one file that cannot be read) is tried
        # again at this outage's pace; meanwhile load requests are answered.
        unrebuilt = _RebuildOutage(log, "rebuild of the timers of unloaded sessions")
        cursor: str | None = None
        rebuilt = False
        next_check = next_rebuild = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_check:
                    lost = self._generation.lost_data()
                    next_check = time.monotonic() + self._settings.generation_check_s
                    if lost:
                        cursor = None
                if cursor is None:
                    cursor = self._answered = self._timers.newest_request(self.queue)
                    rebuilt = False
                if not rebuilt and time.monotonic() >= next_rebuild:
                    try:
                        self.rebuild()
                    except PersistenceError as exc:
                        next_rebuild = time.monotonic() + unrebuilt.failed(exc)
                    else:
                        rebuilt = True
                        unrebuilt.succeeded()
                self.listening.set()
                cursor = self._read(cursor)
                self._answered = cursor
            except (redis.RedisError, PersistenceError) as exc:
                if isinstance(exc, redis.RedisError) and not is_outage(exc):
                    log.exception("load requests: Redis refused a command")
                    self._stop.wait(1.0)
                    continue
                cursor = None  # rebuild once back: the outage may have lost timers
                self._stop.wait(outage.failed(exc))
                continue
            outage.succeeded()

    def _read(self, cursor: str) -> str:
        """Read up to ``LOAD_BATCH`` requests and load their sessions, at most
        ``load_concurrency`` at once, as one batch: their loads are claimed together (one
        round trip), their leases written together when the batch ends and their wakes
        enqueued in shared jobs (``installing``), so a burst is woken in batched due
        transactions. Then their timers go (their wakes are their timers now) and their
        claims are released together."""
        cursor, requests = self._timers.read_requests(
            self.queue, cursor, block_ms=int(READ_BLOCK_S * 1000), count=LOAD_BATCH)
        fresh: list[LoadRequest] = []
        for request in requests:
            with self._state:
                if request.session in self._loading:
                    continue  # this host is loading it already
                self._loading.add(request.session)
            fresh.append(request)
        if not fresh:
            return cursor
        try:
            outcomes = self._claim(fresh)
            claimed = [r for r in fresh if outcomes[r.session] == "claimed"]
            with self._batch():
                futures = []
                for request in claimed:
                    self._slots.acquire()
                    futures.append(self._pool.submit(self._answer, request))
                for request, future in zip(claimed, futures, strict=True):
                    outcomes[request.session] = future.result()
            loaded = [r.session for r in claimed if outcomes[r.session] == "loaded"]
            self._timers.park(self.queue, dict.fromkeys(loaded))
            # A loaded session's claim goes once its lease is written: until then another
            # host would find it neither live nor claimed.
            self._timers.release([r.session for r in claimed])
        finally:
            with self._state:
                self._loading.difference_update(r.session for r in fresh)
        recorder = metrics.get()
        now_ms = self._clock()
        for request in fresh:
            recorder.load_request(outcomes[request.session],
                                  max(now_ms - request.announced_ms, 0) / 1000)
        return cursor

    def _claim(self, requests: list[LoadRequest]) -> dict[str, str]:
        """Each request's session: ``live`` when this host serves it, else its claim
        (``claimed``, ``live`` or ``taken``); one round trip."""
        outcomes = {r.session: "live" for r in requests if self._serves(r.session)}
        asked = [r.session for r in requests if r.session not in outcomes]
        if asked:
            claims = self._timers.claim(asked, self._host, now_ms=self._clock(),
                                        ttl_ms=self._claim_ms)
            outcomes.update(zip(asked, claims, strict=True))
        return outcomes

    @contextmanager
    def _batch(self) -> Iterator[None]:
        """``installing`` when given and free (a host opening its sessions holds it)."""
        if self._installing is None:
            yield
            return
        try:
            block = self._installing()
            block.__enter__()
        except RuntimeError:
            yield
            return
        try:
            yield
        finally:
            block.__exit__(None, None, None)

    def _answer(self, request: LoadRequest) -> str:
        """Load a session whose load this host claimed: ``loaded``, ``declined`` or
        ``failed``."""
        try:
            return self._claimed(request)
        except Exception as exc:
            log.warning("load request for %s could not be answered: %s", request.session, exc)
            return "failed"
        finally:
            self._slots.release()

    def _claimed(self, request: LoadRequest) -> str:
        session = request.session
        if not self._store.exists(session):
            self._timers.park(self.queue, {session: None})
            log.warning("load request for %s: no such session in the store; its timer "
                        "is dropped", session)
            return "declined"
        try:
            answer = self._callback(session)
        except Exception as exc:
            log.warning("loading %s on request %d failed (%s: %s); it stays overdue "
                        "and is asked for again", session, request.attempt,
                        type(exc).__name__, exc)
            return "failed"
        if answer is False or not self._serves(session):
            log.info("loading %s on request %d was declined; it stays overdue and is "
                     "asked for again", session, request.attempt)
            return "declined"
        log.info("loaded %s on request %d", session, request.attempt)
        return "loaded"


class IdleSessions:
    """When each session a host loaded on demand was last used, so the idle ones are let
    go: the earliest first, looking at no other (a heap of (last use, session), an entry
    superseded by a later use skipped)."""

    def __init__(self, after_ms: int) -> None:
        self._after_ms = after_ms
        self._used: dict[str, int] = {}
        self._order: list[tuple[int, str]] = []
        self._state = threading.Lock()

    def used(self, session: str, now_ms: int) -> None:
        """The session was loaded, prompted or delivered into at ``now_ms``."""
        with self._state:
            self._used[session] = now_ms
            heapq.heappush(self._order, (now_ms, session))

    def idle(self, now_ms: int) -> list[str]:
        """The sessions unused for ``after_ms`` up to ``now_ms``, forgotten here."""
        found: list[str] = []
        with self._state:
            while self._order and self._order[0][0] + self._after_ms <= now_ms:
                at, session = heapq.heappop(self._order)
                if self._used.get(session) == at:
                    del self._used[session]
                    found.append(session)
        return found

    def __contains__(self, session: object) -> bool:
        return session in self._used


class _RebuildOutage(DiskOutage):
    """``DiskOutage`` whose line names what failed (one session file may be the cause)."""

    def _cause(self, exc: BaseException) -> str:
        return str(exc)
