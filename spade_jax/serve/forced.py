"""Forced tool calls (`tool_choice` "required" or a named function): decoding constrained to a call.

The reply is ``<tool_call>{"name": "NAME", "arguments": {...}}`` in the tools prompt's syntax
(`tools.tools_prompt`), built in three parts:

1. the server writes ``<tool_call>{"name": "`` itself (forced tokens, never sampled);
2. the name is a walk down the trie of the candidate names' token sequences (each name's own
   tokenization, closing quote included): where the trie branches, the model draws one token
   among the branches (`RowEngine`'s ``allowed_tokens``), so it picks a declared name by its
   own probabilities; where it does not (a named function, a shared prefix), the server
   writes the token;
3. the server writes ``, "arguments": {`` and the model writes the arguments, unconstrained;
   `scan_object` reads them as a JSON object after each segment: the reply ends when the
   object closes, and is cut at its first error or at its length limit, with what is open
   closed (a member left incomplete is dropped).

So a forced reply is always a call of a declared (or the named) function whose arguments are a
JSON object: the model's own up to its first mistake.
"""

from __future__ import annotations

import dataclasses
import re

from spade_jax.serve.client_json import MAX_DEPTH
from spade_jax.serve.tools import TOOL_CALL_OPEN

HEAD = TOOL_CALL_OPEN + '{"name": "'
TAIL = ', "arguments": {'
_WS = " \t\n\r"
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The tokens of a forced call for one request's candidate names."""

    head: tuple[int, ...]
    paths: dict[str, tuple[int, ...]]  # name -> the tokens of `NAME"`, in declaration order
    tail: tuple[int, ...]

    @classmethod
    def build(cls, tokenizer, names: tuple[str, ...]) -> "Plan":
        return cls(tuple(tokenizer.encode(HEAD)), {n: tuple(tokenizer.encode(n + '"')) for n in names},
                   tuple(tokenizer.encode(TAIL)))

    def branches(self, chosen: tuple[int, ...]) -> list[int]:
        """The tokens that continue some candidate after the name tokens `chosen`, in first-seen order."""
        k = len(chosen)
        return list(dict.fromkeys(p[k] for p in self.paths.values() if len(p) > k and p[:k] == chosen))

    def name(self, chosen: tuple[int, ...]) -> str | None:
        """The candidate whose tokens `chosen` are, if they are a whole one."""
        return next((n for n, p in self.paths.items() if p == chosen), None)

    def first_under(self, chosen: tuple[int, ...]) -> str:
        """The first declared candidate that `chosen` begins (a call cut short is completed with it)."""
        return next(n for n, p in self.paths.items() if p[: len(chosen)] == chosen)


@dataclasses.dataclass(frozen=True)
class Scan:
    """What `scan_object` read: `end` is the length of the complete object `text` starts with
    (None while it is open), `broken` whether it stopped on a character no JSON continues with,
    `closed` the longest prefix ending at a value boundary with its containers closed."""

    end: int | None
    broken: bool
    closed: str


def scan_object(text: str) -> Scan:
    """Reads `text` as the start of one JSON object, at most `client_json.MAX_DEPTH` deep."""
    stack: list[str] = []
    safe_at, safe_closers = 0, "{}"  # the last value boundary and what closes there ("{}" until the object opens)
    state, i, n = "start", 0, len(text)

    while i < n:
        c = text[i]
        if c in _WS:
            i += 1
            continue
        step = None  # the index after what this character starts, or None: broken at i
        after = state  # the state after it
        if state == "start":
            if c == "{":
                step, after = i + 1, "key_or_close"
        elif state == "colon":
            if c == ":":
                step, after = i + 1, "value"
        elif state == "after" and c == ",":
            step, after = i + 1, "key" if stack[-1] == "{" else "value"
        elif (c == "}" and state in ("key_or_close", "after") and stack[-1] == "{") or (
                c == "]" and state in ("value_or_close", "after") and stack[-1] == "["):
            stack.pop()
            if not stack:
                return Scan(i + 1, False, text[: i + 1])
            step, after = i + 1, "after"
        elif state in ("key_or_close", "key") and c == '"':
            step, after = _string_end(text, i), "colon"
        elif state in ("value", "value_or_close"):
            if c in "{[":
                if len(stack) < MAX_DEPTH:
                    step, after = i + 1, "key_or_close" if c == "{" else "value_or_close"
            elif c == '"':
                step, after = _string_end(text, i), "after"
            elif c in "-0123456789":
                step, after = _number_end(text, i), "after"
            else:
                step, after = _literal_end(text, i), "after"
        if step is None:
            return Scan(None, True, text[:safe_at] + safe_closers)
        if step > n:  # ran out inside a string, number or literal: more text may complete it
            break
        if c in "{[":
            stack.append(c)
        i, state = step, after
        if state in ("key_or_close", "value_or_close", "after"):
            safe_at, safe_closers = i, "".join("}" if o == "{" else "]" for o in reversed(stack))
    return Scan(None, False, text[:safe_at] + safe_closers)


def _string_end(text: str, i: int) -> int | None:
    """The index after the string opening at `i`; `len(text) + 1` when it runs out, None when broken."""
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == '"':
            return j + 1
        if c < " ":
            return None
        if c == "\\":
            if j + 1 >= n:
                break
            e = text[j + 1]
            if e == "u":
                digits = text[j + 2: j + 6]
                if not all(d in _HEX for d in digits):
                    return None
                if len(digits) < 4:
                    break
                j += 6
                continue
            if e not in _ESCAPES:
                return None
            j += 2
            continue
        j += 1
    return n + 1


def _number_end(text: str, i: int) -> int | None:
    """The index after the number at `i` (it ends at a delimiter); `len(text) + 1` when the text ends first."""
    j = i
    while j < len(text) and text[j] in "+-0123456789.eE":
        j += 1
    if j == len(text):
        return j + 1
    match = _NUMBER.fullmatch(text, i, j)
    return j if match and text[j] in _WS + ",]}" else None


def _literal_end(text: str, i: int) -> int | None:
    for literal in ("true", "false", "null"):
        if text.startswith(literal, i):
            return i + len(literal)
        if literal.startswith(text[i:]):
            return len(text) + 1
    return None
