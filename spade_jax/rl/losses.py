"""Token-level clipped policy-gradient loss (GRPO/DAPO style) as pure jax.numpy functions.

`pg_loss_terms` returns SUMS over tokens and the token COUNT separately, never a mean.
The loss of a batch is ``total loss_sum / total token_count``, where both totals run over
every micro-batch of the gradient-accumulation step. Summing micro-batch gradients of
``loss_sum`` and dividing by the total count gives exactly the gradient of the one-batch
token mean, whatever the number of tokens in each micro-batch; averaging per-micro-batch
means would not (it would over-weight the tokens of short micro-batches). Metrics follow
the same rule: ``*_sum`` entries divide by the total count (`mean_metrics`), ``*_min`` /
``*_max`` entries combine with min / max (`accumulate`).

Per token t of sequence b, with r = exp(logp - old) and A the advantage:
    pg   = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
    tis  = min(exp(old - sampler), tis_cap)          (stop-gradient; 1 without sampler)
    kl   = exp(ref - logp) - (ref - logp) - 1        (k3 estimator of KL(pi || ref))
    loss_sum    = sum_bt mask * weight_b * (tis * pg + kl_coef * kl)
    token_count = sum_bt mask
``old`` is the trainer's log-prob of the sampled token at sampling time (the PPO
anchor); ``sampler`` is what the sampler reported for it; the truncated importance
weight corrects for the sampler computing a slightly different distribution than the
trainer (different kernels, precision or sharding) without letting rare large ratios
dominate. The weight multiplies the policy-gradient term only, not the KL penalty.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

class PGLossTerms(NamedTuple):
    """loss_sum, token_count: scalars (see module docstring); metrics: name -> scalar."""

    loss_sum: jax.Array
    token_count: jax.Array
    metrics: dict[str, jax.Array]


def token_logprobs(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """log softmax(logits)[target] per position, float32, shape (B, T).

    Computed as logit[target] - logsumexp(logits) so no (B, T, V) float32 log-softmax
    is materialised beyond the upcast logits.
    """
    logits = logits_BTV.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def token_logprobs_and_entropy(logits_BTV: jax.Array, targets_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`token_logprobs` and the (stop-gradient) `entropy` per position from one logsumexp.

    Same values as the two functions apart; the entropy is a metric, so no gradient
    flows through it and only the log-probs need a backward pass.
    """
    logits = logits_BTV.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    logits_sg, lse_sg = jax.lax.stop_gradient(logits), jax.lax.stop_gradient(lse)
    probs = jnp.exp(logits_sg - lse_sg[..., None])
    return picked - lse, lse_sg - jnp.sum(probs * logits_sg, axis=-1)


def entropy(logits_BTV: jax.Array, mask_BT: jax.Array | None = None) -> jax.Array:
    """Entropy of softmax(logits) per position in nats, float32, shape (B, T); 0 where mask is 0."""
    logits = logits_BTV.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    probs = jnp.exp(logits - lse[..., None])
    ent = lse - jnp.sum(probs * logits, axis=-1)
    if mask_BT is None:
        return ent
    return jnp.where(mask_BT.astype(bool), ent, 0.0)


def pg_loss_terms(
    logprobs_BT: jax.Array,
    old_logprobs_BT: jax.Array,
    advantages: jax.Array,
    mask_BT: jax.Array,
    *,
    sampler_logprobs_BT: jax.Array | None = None,
    weights_B: jax.Array | None = None,
    ref_logprobs_BT: jax.Array | None = None,
    kl_coef: float = 0.0,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    tis_cap: float = 2.0,
    entropy_BT: jax.Array | None = None,
) -> PGLossTerms:
    """Sums of the clipped policy-gradient loss and its metrics over the masked tokens.

    logprobs_BT: current policy log-probs of the sampled tokens (differentiated).
    old_logprobs_BT, sampler_logprobs_BT, ref_logprobs_BT: constants (stop-gradient).
    advantages: (B,) per sequence or (B, T) per token. mask_BT: 1 on tokens the policy
    generated, 0 on prompt, observation and padding tokens. weights_B: per-sequence
    (B,) or per-token (B, T) loss weights (role weight x optional regret weight; packed
    rows carry several sequences, hence per token), default 1; they scale the
    numerator only, the denominator counts tokens. entropy_BT: optional per-token
    entropies (see `entropy`) to report as ``entropy_sum``.
    """
    mask = mask_BT.astype(jnp.float32)
    on = mask > 0
    logp = logprobs_BT.astype(jnp.float32)
    old = jax.lax.stop_gradient(old_logprobs_BT.astype(jnp.float32))
    adv = jax.lax.stop_gradient(advantages.astype(jnp.float32))
    if adv.ndim == 1:
        adv = adv[:, None]
    # Masked positions may hold padding garbage: zero the exponents there before exp.
    log_ratio = jnp.where(on, logp - old, 0.0)
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * clipped_ratio
    pg = jnp.maximum(pg_unclipped, pg_clipped)

    if sampler_logprobs_BT is None:
        tis = jnp.ones_like(mask)
        tis_capped = jnp.zeros_like(mask)
    else:
        sampler = sampler_logprobs_BT.astype(jnp.float32)
        raw = jnp.exp(jnp.where(on, old - sampler, 0.0))
        tis = jax.lax.stop_gradient(jnp.minimum(raw, tis_cap))
        tis_capped = (raw > tis_cap).astype(jnp.float32)

    token_loss = tis * pg
    metrics = {}
    if ref_logprobs_BT is not None:
        ref = jax.lax.stop_gradient(ref_logprobs_BT.astype(jnp.float32))
        d = jnp.where(on, ref - logp, 0.0)
        kl = jnp.exp(d) - d - 1.0
        token_loss = token_loss + kl_coef * kl
        metrics["ref_kl_sum"] = jnp.sum(mask * jax.lax.stop_gradient(kl))

    weights = jnp.ones(mask.shape[:1], jnp.float32) if weights_B is None else weights_B.astype(jnp.float32)
    if weights.ndim == 1:
        weights = weights[:, None]
    loss_sum = jnp.sum(mask * weights * token_loss)

    sg = jax.lax.stop_gradient
    r = sg(ratio)
    clip_low = (r < 1.0 - eps_low) & (adv < 0)
    clip_high = (r > 1.0 + eps_high) & (adv > 0)
    metrics.update(
        pg_loss_sum=jnp.sum(mask * weights * sg(tis * pg)),
        clip_low_sum=jnp.sum(mask * clip_low),
        clip_high_sum=jnp.sum(mask * clip_high),
        clip_frac_sum=jnp.sum(mask * (clip_low | clip_high)),
        ratio_sum=jnp.sum(mask * r),
        ratio_min=jnp.min(jnp.where(on, r, jnp.inf)),
        ratio_max=jnp.max(jnp.where(on, r, -jnp.inf)),
        approx_kl_sum=jnp.sum(mask * (r - 1.0 - sg(log_ratio))),
        tis_sum=jnp.sum(mask * tis),
        tis_capped_sum=jnp.sum(mask * tis_capped),
    )
    if entropy_BT is not None:
        metrics["entropy_sum"] = jnp.sum(mask * sg(entropy_BT.astype(jnp.float32)))
    return PGLossTerms(loss_sum=loss_sum, token_count=jnp.sum(mask), metrics=metrics)


def accumulate(a: PGLossTerms, b: PGLossTerms) -> PGLossTerms:
    """Combines the terms of two micro-batches: sums add, ``*_min``/``*_max`` take min/max."""
    metrics = {}
    for k in a.metrics:
        if k.endswith("_min"):
            metrics[k] = jnp.minimum(a.metrics[k], b.metrics[k])
        elif k.endswith("_max"):
            metrics[k] = jnp.maximum(a.metrics[k], b.metrics[k])
        else:
            metrics[k] = a.metrics[k] + b.metrics[k]
    return PGLossTerms(a.loss_sum + b.loss_sum, a.token_count + b.token_count, metrics)


def identity_terms(like: PGLossTerms) -> PGLossTerms:
    """Terms that `accumulate` leaves any terms shaped like `like` unchanged by, exactly.

    0 for sums and counts, +inf for ``*_min``, -inf for ``*_max``: the start of an
    accumulation loop that runs every micro-batch in its body.
    """

    def fill(name):
        return jnp.inf if name.endswith("_min") else -jnp.inf if name.endswith("_max") else 0.0

    def zero(x):
        return jnp.zeros(x.shape, x.dtype)

    metrics = {k: jnp.full(v.shape, fill(k), v.dtype) for k, v in like.metrics.items()}
    return PGLossTerms(zero(like.loss_sum), zero(like.token_count), metrics)


def mean_metrics(terms: PGLossTerms) -> dict[str, jax.Array]:
    """Token means of the accumulated terms: loss, pg_loss, clip_frac, ratio_mean, ...

    ``x_sum`` becomes ``x`` (``ratio_sum`` becomes ``ratio_mean``) divided by the token
    count (max 1, so an all-masked batch gives zeros); min/max pass through.
    """
    denom = jnp.maximum(terms.token_count, 1.0)
    out = {"loss": terms.loss_sum / denom, "tokens": terms.token_count}
    for k, v in terms.metrics.items():
        if k.endswith("_sum"):
            name = "ratio_mean" if k == "ratio_sum" else k[: -len("_sum")]
            out[name] = v / denom
        else:
            out[k] = v
    return out


__all__ = ["PGLossTerms", "accumulate", "entropy", "identity_terms", "mean_metrics",
           "pg_loss_terms", "token_logprobs", "token_logprobs_and_entropy"]
