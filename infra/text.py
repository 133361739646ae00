"""Model output made safe to print: :func:`escape_control` (used by ``rlhf results`` tables and comparisons).

Its own module so ``infra.compare`` and ``infra.results_cli`` both import it and not each other.
"""

from __future__ import annotations

import unicodedata

__all__ = ["escape_control"]


# Unicode categories escaped: controls (C0, DEL, C1), format characters (bidi controls U+202A-U+202E and
# U+2066-U+2069, zero-width U+200B-U+200F, soft hyphen U+00AD, BOM U+FEFF, ...), line and paragraph separators
# (U+2028, U+2029, which some terminals and editors break lines at) and lone surrogates (unprintable)
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if unicodedata.category(ch) not in _ESCAPED_CATEGORIES:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_control(text: str) -> str:
    """``text`` with every control, format and separator character written as its Python escape, so model output
    printed to a terminal can neither move the cursor, clear the screen nor recolour the line (an ANSI ``ESC [2J``
    prints as the six characters ``\\x1b[2J``), reorder or hide text, nor break a table row: newline, carriage
    return and tab as ``\\n``, ``\\r``, ``\\t``; every other character of Unicode category Cc (C0/C1, DEL), Cf
    (bidi controls U+202E..., zero-width U+200B-U+200F, U+00AD, U+FEFF), Zl/Zp (U+2028, U+2029) or Cs as ``\\xNN``,
    ``\\uNNNN`` or ``\\UNNNNNNNN``. Other characters (accents, CJK, emoji, ``\\`` itself) are kept."""
    return "".join(map(_escape_char, text))
