"""Handing freed host memory back to the OS after a sampling call on CPU.

XLA:CPU allocates device buffers with the C allocator. A KV cache is one buffer per
layer (a few MB each at batch 32), and glibc keeps such freed blocks in its heaps
instead of unmapping them; it does not reliably reuse them for the next call's cache
either, so without a trim each call's cache piles up (see bench/RESULTS.md).
`malloc_trim(0)` returns the free pages.
Elsewhere (TPU/GPU device memory, non-glibc C libraries) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory(devices) -> bool:
    """Returns freed C-heap pages to the OS when `devices` are CPU devices; True if it trimmed."""
    trim = _malloc_trim()
    if trim is None or any(d.platform != "cpu" for d in devices):
        return False
    trim(0)
    return True

