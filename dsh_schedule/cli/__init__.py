"""``dsh-schedule``: one command with subcommands (docs/architecture.md#processes-and-cli).

Thin: parse the arguments, build the settings, configure logging, run. Each subcommand
imports what it needs when it runs, so ``check``, ``fold``, ``present``, ``catalog`` and
``--version`` load neither Redis nor rq. Input the command cannot use is one line on
stderr and exit 2, never a traceback.

The command is a package: ``common`` (exit codes, settings, Redis, argument types),
``commands`` (session logs, tools, the long-running processes), ``ops`` (the web console,
``status`` and ``health``) and ``parser`` (the parser and ``main``).
"""

from __future__ import annotations

from dsh_schedule.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
