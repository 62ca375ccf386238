"""``dsh-schedule reminders``: the active reminders of every session, one line each, read
straight from the session logs (no Redis): "what will fire tonight?"
(docs/architecture.md#processes-and-cli)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from dsh_schedule.cli.common import EXIT_UNHEALTHY, instant_arg, settings_of
from dsh_schedule.shared.clock import wall_clock_ms
from dsh_schedule.terminal import shown_json, terminal_text

if TYPE_CHECKING:
    from dsh_schedule.shared.store.port import SessionStore

COLUMNS = ("session", "id", "kind", "next target", "state", "prompt")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--due-before", type=instant_arg, metavar="INSTANT",
        help="only the reminders whose next target lies before this RFC 3339 instant, "
        "such as 2030-01-01T06:00:00Z (default: all)")
    parser.add_argument(
        "--json", action="store_true",
        help="one JSON object a line: {\"session\":…} and the reminder's schedule_list view "
        "(default: a tab-separated table)")
    parser.set_defaults(func=cmd_reminders)


def cmd_reminders(args: argparse.Namespace) -> int:
    """Print the rows as they are found, session by session; exit 1 when a session could
    not be listed (each such session is one line on stderr), else 0."""
    from dsh_schedule.shared.store.naming import close_store, open_store

    # Nothing kept between sessions: each is read, listed and dropped.
    store = open_store(settings_of(args).store_name, cache_mb=0, syncfs=False)
    try:
        return _print_reminders(args, store)
    finally:
        close_store(store)


def _print_reminders(args: argparse.Namespace, store: SessionStore) -> int:
    from dsh_schedule.reminders import ActiveReminder, active_reminders
    from dsh_schedule.shared.core.instant import format_instant

    out = sys.stdout
    if not args.json:
        out.write("\t".join(COLUMNS) + "\n")
    status = 0
    for row in active_reminders(store, now_ms=wall_clock_ms(), due_before_ms=args.due_before):
        if not isinstance(row, ActiveReminder):
            out.flush()
            print(f"dsh-schedule: reminders: session {terminal_text(row.session)} cannot be "
                  f"listed: {terminal_text(row.reason)}", file=sys.stderr)
            status = EXIT_UNHEALTHY
            continue
        if args.json:
            # A prompt as the tool renders it: escaped for a terminal only.
            out.write(shown_json(json.dumps(row.value(), ensure_ascii=False,
                                            separators=(",", ":")), out) + "\n")
            continue
        view = row.view
        out.write("\t".join(terminal_text(str(field)) for field in (
            row.session, view["id"], view["kind"], format_instant(row.due_ms), view["state"],
            view["prompt"])) + "\n")
    return status
