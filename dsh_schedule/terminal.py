"""Text from Redis or the command line as a terminal may show it
(docs/decisions.md#ids-at-the-command-line).

Agent ids, worker and host names reach ``status`` from Redis, and any string is a valid
session id: printed raw, an ANSI escape in one would clear the screen or recolour the
lines after it, and a newline would fake a line of the report. What the commands print
of such text goes through here first.
"""

from __future__ import annotations

from typing import Final, TextIO

_NAMED: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    point = ord(char)
    if point < 0x100:
        return f"\\x{point:02x}"
    return f"\\u{point:04x}" if point < 0x10000 else f"\\U{point:08x}"


def terminal_text(text: str) -> str:
    """``text`` with every character a terminal would not print as itself — control
    characters (ESC among them), line and paragraph separators, format characters, lone
    surrogates — written as a Python-style escape, and ``\\`` doubled, so the result is one
    line that reads back unambiguously."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        _NAMED.get(char) or (char if char.isprintable() else _escaped(char)) for char in text
    )


def terminal_json(text: str) -> str:
    """A JSON text with every character JSON leaves raw that a terminal would act on
    (DEL, the C1 controls, separators, format characters) written as a ``\\u`` escape:
    the same JSON value, safe to print."""
    if text.isprintable():
        return text
    out: list[str] = []
    for char in text:
        if char.isprintable():
            out.append(char)
            continue
        point = ord(char)
        if point >= 0x10000:  # a surrogate pair, as JSON writes characters past the BMP
            point -= 0x10000
            out.append(f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}")
        else:
            out.append(f"\\u{point:04x}")
    return "".join(out)


def shown_json(text: str, stream: TextIO) -> str:
    """A JSON text as a command prints it to ``stream``: ``terminal_json`` on a terminal,
    else exactly as given, so a script reads the tool's own rendering
    (docs/decisions.md#ids-at-the-command-line)."""
    try:
        terminal = stream.isatty()
    except ValueError:  # a closed stream: nothing is shown on it anyway
        terminal = False
    return terminal_json(text) if terminal else text
