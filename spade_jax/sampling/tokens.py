"""Next-token selection from logits: temperature, top-k, top-p, greedy; log-probs of chosen tokens.

Pure functions over `(B, V)` float32 logits, used inside the jitted decode loop.
Randomness is one uniform number per row (inverse-CDF sampling), so drawing a
token costs a cumulative sum over the vocabulary, not `V` random numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def filter_logits(scaled_BV: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks (to -inf) tokens outside the top-k, then outside the top-p nucleus of what remains.

    `scaled_BV` are temperature-scaled logits. `top_k <= 0` keeps every token; `top_p >= 1`
    keeps the whole (top-k) distribution. Tokens tied with the last kept value are kept too.
    """
    V = scaled_BV.shape[-1]
    sorted_BV = -jnp.sort(-scaled_BV, axis=-1)
    rank_V = jnp.arange(V)
    in_top_k = (top_k <= 0) | (rank_V < top_k)
    sorted_BV = jnp.where(in_top_k[None], sorted_BV, -jnp.inf)
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    keep_BV = in_top_k[None] & ((mass_before_BV < top_p) | (rank_V == 0)[None])
    last_kept_B = jnp.sum(keep_BV, axis=-1) - 1
    threshold_B = jnp.take_along_axis(sorted_BV, last_kept_B[:, None], axis=-1)
    return jnp.where(scaled_BV >= threshold_B, scaled_BV, -jnp.inf)


def sample_from_logits(logits_BV: jax.Array, uniform_B: jax.Array) -> jax.Array:
    """Index drawn from softmax(logits) by inverse CDF, given one uniform in [0, 1) per row.

    Tokens of probability zero (masked to -inf) are never drawn.
    """
    probs_BV = jax.nn.softmax(logits_BV.astype(jnp.float32), axis=-1)
    cdf_BV = jnp.cumsum(probs_BV, axis=-1)
    target_B1 = (uniform_B * cdf_BV[:, -1])[:, None]
    index_B = jnp.sum(cdf_BV <= target_B1, axis=-1)
    # Rounding can push the target onto the total; fall back to the last token with mass.
    V = logits_BV.shape[-1]
    last_positive_B = V - 1 - jnp.argmax(probs_BV[:, ::-1] > 0, axis=-1)
    return jnp.minimum(index_B, last_positive_B).astype(jnp.int32)


def select_tokens(
    logits_BV: jax.Array,
    uniform_B: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    truncate: bool,
) -> jax.Array:
    """Next token per row: argmax when `temperature` is 0, else a draw from the tempered softmax.

    `truncate` (static) adds the top-k / top-p filter, which sorts the vocabulary; greedy and
    plain sampling share one program since temperature is a traced value.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    greedy = temperature == 0
    scaled_BV = logits_BV / jnp.where(greedy, 1.0, temperature)
    if truncate:
        scaled_BV = filter_logits(scaled_BV, top_k, top_p)
    sampled_B = sample_from_logits(scaled_BV, uniform_B)
    return jnp.where(greedy, jnp.argmax(logits_BV, axis=-1).astype(jnp.int32), sampled_B)


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array) -> jax.Array:
    """log softmax(logits)[token] in float32: the unmodified policy's log-prob (temperature 1, no truncation)."""
    logits_BV = logits_BV.astype(jnp.float32)
    chosen_B = jnp.take_along_axis(logits_BV, tokens_B[:, None], axis=-1)[:, 0]
    return chosen_B - jax.nn.logsumexp(logits_BV, axis=-1)
