"""Values made JSON: the one conversion every file the project writes goes through (pure Python)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable


def jsonable(value: Any, default: Callable[[Any], Any] | None = None) -> Any:
    """``value`` with numpy/jax scalars and arrays made plain and non-finite floats as None.

    JSON has no NaN/Infinity; logging them as null keeps every line valid JSON. Keys become
    strings. Any other value is ``default(value)`` (e.g. ``repr``) when given, else a TypeError.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, default) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, default) for v in value]
    if hasattr(value, "tolist"):  # numpy / jax scalars and arrays
        return jsonable(value.tolist(), default)
    if default is not None:
        return jsonable(default(value))
    raise TypeError(f"cannot log {type(value).__name__} value {value!r} as JSON")
