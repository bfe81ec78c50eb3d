"""Training sequences and their packing into fixed-shape rows.

Both roles produce `TrainSequence`s: a designer sample is its prompt plus the program
it wrote, an agent episode is its whole conversation. `pack` places them first-fit
decreasing into rows of `row_length` tokens (segment ids keep them apart), pads the row
count to a power of two that the data-parallel size divides, and shifts everything onto
next-token targets, so padding does not dominate and recompiles stay bounded.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class TrainSequence:
    """One sequence to train on; per-token arrays have the length of `tokens`.

    loss_mask is True where the policy generated the token; sampler_logprobs holds
    the sampler's log-prob of those tokens (0 elsewhere).
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    sampler_logprobs: np.ndarray
    advantage: float
    weight: float = 1.0
    role: str = "agent"

    def __post_init__(self):
        self.tokens = np.asarray(self.tokens, np.int32)
        self.loss_mask = np.asarray(self.loss_mask, bool)
        self.sampler_logprobs = np.asarray(self.sampler_logprobs, np.float32)
        n = len(self.tokens)
        if len(self.loss_mask) != n or len(self.sampler_logprobs) != n:
            raise ValueError(
                f"tokens, loss_mask and sampler_logprobs differ in length: "
                f"{n}, {len(self.loss_mask)}, {len(self.sampler_logprobs)}"
            )


@dataclasses.dataclass
class TrainBatch:
    """Packed rows `(R, T)`. Targets are next tokens; target arrays are aligned to inputs."""

    tokens_RT: np.ndarray
    positions_RT: np.ndarray
    segment_ids_RT: np.ndarray
    targets_RT: np.ndarray
    target_mask_RT: np.ndarray
    sampler_logprobs_RT: np.ndarray
    advantages_RT: np.ndarray
    weights_RT: np.ndarray
    roles_RT: np.ndarray  # 0 = padding, 1 = designer, 2 = agent (for per-role metrics)
    num_sequences: int
    truncated_sequences: int

    @property
    def num_rows(self) -> int:
        return self.tokens_RT.shape[0]

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in dataclasses.asdict(self).items() if isinstance(v, np.ndarray)}


ROLE_IDS = {"designer": 1, "agent": 2}


def bucket_rows(n: int, multiple: int) -> int:
    """Rows `pack` gives `n` packed rows: the next power of two, rounded up to `multiple`."""
    rows = max(n, 1)
    rows = 1 << (rows - 1).bit_length()
    return -(-rows // multiple) * multiple


def pack(sequences: list[TrainSequence], row_length: int, row_multiple: int = 1) -> TrainBatch:
    """First-fit-decreasing packing; sequences longer than `row_length` are cut at the end."""
    if not sequences:
        raise ValueError("pack needs at least one sequence")
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i].tokens))
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = min(len(sequences[i].tokens), row_length)
        for r, space in enumerate(free):
            if space >= n:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_length - n)

    R, T = bucket_rows(len(rows), row_multiple), row_length
    out = {
        "tokens": np.zeros((R, T), np.int32),
        "positions": np.zeros((R, T), np.int32),
        "segments": np.zeros((R, T), np.int32),
        "mask": np.zeros((R, T), bool),
        "sampler": np.zeros((R, T), np.float32),
        "adv": np.zeros((R, T), np.float32),
        "weight": np.zeros((R, T), np.float32),
        "role": np.zeros((R, T), np.int8),
    }
    truncated = 0
    for r, members in enumerate(rows):
        start = 0
        for segment, i in enumerate(members, start=1):
            seq = sequences[i]
            n = min(len(seq.tokens), T)
            truncated += n < len(seq.tokens)
            span = slice(start, start + n)
            out["tokens"][r, span] = seq.tokens[:n]
            out["positions"][r, span] = np.arange(n)
            out["segments"][r, span] = segment
            out["mask"][r, span] = seq.loss_mask[:n]
            out["sampler"][r, span] = seq.sampler_logprobs[:n]
            out["adv"][r, span] = seq.advantage
            out["weight"][r, span] = seq.weight
            out["role"][r, span] = ROLE_IDS.get(seq.role, 2)
            start += n

    # Position t predicts token t+1 of the same segment; the per-token values describe the target.
    same_segment = (out["segments"][:, 1:] == out["segments"][:, :-1]) & (out["segments"][:, 1:] > 0)

    def shift(a, fill=0):
        shifted = np.full_like(a, fill)
        shifted[:, :-1] = a[:, 1:]
        return shifted

    target_mask = shift(out["mask"] & np.pad(same_segment, ((0, 0), (1, 0))), False)
    return TrainBatch(
        tokens_RT=out["tokens"],
        positions_RT=out["positions"],
        segment_ids_RT=out["segments"],
        targets_RT=shift(out["tokens"]),
        target_mask_RT=target_mask,
        sampler_logprobs_RT=np.where(target_mask, shift(out["sampler"]), 0.0).astype(np.float32),
        advantages_RT=np.where(target_mask, shift(out["adv"]), 0.0).astype(np.float32),
        weights_RT=np.where(target_mask, shift(out["weight"]), 0.0).astype(np.float32),
        roles_RT=np.where(target_mask, shift(out["role"]), 0).astype(np.int8),
        num_sequences=len(sequences),
        truncated_sequences=int(truncated),
    )
