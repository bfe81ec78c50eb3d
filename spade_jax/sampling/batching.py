"""Host-side batch layout for the sampler: shape buckets and left-padded prompt arrays.

Shapes are rounded up to powers of two so that a stream of calls with varying
batch sizes and prompt lengths reuses a handful of compiled programs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

MIN_PROMPT_BUCKET = 32
MIN_NEW_TOKENS_BUCKET = 16


def bucket(n: int, minimum: int = 1, multiple: int = 1) -> int:
    """Smallest power of two >= max(n, minimum), rounded up to a multiple of `multiple`."""
    size = 1 << max(0, int(max(n, minimum)) - 1).bit_length()
    return -(-size // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """Left-padded prompts: real tokens end at the last column of every row.

    Rows past `num_rows` pad the batch to its bucket; they hold one pad token and are
    finished from the start, so they never produce output.
    """

    tokens_BT: np.ndarray  # int32
    positions_BT: np.ndarray  # int32, 0.. within each prompt, 0 on padding
    segment_ids_BT: np.ndarray  # int32, 1 on prompt tokens, 0 on padding
    lengths_B: np.ndarray  # int32 prompt length per row
    num_rows: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.tokens_BT.shape


def pad_prompts(
    prompts: list[list[int]], *, batch: int, length: int, pad_id: int, vocab_size: int
) -> PromptBatch:
    """Lays `prompts` out left-padded in a `(batch, length)` bucket; validates them."""
    if not prompts:
        raise ValueError("generate needs at least one prompt; got an empty prompts list")
    if len(prompts) > batch:
        raise ValueError(f"{len(prompts)} prompts do not fit a batch bucket of {batch}")
    tokens_BT = np.full((batch, length), pad_id, np.int32)
    segment_ids_BT = np.zeros((batch, length), np.int32)
    positions_BT = np.zeros((batch, length), np.int32)
    lengths_B = np.ones((batch,), np.int32)
    for row, prompt in enumerate(prompts):
        ids = np.asarray(prompt, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError(f"prompt {row} is empty; every prompt needs at least one token")
        if ids.size > length:
            raise ValueError(f"prompt {row} has {ids.size} tokens, more than the bucket {length}")
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"prompt {row} has token ids outside [0, {vocab_size})")
        tokens_BT[row, length - ids.size :] = ids
        segment_ids_BT[row, length - ids.size :] = 1
        positions_BT[row, length - ids.size :] = np.arange(ids.size)
        lengths_B[row] = ids.size
    # Padding rows: one pad token so that no row is entirely masked.
    segment_ids_BT[len(prompts) :, -1] = 1
    return PromptBatch(tokens_BT, positions_BT, segment_ids_BT, lengths_B, len(prompts))
