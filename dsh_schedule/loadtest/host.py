"""``python -m dsh_schedule.loadtest.host IDS_FILE``: the ``dsh-schedule host`` command for
the sessions named in a file, one id a line.

``dsh-schedule host SESSION...`` takes its sessions on the command line, and a command
line holds only so many (the kernel's ``ARG_MAX``), so the load test starts its host
processes through this entry, which hands the ids to that same command in-process:
settings from the environment, signal handling and delivery are the command's own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def read_ids(text: str) -> list[str]:
    """The session ids of an ids file: one a line, blank lines ignored."""
    return [line for line in text.splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m dsh_schedule.loadtest.host IDS_FILE", file=sys.stderr)
        return 2
    ids = read_ids(Path(args[0]).read_text(encoding="utf-8"))
    if not ids:
        print(f"{args[0]}: no session ids", file=sys.stderr)
        return 2
    from dsh_schedule.cli import main as cli_main

    return cli_main(["host", "--", *ids])


if __name__ == "__main__":
    sys.exit(main())
