"""Seeds derived from parts: the self-play loop's (seed, iteration, phase) and evaluation's
(seed, suite name, sample) draw every random choice through `derive_seed`, so runs repeat."""

from __future__ import annotations

import hashlib

import numpy as np


def derive_seed(*parts: int | str) -> int:
    """A 32-bit seed from integer or string parts (a string counts by the first 4 bytes of its SHA-256)."""
    words = [p if isinstance(p, int) else int.from_bytes(hashlib.sha256(p.encode()).digest()[:4], "little")
             for p in parts]
    return int(np.random.SeedSequence([int(w) for w in words]).generate_state(1)[0])
