"""``python -m dsh_schedule``."""

from __future__ import annotations

import sys

from dsh_schedule.cli import main

sys.exit(main())
