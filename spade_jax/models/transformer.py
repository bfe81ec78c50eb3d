"""Decoder-only transformer in Flax NNX: Llama family and Qwen3 dense.

Layer weights are stacked along a leading `layers` axis and the blocks run under
`jax.lax.scan`, so compile time does not grow with depth. One call signature
serves training (no cache), prefill and decode (with a `KVCache`):

    logits_BTV, cache = model(tokens_BT, positions_BT, segment_ids_BT, cache=None)

Without a cache (training), attention runs in causal query blocks that skip future
keys (`causal_self_attention`), and each block may be rematerialised in the backward
pass (`remat`, see `REMAT_POLICIES`): the scan then keeps only what the policy saves
per layer instead of every intermediate, including the attention probabilities.

`segment_ids_BT` is 0 for padding and >0 for real tokens; a token attends to
earlier tokens of the same segment, so packed training rows and padded prompts
both work. With a cache, new tokens are written at slots
`[cache.end_index, cache.end_index + T)` for every row and attend to all earlier
slots of their segment. Rows may therefore carry padding in the middle (left-padded
prompts, or a later turn appended to an existing conversation) at no cost in
correctness.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax.models.config import ModelConfig
from spade_jax.models.sharding import constrain

_MASKED = -1e30
_CACHE_AXES = ("layers", "batch", "cache_length", "kv_heads", "head_dim")

# What a rematerialised block keeps for the backward pass: "none" = everything (no remat),
# "dots" = outputs of the weight matmuls (attention scores, softmax and elementwise ops are
# recomputed), "full" = only the block's input (the whole block is recomputed).
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}


class KVCache(NamedTuple):
    """Per-layer keys/values plus the segment id written at each slot."""

    k_LBSKH: jax.Array
    v_LBSKH: jax.Array
    segment_ids_BS: jax.Array  # int32; 0 = empty slot
    end_index: jax.Array  # int32 scalar: slots [0, end_index) are written

    @classmethod
    def init(cls, config: ModelConfig, batch: int, length: int, dtype=None) -> "KVCache":
        dtype = jnp.dtype(dtype or config.dtype)
        shape = (config.num_layers, batch, length, config.num_kv_heads, config.head_dim)
        return cls(
            k_LBSKH=jnp.zeros(shape, dtype),
            v_LBSKH=jnp.zeros(shape, dtype),
            segment_ids_BS=jnp.zeros((batch, length), jnp.int32),
            end_index=jnp.zeros((), jnp.int32),
        )

    @property
    def length(self) -> int:
        return self.segment_ids_BS.shape[1]


def _param(rngs: nnx.Rngs, shape, axes, dtype, scale: float | None = None, init: str = "normal"):
    if init == "ones":
        value = jnp.ones(shape, dtype)
    else:
        fan_in = shape[-2] if len(shape) >= 2 and scale is None else 1
        std = scale if scale is not None else 1.0 / math.sqrt(fan_in)
        value = (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype)
    return nnx.Param(value, logical_axes=axes)


def rms_norm(x, weight, eps: float):
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def rope_inverse_frequencies(config: ModelConfig) -> jax.Array:
    """Inverse frequencies, with the Llama-3 long-context rescaling when configured."""
    H = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))
    if config.rope_type == "llama3":
        factor = config.rope_factor
        low_wavelen = config.rope_original_max_position / config.rope_low_freq_factor
        high_wavelen = config.rope_original_max_position / config.rope_high_freq_factor
        wavelen = 2 * jnp.pi / inv_freq
        smooth = (config.rope_original_max_position / wavelen - config.rope_low_freq_factor) / (
            config.rope_high_freq_factor - config.rope_low_freq_factor
        )
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = jnp.where(
            wavelen > low_wavelen,
            inv_freq / factor,
            jnp.where(wavelen < high_wavelen, inv_freq, smoothed),
        )
    return inv_freq


def apply_rope(x_BTNH, positions_BT, inv_freq_H2):
    """Rotary embedding, half-split layout (as Hugging Face Llama/Qwen)."""
    angles = positions_BT[..., None].astype(jnp.float32) * inv_freq_H2
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x = x_BTNH.astype(jnp.float32)
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_BTNH.dtype)


def attention(q_BTNH, k_BSKH, v_BSKH, mask_BTS):
    """Grouped-query attention; softmax in float32."""
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    scores_BKGTS = jnp.einsum(
        "btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32
    ) / math.sqrt(H)
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKGTS, _MASKED)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(v_BSKH.dtype)
    out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS, v_BSKH)
    return out_BTKGH.reshape(B, T, N, H)


def causal_self_attention(q_BTNH, k_BTKH, v_BTKH, mask_BTT):
    """`attention` of a sequence over itself, causal, in query blocks that skip future keys.

    Query block `[s, e)` reads keys `[0, e)` only, as every later key is masked for it:
    close to half the work of the full `(T, T)` product, and smaller working sets. The
    result equals `attention` at every query with at least one visible key; a query that
    sees none (padding, segment 0) gets a different meaningless average, which nothing reads.
    """
    T = q_BTNH.shape[1]
    block = _query_block(T)
    if block >= T:
        return attention(q_BTNH, k_BTKH, v_BTKH, mask_BTT)
    outs = []
    for start in range(0, T, block):
        end = min(start + block, T)
        outs.append(attention(q_BTNH[:, start:end], k_BTKH[:, :end], v_BTKH[:, :end], mask_BTT[:, start:end, :end]))
    return jnp.concatenate(outs, axis=1)


def _query_block(T: int) -> int:
    """128 queries per block (fastest on CPU at 1-2k tokens), at most 16 blocks (bounded program size)."""
    return max(128, -(-T // 16))


def embed_lookup(embed_VD, tokens_BT):
    """Embedding rows of `tokens_BT`, as `(B, T, D)` activations.

    The table is gathered over its `embed` axis first (as FSDP gathers every weight)
    and the tokens are batch-sharded, so the partitioner runs a vocab-parallel gather
    (local rows, then a sum over the vocab shards); gathering straight from the
    `(vocab, embed)`-sharded table forces a full rematerialisation instead.
    """
    embed_VD = constrain(embed_VD, ("vocab", None))
    tokens_BT = constrain(tokens_BT, ("batch", "length"))
    return constrain(jnp.take(embed_VD, tokens_BT, axis=0), ("batch", "length", "embed"))


class MLP(nnx.Module):
    """SwiGLU feed-forward, weights stacked over layers."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        L, D, F = config.num_layers, config.hidden_size, config.intermediate_size
        dt = jnp.dtype(config.param_dtype)
        self.gate_LDF = _param(rngs, (L, D, F), ("layers", "embed", "mlp"), dt)
        self.up_LDF = _param(rngs, (L, D, F), ("layers", "embed", "mlp"), dt)
        self.down_LFD = _param(rngs, (L, F, D), ("layers", "mlp", "embed"), dt)

    def layer_weights(self) -> dict:
        return {"gate": self.gate_LDF[...], "up": self.up_LDF[...], "down": self.down_LFD[...]}

    @staticmethod
    def apply(w: dict, x_BTD):
        dt = x_BTD.dtype
        gate_BTF = x_BTD @ w["gate"].astype(dt)
        up_BTF = x_BTD @ w["up"].astype(dt)
        hidden_BTF = constrain(jax.nn.silu(gate_BTF) * up_BTF, ("batch", "length", "mlp"))
        return hidden_BTF @ w["down"].astype(dt)


class Attention(nnx.Module):
    """Grouped-query self-attention projections (+ Qwen3 per-head q/k RMSNorm), stacked over layers."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        L, D = config.num_layers, config.hidden_size
        N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
        dt = jnp.dtype(config.param_dtype)
        self.q_LDNH = _param(rngs, (L, D, N, H), ("layers", "embed", "heads", "head_dim"), dt, D**-0.5)
        self.k_LDKH = _param(rngs, (L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), dt, D**-0.5)
        self.v_LDKH = _param(rngs, (L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), dt, D**-0.5)
        self.o_LNHD = _param(
            rngs, (L, N, H, D), ("layers", "heads", "head_dim", "embed"), dt, (N * H) ** -0.5
        )
        if config.qk_norm:
            self.q_norm_LH = _param(rngs, (L, H), ("layers", "head_dim"), dt, init="ones")
            self.k_norm_LH = _param(rngs, (L, H), ("layers", "head_dim"), dt, init="ones")

    def layer_weights(self) -> dict:
        w = {"q": self.q_LDNH[...], "k": self.k_LDKH[...], "v": self.v_LDKH[...], "o": self.o_LNHD[...]}
        if hasattr(self, "q_norm_LH"):
            w["q_norm"] = self.q_norm_LH[...]
            w["k_norm"] = self.k_norm_LH[...]
        return w


class Transformer(nnx.Module):
    """The policy network: embeddings, `num_layers` scanned blocks, final norm, LM head."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        V, D, L = config.vocab_size, config.hidden_size, config.num_layers
        dt = jnp.dtype(config.param_dtype)
        self.embed_VD = _param(rngs, (V, D), ("vocab", "embed"), dt, scale=1.0)
        self.attn_norm_LD = _param(rngs, (L, D), ("layers", "embed"), dt, init="ones")
        self.attn = Attention(config, rngs)
        self.mlp_norm_LD = _param(rngs, (L, D), ("layers", "embed"), dt, init="ones")
        self.mlp = MLP(config, rngs)
        self.final_norm_D = _param(rngs, (D,), ("embed",), dt, init="ones")
        if not config.tie_word_embeddings:
            self.lm_head_DV = _param(rngs, (D, V), ("embed", "vocab"), dt)

    def __call__(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        segment_ids_BT: jax.Array,
        cache: KVCache | None = None,
        *,
        remat: str = "none",
    ) -> tuple[jax.Array, KVCache | None]:
        hidden_BTD, new_cache = self.hidden_and_cache(tokens_BT, positions_BT, segment_ids_BT, cache, remat=remat)
        return self.logits_from_hidden(hidden_BTD), new_cache

    def logits_from_hidden(self, hidden_BTD: jax.Array) -> jax.Array:
        head_DV = (
            self.embed_VD[...].T if self.config.tie_word_embeddings else self.lm_head_DV[...]
        ).astype(hidden_BTD.dtype)
        logits_BTV = jnp.einsum("btd,dv->btv", hidden_BTD, head_DV, preferred_element_type=jnp.float32)
        return constrain(logits_BTV, ("batch", "length", "vocab"))

    def hidden_and_cache(self, tokens_BT, positions_BT, segment_ids_BT, cache=None, *, remat: str = "none"):
        """Final-normed hidden states `(B, T, D)` and the updated cache.

        `remat` (a key of `REMAT_POLICIES`) only changes memory and compute of a backward
        pass through this call, never its values.
        """
        if remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {remat!r}; choose one of {sorted(REMAT_POLICIES)}")
        cfg = self.config
        dt = jnp.dtype(cfg.dtype)
        x_BTD = embed_lookup(self.embed_VD[...], tokens_BT).astype(dt)
        inv_freq = rope_inverse_frequencies(cfg)
        B, T = tokens_BT.shape

        if cache is None:
            t = jnp.arange(T)
            causal_TS = t[:, None] >= t[None, :]
            key_segments_BS = segment_ids_BT
            write_at = None
        else:
            write_at = cache.end_index
            key_segments_BS = jax.lax.dynamic_update_slice(
                cache.segment_ids_BS, segment_ids_BT.astype(jnp.int32), (0, write_at)
            )
            causal_TS = (write_at + jnp.arange(T))[:, None] >= jnp.arange(cache.length)[None, :]
        mask_BTS = (
            causal_TS[None]
            & (segment_ids_BT[:, :, None] == key_segments_BS[:, None, :])
            & (segment_ids_BT[:, :, None] != 0)
        )

        weights = {
            "attn_norm": self.attn_norm_LD[...],
            "mlp_norm": self.mlp_norm_LD[...],
            "attn": self.attn.layer_weights(),
            "mlp": self.mlp.layer_weights(),
        }

        def block(carry, layer):
            x_BTD, k_LBSKH, v_LBSKH = carry
            w, index = layer
            a = w["attn"]
            h_BTD = rms_norm(x_BTD, w["attn_norm"], cfg.rms_norm_eps)
            q_BTNH = jnp.einsum("btd,dnh->btnh", h_BTD, a["q"].astype(dt))
            k_BTKH = jnp.einsum("btd,dkh->btkh", h_BTD, a["k"].astype(dt))
            v_BTKH = jnp.einsum("btd,dkh->btkh", h_BTD, a["v"].astype(dt))
            if cfg.qk_norm:
                q_BTNH = rms_norm(q_BTNH, a["q_norm"], cfg.rms_norm_eps)
                k_BTKH = rms_norm(k_BTKH, a["k_norm"], cfg.rms_norm_eps)
            q_BTNH = constrain(apply_rope(q_BTNH, positions_BT, inv_freq), ("batch", "length", "heads", None))
            k_BTKH = apply_rope(k_BTKH, positions_BT, inv_freq)
            if write_at is None:
                out_BTNH = causal_self_attention(q_BTNH, k_BTKH.astype(dt), v_BTKH.astype(dt), mask_BTS)
            else:
                # Write this layer's new keys/values in place in the carried cache, then read the layer back.
                at = (index, 0, write_at, 0, 0)
                k_LBSKH = jax.lax.dynamic_update_slice(k_LBSKH, k_BTKH[None].astype(k_LBSKH.dtype), at)
                v_LBSKH = jax.lax.dynamic_update_slice(v_LBSKH, v_BTKH[None].astype(v_LBSKH.dtype), at)
                keys_BSKH = jax.lax.dynamic_index_in_dim(k_LBSKH, index, keepdims=False)
                values_BSKH = jax.lax.dynamic_index_in_dim(v_LBSKH, index, keepdims=False)
                out_BTNH = attention(q_BTNH, keys_BSKH.astype(dt), values_BSKH.astype(dt), mask_BTS)
            x_BTD = x_BTD + jnp.einsum("btnh,nhd->btd", out_BTNH, a["o"].astype(dt))
            x_BTD = constrain(x_BTD, ("batch", "length", "embed"))
            h_BTD = rms_norm(x_BTD, w["mlp_norm"], cfg.rms_norm_eps)
            x_BTD = constrain(x_BTD + MLP.apply(w["mlp"], h_BTD), ("batch", "length", "embed"))
            return (x_BTD, k_LBSKH, v_LBSKH), None

        layers = (weights, jnp.arange(cfg.num_layers))
        if cache is None:
            if REMAT_POLICIES[remat] is not None:
                block = jax.checkpoint(block, policy=REMAT_POLICIES[remat], prevent_cse=False)
            (x_BTD, _, _), _ = jax.lax.scan(block, (x_BTD, None, None), layers)
            new_cache = None
        else:
            k_LBSKH = constrain(cache.k_LBSKH, _CACHE_AXES)
            v_LBSKH = constrain(cache.v_LBSKH, _CACHE_AXES)
            (x_BTD, k_LBSKH, v_LBSKH), _ = jax.lax.scan(block, (x_BTD, k_LBSKH, v_LBSKH), layers)
            new_cache = KVCache(
                constrain(k_LBSKH, _CACHE_AXES),
                constrain(v_LBSKH, _CACHE_AXES),
                constrain(key_segments_BS, ("batch", "cache_length")),
                write_at + T,
            )
        return rms_norm(x_BTD, self.final_norm_D[...], cfg.rms_norm_eps), new_cache
