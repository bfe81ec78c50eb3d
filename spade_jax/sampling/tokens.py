"""Next-token selection from logits: temperature, top-k, top-p, greedy; log-probs of chosen tokens.

Pure functions over `(B, V)` float32 logits, used inside the jitted decode loop.
Sampling is Gumbel-max: argmax(logits / T + Gumbel noise) is an exact draw from
softmax(logits / T), and tokens masked to -inf are never drawn. The formulations
avoid the slow paths of XLA:CPU (a variadic argmax reduction, a comparator sort).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def first_argmax(x_BV: jax.Array) -> jax.Array:
    """Index of the first maximum per row (as `jnp.argmax`), from two plain reductions."""
    V = x_BV.shape[-1]
    is_max_BV = x_BV == jnp.max(x_BV, axis=-1, keepdims=True)
    return jnp.min(jnp.where(is_max_BV, jnp.arange(V, dtype=jnp.int32), V), axis=-1)


def filter_logits(scaled_BV: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Masks (to -inf) tokens outside the top-k, then outside the top-p nucleus of what remains.

    `scaled_BV` are temperature-scaled logits; `top_k` and `top_p` are scalars or one value per
    row. `top_k <= 0` keeps every token; `top_p >= 1` keeps the whole (top-k) distribution.
    Tokens tied with the last kept value are kept too.

    Rather than sorting the vocabulary (XLA:CPU's sort is slow), each cut is found by
    bisection over the order-preserving integer image of the float logits: the kept set
    is `{logit >= threshold}`, with the threshold the largest key that still keeps k
    tokens (top-k) or probability mass >= p (top-p). 32 halvings pin it down exactly; a
    cut no row asks for is skipped.
    """
    B = scaled_BV.shape[0]
    top_k_B, top_p_B = jnp.broadcast_to(top_k, (B,)), jnp.broadcast_to(top_p, (B,))
    keys_BV = _ordered_keys(scaled_BV)
    none_B = jnp.zeros(keys_BV.shape[:1], jnp.uint32)  # key 0: every token kept

    def top_k_threshold():
        k_B = jnp.minimum(top_k_B, scaled_BV.shape[-1])
        return _largest_key_where(lambda m_B1: jnp.sum(keys_BV >= m_B1, axis=-1) >= k_B, keys_BV)

    cut_k_B = top_k_B > 0
    keep_min_B = jnp.where(cut_k_B, jax.lax.cond(jnp.any(cut_k_B), top_k_threshold, lambda: none_B), none_B)
    weights_BV = jnp.where(keys_BV >= keep_min_B[:, None], jnp.exp(scaled_BV - jnp.max(scaled_BV, -1, keepdims=True)), 0.0)

    def top_p_threshold():
        needed_B = top_p_B * jnp.sum(weights_BV, axis=-1)
        mass = lambda m_B1: jnp.sum(jnp.where(keys_BV >= m_B1, weights_BV, 0.0), axis=-1)
        return _largest_key_where(lambda m_B1: mass(m_B1) >= needed_B, keys_BV)

    cut_p_B = top_p_B < 1
    keep_min_B = jnp.where(cut_p_B, jax.lax.cond(jnp.any(cut_p_B), top_p_threshold, lambda: keep_min_B), keep_min_B)
    return jnp.where(keys_BV >= keep_min_B[:, None], scaled_BV, -jnp.inf)


def _ordered_keys(x_BV: jax.Array) -> jax.Array:
    """uint32 keys with the order of the float32 values (-inf smallest)."""
    bits = jax.lax.bitcast_convert_type(x_BV.astype(jnp.float32), jnp.int32)
    bits = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
    return jax.lax.bitcast_convert_type(bits, jnp.uint32) ^ jnp.uint32(0x80000000)


def _largest_key_where(holds, keys_BV: jax.Array) -> jax.Array:
    """Per row, the largest key m with `holds(m)`, for a predicate that holds up to some key.

    The search starts from the row's smallest key, where the predicates used here hold.
    """
    def halve(_, bounds):
        lo_B, hi_B = bounds
        gap_B = hi_B - lo_B
        mid_B = lo_B + gap_B // 2 + gap_B % 2  # upper middle, no uint32 overflow
        ok_B = holds(mid_B[:, None])
        return jnp.where(ok_B, mid_B, lo_B), jnp.where(ok_B, hi_B, mid_B - 1)

    bounds = (jnp.min(keys_BV, axis=-1), jnp.max(keys_BV, axis=-1))
    return jax.lax.fori_loop(0, 32, halve, bounds)[0]


def select_tokens(
    logits_BV: jax.Array,
    keys_B: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    *,
    truncate: bool,
) -> jax.Array:
    """Next token per row: argmax where the temperature is 0, else a draw from the tempered softmax.

    `keys_B` holds one PRNG key per row, so a row's draw does not depend on the other rows.
    `temperature`, `top_k` and `top_p` are scalars or one value per row (rows with different
    settings sample in one batch; a row draws what it would draw in a batch of its own settings).
    `truncate` (static) adds the top-k / top-p filter (a few dozen passes over the logits);
    greedy and plain sampling share one program since temperature is a traced value.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    B, V = logits_BV.shape
    temperature_B = jnp.broadcast_to(temperature, (B,))
    greedy_B = temperature_B == 0
    scaled_BV = logits_BV / jnp.where(greedy_B, 1.0, temperature_B)[:, None]
    if truncate:
        scaled_BV = filter_logits(scaled_BV, top_k, top_p)
    noise_BV = jax.lax.cond(
        jnp.all(greedy_B),
        lambda: jnp.zeros_like(scaled_BV),
        lambda: jax.vmap(lambda key: jax.random.gumbel(key, (V,), jnp.float32))(keys_B),
    )
    return first_argmax(scaled_BV + jnp.where(greedy_B[:, None], 0.0, noise_BV))


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array) -> jax.Array:
    """log softmax(logits)[token] in float32: the unmodified policy's log-prob (temperature 1, no truncation)."""
    logits_BV = logits_BV.astype(jnp.float32)
    chosen_B = jnp.take_along_axis(logits_BV, tokens_B[:, None], axis=-1)[:, 0]
    return chosen_B - jax.nn.logsumexp(logits_BV, axis=-1)
