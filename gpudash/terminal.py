"""Text from a run, made safe for a terminal line.

A run's name, host, events, problems, column names and an object's key are someone else's text. Printed
raw, an escape sequence in them retitles the terminal, clears the screen, writes a fake line or hides a
link (OSC 8). :func:`printable` escapes every control character (C0, DEL, C1), the bidirectional overrides
that reorder what is shown, and text that is not valid UTF-8 (a lone surrogate), as ``\\x1b``/``\\u202e``
escapes, so what is printed is what was recorded, visibly, on one line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["printable", "printable_lines"]

# C0 controls, DEL, C1 controls, the bidi embeddings/overrides/isolates, lone surrogates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    if m.group(0) in _NAMED:
        return _NAMED[m.group(0)]
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: object) -> str:
    """``text`` with every character that could act on a terminal escaped (``\\x1b``, ``\\n``,
    ``\\u202e``); everything else as it is."""
    return _UNSAFE.sub(_escape, str(text))


def printable_lines(lines: Iterable[str]) -> str:
    """Lines joined for the terminal, each one :func:`printable` (a line break inside one is escaped)."""
    return "\n".join(printable(line) for line in lines)
