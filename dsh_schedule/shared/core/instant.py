"""Canonical UTC instants: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` <-> integer epoch milliseconds.

All time arithmetic in Schedule is integer milliseconds. Years 0001-9999 only.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MIN_MS: Final[int] = -62135596800000  # 0001-01-01T00:00:00.000Z
MAX_MS: Final[int] = 253402300799999  # 9999-12-31T23:59:59.999Z
MAX_SAFE_INTEGER: Final[int] = 2**53 - 1

_CANONICAL = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{3})Z", re.ASCII)


def format_instant(ms: int) -> str:
    """Render epoch milliseconds as the canonical UTC string; ValueError out of range."""
    if not MIN_MS <= ms <= MAX_MS:
        raise ValueError("instant out of range")
    second, milli = divmod(ms, 1000)
    return f"{_second_text(second)}.{milli:03d}Z"


@lru_cache(maxsize=4096)
def _second_text(second: int) -> str:
    """``YYYY-MM-DDTHH:MM:SS`` of an epoch second: the instants a burst renders share a
    few seconds."""
    dt = _EPOCH + timedelta(seconds=second)
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:"
        f"{dt.second:02d}"
    )


@lru_cache(maxsize=65536)
def parse_instant(text: str) -> int:
    """Parse a canonical UTC instant; ValueError for anything not exactly canonical."""
    m = _CANONICAL.fullmatch(text)
    if m is None:
        raise ValueError("not a canonical instant")
    year, month, day, hour, minute, second, milli = (int(g) for g in m.groups())
    if year < 1:
        raise ValueError("year out of range")
    dt = datetime(year, month, day, hour, minute, second, milli * 1000, tzinfo=UTC)
    return to_ms(dt)


def is_canonical_instant(text: str) -> bool:
    try:
        parse_instant(text)
    except ValueError:
        return False
    return True


def to_ms(dt: datetime) -> int:
    """Epoch milliseconds of an aware datetime (sub-millisecond digits are dropped)."""
    if dt.tzinfo is None:
        raise ValueError("naive datetime")
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def to_datetime(ms: int) -> datetime:
    """An aware UTC datetime for epoch milliseconds."""
    return _EPOCH + timedelta(milliseconds=ms)
