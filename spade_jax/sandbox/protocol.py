"""The framed protocol between client, host and workers, and the raw-value encoding of results.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. JSON (not
pickle or marshal) because the trusted side decodes what untrusted workers send.

Workers report what the environment returned as *raw* values: JSON scalars, lists and
string-keyed dicts pass through, numpy scalars become Python scalars, tuples are marked so
the trusted side can tell them from lists, and anything else becomes an opaque marker naming
its type. The trusted side (``validate.py``) then decides whether the values are acceptable.
Standard library only.
"""

from __future__ import annotations

import json
import math
import os

HEADER_BYTES = 4
TUPLE_KEY = "__tuple__"
OPAQUE_KEY = "__type__"
_MAX_DEPTH = 32


class ProtocolError(Exception):
    """Bytes on a channel that are not a well-formed frame of the expected size."""


def encode_frame(message) -> bytes:
    """One JSON message as a length-prefixed frame."""
    payload = json.dumps(message, separators=(",", ":")).encode("utf-8", "surrogatepass")
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


def decode_payload(payload: bytes):
    """The JSON value of one frame's payload; ProtocolError when it is not valid JSON."""
    try:
        return json.loads(payload.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ProtocolError(f"malformed message: {type(err).__name__}") from None


class FrameBuffer:
    """Accumulates bytes from a non-blocking channel and yields complete frame payloads."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Adds ``data``; returns the payloads completed; raises ProtocolError on an oversized frame."""
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER_BYTES:
            size = int.from_bytes(self._buf[:HEADER_BYTES], "big")
            if size > self.max_bytes:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self.max_bytes}")
            if len(self._buf) < HEADER_BYTES + size:
                break
            frames.append(bytes(self._buf[HEADER_BYTES:HEADER_BYTES + size]))
            del self._buf[:HEADER_BYTES + size]
        if len(self._buf) > HEADER_BYTES + self.max_bytes:
            raise ProtocolError("frame exceeds the size limit")
        return frames

    def pending(self) -> int:
        return len(self._buf)


def read_exact(fd: int, size: int) -> bytes:
    """Blocking read of exactly ``size`` bytes; EOFError when the channel closes first."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("channel closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, max_bytes: int):
    """Blocking read of one frame from ``fd``, decoded."""
    size = int.from_bytes(read_exact(fd, HEADER_BYTES), "big")
    if size > max_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    return decode_payload(read_exact(fd, size))


def write_all(fd: int, data: bytes) -> None:
    """Blocking write of all of ``data``."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def raw_value(value, depth: int = 0):
    """``value`` as JSON-safe raw data (see module docstring); never raises for odd objects.

    Types are matched exactly (a subclass of int or str is opaque), so methods an
    environment overrides are never called here. The host checks everything again anyway.
    """
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if -(1 << 63) <= value < (1 << 63):
            return value
        return {OPAQUE_KEY: "int out of range"}
    if kind is float:
        return value if math.isfinite(value) else {OPAQUE_KEY: f"float {value!r}"}
    if depth >= _MAX_DEPTH:
        return {OPAQUE_KEY: "too deeply nested"}
    if kind.__module__ == "numpy" and hasattr(value, "item") and getattr(value, "shape", None) == ():
        return raw_value(value.item(), depth + 1)
    if kind is tuple:
        return {TUPLE_KEY: [raw_value(v, depth + 1) for v in value]}
    if kind is list:
        return [raw_value(v, depth + 1) for v in value]
    if kind is dict:
        out = {}
        for key, item in value.items():
            name = _json_key(key)
            if name is None or name in (TUPLE_KEY, OPAQUE_KEY):
                return {OPAQUE_KEY: f"dict with key of type {type(key).__name__}"}
            out[name] = raw_value(item, depth + 1)
        return out
    return {OPAQUE_KEY: kind.__name__ if type(kind.__name__) is str else "object"}


def _json_key(key) -> str | None:
    """A dict key as ``json.dumps`` would write it, or None when JSON has no spelling for it."""
    kind = type(key)
    if kind is str:
        return key
    if kind is bool:
        return "true" if key else "false"
    if key is None:
        return "null"
    if kind is int:
        return str(key)
    if kind is float and math.isfinite(key):
        return repr(key)
    return None
