"""Shape buckets: sizes rounded up to powers of two, so that calls of varying batch sizes and
lengths reuse a handful of compiled programs."""

from __future__ import annotations


def bucket(n: int, minimum: int = 1, multiple: int = 1) -> int:
    """Smallest power of two >= max(n, minimum), rounded up to a multiple of `multiple`."""
    size = 1 << max(0, int(max(n, minimum)) - 1).bit_length()
    return -(-size // multiple) * multiple
