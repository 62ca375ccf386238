"""``python -m dsh_schedule``: the ``dsh-schedule`` command."""

from __future__ import annotations

import sys

from dsh_schedule.cli import main

if __name__ == "__main__":
    sys.exit(main())
