"""``dsh-schedule store migrate|copy`` and ``dsh-schedule export``: the session stores
(docs/architecture.md#session-logs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from dsh_schedule.cli.common import CommandError, settings_of
from dsh_schedule.terminal import terminal_text


def cmd_store(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.store.naming import close_store, is_database_url, open_store
    from dsh_schedule.shared.store.transfer import copy_sessions

    if args.store_command == "migrate":
        from dsh_schedule.shared.store.postgres import PostgresStore

        name = settings_of(args).store_name
        if not is_database_url(name):
            raise CommandError("store migrate: a JSONL directory has no schema; name a "
                               "postgresql:// store (--store or DSH_SCHEDULE_STORE)")
        with PostgresStore(name, migrate=False) as store:
            before, after = store.migrate()
        print(f"session schema: version {before} -> {after}")
        return 0
    source = open_store(args.source)
    try:
        target = open_store(args.target)
        try:
            def progress(session_id: str, outcome: str) -> None:
                if args.verbose:
                    print(f"{terminal_text(session_id)}: {outcome}", flush=True)

            report = copy_sessions(source, target, progress=progress)
        finally:
            close_store(target)
    finally:
        close_store(source)
    print(f"copied {len(report.copied)}, already there {len(report.already)}, extended "
          f"{len(report.extended)}, conflicting {len(report.conflicts)}; each copy verified "
          "line by line")
    for session_id in report.conflicts[:10]:
        print(f"conflict: {terminal_text(session_id)} differs in the target", file=sys.stderr)
    return 1 if report.conflicts else 0


def cmd_export(args: argparse.Namespace) -> int:
    from dsh_schedule.shared.store.naming import close_store, store_from_settings
    from dsh_schedule.shared.store.transfer import session_lines

    store = store_from_settings(settings_of(args))
    try:
        header, lines = session_lines(store, args.session)
    finally:
        close_store(store)
    out = sys.stdout.buffer
    out.write(header + b"\n")
    for line in lines:
        out.write(line + b"\n")
    out.flush()
    return 0


def add_store_commands(sub: Any, add_common: Callable[..., None],
                       session_arg: Callable[[str], str]) -> None:
    """Register ``store`` and ``export`` on the subcommands ``sub`` (``add_common``: the
    parser's shared options, called with ``redis=False``)."""
    p = sub.add_parser("store", help="migrate a PostgreSQL store, copy sessions between stores")
    store_sub = p.add_subparsers(dest="store_command", required=True, metavar="ACTION")
    m = store_sub.add_parser("migrate", help="bring a PostgreSQL store's schema to this "
                             "release's version, one step per version")
    add_common(m, redis=False)
    c = store_sub.add_parser(
        "copy", help="copy every session from one store to another (resumable: sessions "
        "already there are verified, grown ones extended; each copy compared line by line)")
    c.add_argument("-v", "--verbose", action="store_true", help="one line per session")
    c.add_argument("source", metavar="FROM", help="a directory or a postgresql:// URL")
    c.add_argument("target", metavar="TO", help="a directory or a postgresql:// URL")
    p.set_defaults(func=cmd_store)
    e = sub.add_parser("export", help="print a session's log as JSONL, from any store")
    add_common(e, redis=False)
    e.add_argument("session", type=session_arg, metavar="SESSION")
    e.set_defaults(func=cmd_export)
