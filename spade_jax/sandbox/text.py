"""Placeholder (replaced by the text-safety module on main)."""

from __future__ import annotations

import re

_BAD = re.compile("[\ud800-\udfff\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean_text(text: str, limit: int | None = None) -> str:
    text = _BAD.sub("\ufffd", text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"[... {len(text) - limit} characters cut]"
    return text


def clean_value(value):
    return value
