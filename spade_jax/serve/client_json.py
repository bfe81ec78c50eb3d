"""Client JSON parsed with bounds: standard JSON only, nested at most `MAX_DEPTH` deep, every
string (keys too) valid Unicode.

Python's `json` accepts what the rest of the server cannot take: a lone surrogate
(``"\\ud800"`` escaped, or raw CESU-8 bytes, which `json.loads` decodes with
``surrogatepass``) reaches the tokenizer and the UTF-8 encoder of the reply, which raise;
a deep nesting raises `RecursionError` in the parser or in any later walk; ``NaN`` and
``Infinity`` are not JSON. Each is refused here, where text enters, with a 400 that says
where.
"""

from __future__ import annotations

import json
from typing import Any

from spade_jax.serve.errors import ServeError

MAX_DEPTH = 64


def loads(data: bytes | str, what: str, param: str | None = None) -> Any:
    """`data` parsed and checked; a `ServeError` (400) naming `what` when it is refused."""
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise ServeError(400, f"{what} is nested more than {MAX_DEPTH} levels deep", param) from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an int too long to convert
        raise ServeError(400, f"{what} is not JSON: {err}", param) from None
    _check(value, what, param)
    return value


def check_text(text: str, where: str, param: str | None = None) -> str:
    """`text` when it is valid Unicode (encodes as UTF-8), else a 400 naming `where`."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ServeError(400, f"{where} is not valid Unicode: {err.reason} at character {err.start} "
                             "(a lone UTF-16 surrogate such as \\ud800); send UTF-8 text", param) from None
    return text


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _check(value: Any, what: str, param: str | None) -> None:
    """Walks `value` without recursion: every container at most `MAX_DEPTH` deep, every string valid."""
    stack = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            check_text(node, f"{what}: {path}" if path else what, param)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise ServeError(400, f"{what} is nested more than {MAX_DEPTH} levels deep", param)
        if isinstance(node, dict):
            for key, item in node.items():
                check_text(key, f"{what}: a key of {path or 'the top object'}", param)
                stack.append((item, depth + 1, f"{path}.{key}" if path else key))
        else:
            stack.extend((item, depth + 1, f"{path}[{i}]") for i, item in enumerate(node))
