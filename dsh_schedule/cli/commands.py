"""The subcommands on session logs and tools, and the long-running processes
(docs/architecture.md#processes-and-cli): each imports what it needs when it runs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsh_schedule.cli.common import (
    EXIT_TOOL_ERROR,
    CommandError,
    await_redis,
    dump,
    require_redis,
    serve_metrics,
    settings_of,
    shown_id,
    tool_args,
)
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.terminal import shown_json, terminal_text

if TYPE_CHECKING:
    from dsh_schedule.host.gate import Delivery
    from dsh_schedule.host.tools import ScheduleTools
    from dsh_schedule.shared.settings import Settings
    from dsh_schedule.shared.store.port import SessionStore

# -- read-only commands on the pure core ----------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
    from dsh_schedule.shared.core.fold import fold
    from dsh_schedule.shared.store.jsonl import read_session_file_tail

    status = 0
    for name in args.files:
        try:
            session, torn = read_session_file_tail(Path(name))
            fold(session.events, session.seed_length)
        except (ScheduleLogError, PersistenceError, ValueError) as exc:
            print(f"{name}: {exc}")
            status = 1
        else:
            print(f"{name}: ok{_torn_note(torn, len(session.events))}")
    return status


def _torn_note(torn: int, events: int) -> str:
    """What ``check`` says it ignored: a torn final line is no committed event (a write a
    crash cut short), so the log is valid without it, but the operator should know."""
    if not torn:
        return ""
    return (f" (ignored a torn final line of {torn} bytes after {events} events: "
            "a write cut short, never committed)")


def cmd_fold(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.fold import fold
    from dsh_schedule.shared.core.views import list_value, render
    from dsh_schedule.shared.store.jsonl import read_session_file

    session = read_session_file(Path(args.file))
    now = wall_clock_ms() if args.now is None else args.now
    print(shown_json(render(list_value(fold(session.events, session.seed_length), now)),
                     sys.stdout))
    return 0


def cmd_present(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.presentation import receipt_value, reminder_presentation
    from dsh_schedule.shared.core.views import render
    from dsh_schedule.shared.store.jsonl import read_session_file

    session = read_session_file(Path(args.file))
    shown = reminder_presentation(session.events, args.seq, session.seed_length)
    # An event that is no dispatch has no receipt: its receipt value is null.
    print(shown_json(render(None if shown is None else receipt_value(shown)), sys.stdout))
    return 0


def cmd_catalog(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core import catalog
    from dsh_schedule.shared.settings import calendar_from_env, lifecycle_from_env

    exporters = {
        "catalog": catalog.catalog_json,
        "openai": catalog.openai_tools,
        "anthropic": catalog.anthropic_tools,
    }
    # DSH_SCHEDULE_CALENDAR=on prints the variant with calendar rules,
    # DSH_SCHEDULE_LIFECYCLE=on the one with schedule_update.
    calendar, lifecycle = calendar_from_env(), lifecycle_from_env()
    print(json.dumps(exporters[args.format](calendar, lifecycle), ensure_ascii=False, indent=2))
    return 0


# -- sessions and tools ---------------------------------------------------------------


def cmd_session(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.events import SessionHeader
    from dsh_schedule.shared.core.timesel import load_zone
    from dsh_schedule.shared.store.jsonl import JsonlStore
    from dsh_schedule.shared.store.naming import close_store, store_from_settings

    settings = settings_of(args)
    if args.session_command == "create" and args.time_zone is not None:
        load_zone(args.time_zone)
    store = store_from_settings(settings)
    try:
        if args.session_command == "create":
            # A mistyped --sessions would otherwise hide the session in a new directory.
            root = store.root if isinstance(store, JsonlStore) else None
            new_directory = root is not None and not root.is_dir()
            store.create(
                SessionHeader(id=args.id, createdAt=wall_clock_ms(), timeZone=args.time_zone)
            )
            if new_directory:
                print(f"dsh-schedule: created the sessions directory "
                      f"'{terminal_text(str(root))}'", file=sys.stderr)
            print(terminal_text(args.id))
        else:
            header = store.fork(args.parent, args.child, created_at_ms=wall_clock_ms())
            print(f"{terminal_text(header.id)} (seedLength {header.seedLength})")
    finally:
        close_store(store)
    return 0


def cmd_call(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.core.catalog import tool_definitions
    from dsh_schedule.shared.store.naming import close_store, store_from_settings

    settings = settings_of(args)
    names = [tool.name for tool in tool_definitions(settings.calendar, settings.lifecycle)]
    if args.tool not in names:
        raise CommandError(f"call: unknown tool {args.tool!r} (one of {', '.join(names)})")
    arguments = tool_args(args.args_json)
    store = store_from_settings(settings)
    try:
        return _call(args, settings, store, arguments)
    finally:
        close_store(store)


def _call(args: argparse.Namespace, settings: Settings, store: SessionStore,
          arguments: Any) -> int:
    from dsh_schedule.shared.core.errors import PersistenceError, outage_said

    try:
        found = store.exists(args.session)
    except PersistenceError as exc:
        if not outage_said(exc):
            raise
        # Before any call: said as a Redis that does not answer is (exit 2, no call made).
        raise CommandError(f"call: the session store {settings.store_shown} did not answer"
                           f" ({exc}); no call made") from None
    if not found:
        raise CommandError(
            f"call: session {shown_id(args.session)} does not exist in "
            f"{settings.store_shown!r}"
        )
    if settings.redis_url:
        await_redis(settings.redis_url, args.redis_wait, verbose=args.verbose)
    else:
        print("dsh-schedule call: no Redis URL; using an embedded Redis, no wake is armed",
              file=sys.stderr)

    from dsh_schedule.host.tools import ScheduleTools
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.coordination.connection import connect, connect_embedded

    client = connect(settings.redis_url) if settings.redis_url else connect_embedded()
    coordination = Coordination(client, settings)
    tools = ScheduleTools(store, coordination, settings=settings, clock=coordination.clock,
                          announce=True)
    result = tools.call(args.session, args.tool, arguments)
    # A prompt may hold what JSON leaves raw: escaped for a terminal only.
    print(shown_json(result.content, sys.stdout))
    repay_before_exit(tools, args.redis_wait)
    return EXIT_TOOL_ERROR if result.is_error else 0


def repay_before_exit(tools: ScheduleTools, wait_s: float | None) -> bool:
    """A one-shot process forgets what it owes when it exits: a re-arm that failed after
    the log was written is tried again, backing off, for up to ``wait_s`` seconds (None:
    until Redis answers), and said on stderr when it still failed
    (docs/architecture.md#owed-re-arms). Whether nothing is owed any more."""
    import logging
    import time

    import redis

    from dsh_schedule.shared.coordination.outage import Outage

    deadline = None if wait_s is None else time.monotonic() + wait_s
    outage = Outage(logging.getLogger(__name__), "call")
    while tools.owed.owed():
        try:
            tools.repay_owed()
        except redis.RedisError as exc:
            pause = outage.failed(exc)
            if deadline is not None and time.monotonic() + pause > deadline:
                print("dsh-schedule call: Redis did not take the wake of the session's"
                      " reminders; they wait for its next wake, tool call or host look"
                      " (docs/architecture.md#owed-re-arms)", file=sys.stderr)
                return False
            time.sleep(pause)
    outage.succeeded()
    return True


# -- long-running processes -----------------------------------------------------------


def stop_while_starting() -> None:
    """A SIGTERM or SIGINT before the process's own loop has taken over (while it imports
    or waits for Redis) ends it cleanly: exit 0, as a stop during the loop would."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def cmd_worker(args: argparse.Namespace) -> int:
    stop_while_starting()
    settings = settings_of(args)
    serve_metrics(settings, "worker")
    await_redis(require_redis(settings, "worker"), args.redis_wait, verbose=args.verbose)
    from dsh_schedule.worker.process import run_worker

    return run_worker(settings, burst=args.burst)


def cmd_scheduler(args: argparse.Namespace) -> int:
    stop_while_starting()
    settings = settings_of(args)
    serve_metrics(settings, "scheduler")
    await_redis(require_redis(settings, "scheduler"), args.redis_wait, verbose=args.verbose)
    from dsh_schedule.scheduler.process import run_scheduler

    return run_scheduler(settings)


def cmd_rebuild(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    url = require_redis(settings, "rebuild")
    await_redis(url, args.redis_wait, verbose=args.verbose)
    from dsh_schedule.scheduler.process import rebuild, rebuild_note
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.coordination.connection import connect

    coordination = Coordination(connect(url), settings)
    report = rebuild(coordination, settings, now_ms=coordination.clock())
    shown: dict[str, object] = {"woken": list(report.woken), "retired": list(report.retired)}
    if settings.wake_unloaded:
        from dsh_schedule.shared.store.naming import close_store, store_from_settings

        # The timers of unloaded sessions, from the store's index of next due moments.
        store = store_from_settings(settings)
        try:
            shown["unloadedTimers"] = coordination.unloaded.rebuild(
                store, settings.queue, now_ms=coordination.clock())
        finally:
            close_store(store)
    dump(shown)
    note = rebuild_note(report, settings)
    if note is not None:
        print(note, file=sys.stderr)
    return 0


def cmd_host(args: argparse.Namespace) -> int:
    stop_while_starting()
    settings = settings_of(args)
    if args.all_sessions:
        import msgspec

        # Serving every session on demand is the unloaded-sessions mode.
        settings = msgspec.structs.replace(
            settings, wake_unloaded=True,
            unload_after_s=args.unload_after or settings.unload_after_s)
    elif args.unload_after is not None:
        raise CommandError("host: --unload-after needs --all-sessions")
    url = require_redis(settings, "host")
    from dsh_schedule.shared.store.naming import store_from_settings

    store = store_from_settings(settings)
    sessions = list(dict.fromkeys([*args.sessions_to_host, *args.sessions_file]))
    if not sessions and not args.all_sessions:
        raise CommandError("host: name a SESSION, a --sessions-file or --all-sessions")
    _require_sessions(store, sessions, settings.store_shown)
    serve_metrics(settings, "host")
    await_redis(url, args.redis_wait, verbose=args.verbose)
    import threading

    from dsh_schedule.host.reference import ReferenceHost
    from dsh_schedule.shared.coordination.agents import Coordination
    from dsh_schedule.shared.coordination.connection import connect

    coordination = Coordination(connect(url), settings)
    stop = threading.Event()
    output_closed: list[BrokenPipeError] = []

    def delivered(session: str, delivery: Delivery) -> None:
        try:
            print(f"{terminal_text(session)}: delivered {delivery.text!r}", flush=True)
        except BrokenPipeError as exc:  # the reader went away: stop as SIGPIPE would
            output_closed.append(exc)
            stop.set()

    host = ReferenceHost(store, coordination, settings, on_delivery=delivered,
                         all_sessions=args.all_sessions)
    host.open_roots(sessions)
    from dsh_schedule.shared.collector import tune_for_service

    tune_for_service()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    import signal

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    try:
        host.run(stop)
    finally:
        host.close()
    if output_closed:
        raise output_closed[0]  # ``main`` ends the command quietly
    return 0


def _require_sessions(store: SessionStore, sessions: Sequence[str], where: str) -> None:
    """A host serves only sessions that exist: one that does not is a mistyped id or the
    wrong directory, and serving nothing for it would hide that."""
    missing = [session_id for session_id in sessions if not store.exists(session_id)]
    if missing:
        more = " and more" if len(missing) > 3 else ""
        shown = ", ".join(shown_id(m) for m in missing[:3]) + more
        raise CommandError(f"host: {len(missing)} session(s) do not exist in "
                           f"{where!r}: {shown} (create them with "
                           "'dsh-schedule session create ID')")
