"""Text that came out of an environment program, made safe to show and to store.

Environment programs are written by the designer model and are adversarial, so every
string they produce (observations, info, error messages, printed output, ``solution()``)
is data. This module makes such strings harmless wherever they go (the sandbox host, prompts,
pages, consoles, exported files), so every package may import it:

``clean_text(text, limit=None)``
    Valid Unicode without control characters, for text that may keep its lines
    (observations, printed output, code shown in prompts and pages). Lone surrogates,
    C0 controls other than ``\\n`` and ``\\t`` (so ``\\r``, ESC, NUL, BEL, ...), DEL, C1
    controls (U+0080-U+009F) and the bidi embedding/override/isolate controls
    (U+202A-U+202E, U+2066-U+2069) each become U+FFFD; the length is unchanged. With
    ``limit`` the result is at most ``limit`` characters: a longer text is cut and ends
    with a marker saying how many characters were cut (``…[1234 chars cut]``; a limit
    too small for the marker gets the bare cut). Idempotent, and returns its argument
    itself when there is nothing to do (costs: bench/RESULTS.md).
``display_line(text, limit)``
    One terminal line: backslashes doubled, newlines, tabs and every other character that
    is not printable (``str.isprintable``: controls, format characters such as the bidi
    controls, surrogates, separators other than the space) written as ``\\n``, ``\\t``,
    ``\\r``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``; at most ``limit`` characters, a longer
    text cut with the same kind of marker. Program text shown this way can never start a
    new line, move the cursor or change colours.
``json_text(value, **dumps_kwargs)``
    ``value`` as JSON for a file that tokenizers may read whole: every ``<``, ``>`` and lone
    surrogate written as a ``\\uXXXX`` escape, so no chat-format special token appears
    literally, the file is valid UTF-8, and ``json.loads`` returns ``value`` exactly.

Standard library only: the JAX-free sandbox host calls these on every string a worker sends.
"""

from __future__ import annotations

import json
import re

REPLACEMENT = "\ufffd"

# Everything clean_text replaces, one character each.
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_UNSAFE_CODES = (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F),
                 *range(0x2066, 0x206A), *range(0xD800, 0xE000))
_TABLE = dict.fromkeys(_UNSAFE_CODES, REPLACEMENT)
_ASCII_TABLE = {code: REPLACEMENT for code in _UNSAFE_CODES if code < 0x80}
_UNPRINTABLE_PROBE = re.compile(r"[^ -~]")  # anything outside printable ASCII needs a closer look
_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
# Written as JSON escapes by json_text: the angle brackets every shipped special token holds,
# and lone surrogates (designed text may hold them; escaped, the file stays valid UTF-8).
_ESCAPED_IN_FILES = re.compile("[<>\ud800-\udfff]")


def _marker(cut: int) -> str:
    return f"\u2026[{cut} chars cut]"


def _fit(text: str, limit: int) -> str:
    """``text`` cut so that it plus its cut marker is at most ``limit`` characters."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if len(text) <= limit:
        return text
    keep = limit
    for _ in range(4):  # the marker's length depends on the count it shows; settles in <= 2 rounds
        new_keep = max(0, limit - len(_marker(len(text) - keep)))
        if new_keep == keep:
            break
        keep = new_keep
    while keep > 0 and keep + len(_marker(len(text) - keep)) > limit:
        keep -= 1
    marker = _marker(len(text) - keep)
    if keep + len(marker) > limit:  # no room for a marker: the bare cut
        return text[:limit]
    return text[:keep] + marker


def clean_text(text: str, limit: int | None = None) -> str:
    """``text`` as valid, control-free Unicode, cut to ``limit`` characters (see module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"clean_text takes a str, got {type(text).__name__}")
    # str.translate has a fast path for ASCII strings (isascii() is O(1)); for the rest a
    # regex scan finds out in C whether there is anything to replace at all.
    if text.isascii():
        cleaned = text.translate(_ASCII_TABLE)
        if cleaned != text:
            text = cleaned
    elif _UNSAFE.search(text) is not None:
        text = text.translate(_TABLE)
    return text if limit is None else _fit(text, limit)


def _escape_char(ch: str) -> str:
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    if ch.isprintable():
        return ch
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def display_line(text: str, limit: int) -> str:
    """``text`` as one escaped terminal line of at most ``limit`` characters (see module docstring)."""
    if not isinstance(text, str):
        text = str(text)
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    # Escaping at most multiplies the length by 10, and never shrinks it: only a prefix matters.
    head = text[: limit + 1]
    if _UNPRINTABLE_PROBE.search(head) is None and "\\" not in head:
        return _fit(text, limit)
    pieces, used = [], 0
    for i, ch in enumerate(head):
        piece = _escape_char(ch)
        if used + len(piece) > limit:
            break
        pieces.append(piece)
        used += len(piece)
    else:
        if len(head) == len(text):
            return "".join(pieces)
        i = len(head)
    # Cut at source character i: make room for the marker, dropping whole escapes only.
    kept, cut_at = len(pieces), i
    while kept and used + len(_marker(len(text) - cut_at)) > limit:
        kept -= 1
        cut_at -= 1
        used -= len(pieces[kept])
    marker = _marker(len(text) - cut_at)
    if used + len(marker) > limit:  # no room for a marker at all: the bare cut
        return "".join(pieces)
    return "".join(pieces[:kept]) + marker


def json_text(value, **dumps_kwargs) -> str:
    """``value`` as JSON (`json.dumps` with ``dumps_kwargs``) holding no ``<``, ``>`` or lone
    surrogate: each is a ``\\uXXXX`` escape, so no special token appears literally and
    ``json.loads`` returns ``value`` exactly. Outside strings JSON has none of these characters."""
    text = json.dumps(value, ensure_ascii=False, **dumps_kwargs)
    return _ESCAPED_IN_FILES.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


__all__ = ["REPLACEMENT", "clean_text", "display_line", "json_text"]
