"""What one delivery message may hold (docs/architecture.md#session-logs): every recurring
record of a session may come due in one batch, delivered as one ``user/message`` line of
the session log, which ``MAX_LINE_BYTES`` bounds. A create that would let the worst such
line pass the bound is refused (``invalid_prompt``), so nothing the tools accept makes a
message that can never be delivered.

The worst case is measured, not estimated from a typical prompt: a control character is
one byte of UTF-8, six in the frame (``\\u0001``), and seven in the log line, whose JSON
escapes the frame's backslash again; nothing costs more a byte. A schedule id can be
escaped that way twice (the frame, and the message's ``source``). What else a line holds
is bounded by ``ITEM_BYTES`` an item and ``MESSAGE_BYTES`` a message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from dsh_schedule.shared.core.records import RECURRING_TYPES, Schedule

# The bound of every session log line, in bytes of UTF-8, its newline not counted (the
# store's codec enforces it).
MAX_LINE_BYTES: Final[int] = 64 * 1024 * 1024
# The most bytes one byte of a prompt or id becomes in a delivery line.
WORST_ESCAPE: Final = 7
# An item's keys, quotes and occurrence instant, in the frame and in the ``source``.
ITEM_BYTES: Final = 256
# A message's frame header and instruction, and its event's fields.
MESSAGE_BYTES: Final = 4096


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def worst_batch_line_bytes(records: Iterable[Schedule]) -> int:
    """The longest delivery line ``records`` delivered in one batch can make."""
    return MESSAGE_BYTES + sum(
        ITEM_BYTES + WORST_ESCAPE * (_utf8_len(r.prompt) + 2 * _utf8_len(r.id))
        for r in records)


def batch_limit_message(line_bytes: int) -> str:
    """The ``invalid_prompt`` message for a recurring create refused by the bound."""
    return (f"this session's recurring reminders are delivered together in one message of "
            f"at most {line_bytes} bytes, and with this prompt their prompts could pass "
            "it; use a shorter prompt or delete a recurring reminder first.")


def fits_one_batch(active: Iterable[Schedule], new: Schedule,
                   line_bytes: int = MAX_LINE_BYTES) -> bool:
    """Whether every active recurring record and ``new`` (recurring too) still fit one
    delivery line, in the worst case."""
    recurring = [r for r in active if isinstance(r, RECURRING_TYPES)]
    return worst_batch_line_bytes([*recurring, new]) <= line_bytes
