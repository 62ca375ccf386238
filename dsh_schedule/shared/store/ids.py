"""Session id escaping (docs/architecture.md#session-logs): any session id maps onto one
safe file name segment, and back.

No I/O happens here.
"""

from __future__ import annotations

from typing import Final

# Bytes that stand for themselves in an escaped id. Upper-case letters, '.' and '%' are
# escaped too, so two ids never meet on a case-insensitive filesystem and no segment is
# '.', '..' or hidden.
_PLAIN: Final[frozenset[int]] = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_-")
# NAME_MAX is 255 bytes; the JSONL store adds the ".jsonl" suffix.
MAX_ESCAPED_LENGTH: Final[int] = 255 - len(".jsonl")


def escape_session_id(session_id: str) -> str:
    """The one file name segment for ``session_id``; ``unescape_session_id`` inverts it.

    Every UTF-8 byte outside ``[a-z0-9_-]`` becomes ``%XX`` (upper-case hex), so the
    mapping is injective even on case-insensitive filesystems and never yields '/', '.',
    '..' or a hidden name. ``ValueError`` for a non-string, empty or non-UTF-8 id, or one
    whose segment would exceed ``MAX_ESCAPED_LENGTH``.
    """
    if not isinstance(session_id, str) or session_id == "":
        raise ValueError("a session id is a non-empty string")
    try:
        raw = session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a session id must be encodable as UTF-8") from None
    segment = "".join(chr(b) if b in _PLAIN else f"%{b:02X}" for b in raw)
    if len(segment) > MAX_ESCAPED_LENGTH:
        raise ValueError("the session id is too long for a file name")
    return segment


def unescape_session_id(segment: str) -> str:
    """The session id ``segment`` stands for; ``ValueError`` if no id escapes to it."""
    raw = bytearray()
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "%":
            raw.append(_hex_byte(segment[i + 1 : i + 3]))
            i += 3
        else:
            raw.extend(char.encode("utf-8"))
            i += 1
    try:
        session_id = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not an escaped session id") from None
    if escape_session_id(session_id) != segment:
        raise ValueError("not an escaped session id")
    return session_id


def _hex_byte(digits: str) -> int:
    if len(digits) != 2 or not all(d in "0123456789ABCDEF" for d in digits):
        raise ValueError("not an escaped session id")
    return int(digits, 16)
