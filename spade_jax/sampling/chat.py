"""Chats to completions: the chat template, the rollout engine's rows, the decoded replies.

The designer, the hint writer, the self-review and the one-reply evaluations all ask the
policy one question per item; this is the one place that turns their chats into sampled
replies. They run on the same `RowEngine` as the agent's episodes (`generate_on_rows`): a
row takes the next chat as soon as its reply ends.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from spade_jax.sampling.engine import generate_on_rows


@dataclasses.dataclass(frozen=True)
class Completion:
    """One reply: the prompt's token ids, the generated ids (with the stop token when one
    ended it), their sampler log-probabilities and the decoded text."""

    prompt_tokens: list[int]
    tokens: np.ndarray
    logprobs: np.ndarray
    text: str


def complete_chats(policy, chats: Sequence[Sequence[dict]], *, max_new_tokens: int, temperature: float = 1.0,
                   top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                   limits: Sequence[int] | None = None) -> list[Completion]:
    """One completion per chat (a list of ``{"role", "content"}`` messages); ``limits``: each
    chat's own reply budget, at most ``max_new_tokens`` (None: ``max_new_tokens`` for all)."""
    if not chats:
        return []
    tokenizer = policy.tokenizer
    prompts = [tokenizer.apply_chat_template(list(chat), add_generation_prompt=True) for chat in chats]
    generation = generate_on_rows(policy, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                  top_k=top_k, seed=seed, limits=limits)
    completions = []
    for i, prompt in enumerate(prompts):
        n = int(generation.lengths[i])
        tokens = generation.tokens[i, :n]
        completions.append(Completion(list(prompt), tokens, generation.logprobs[i, :n], tokenizer.decode(tokens)))
    return completions
