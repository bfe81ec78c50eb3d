"""Decoder-only transformer in Flax NNX: Llama family, Qwen3 dense and Qwen3-MoE.

Each layer keeps its own parameter arrays (`Transformer.layers`, one `Block` each),
and so does the `KVCache`. The two paths use them differently:

- without a cache (training, scoring), the layers' weights are stacked inside the
  program and the blocks run under `jax.lax.scan`, so compile time does not grow
  with depth (the stack is one pass over the weights, small next to a training step);
  a model that mixes dense and sparse (MoE) layers scans each run of same-kind layers;
- with a cache (prefill, decode), the layers are unrolled over the separate arrays.
  Every matmul then reads its weights and every attention its cache where they lie:
  a layer picked out of stacked arrays by the scan's index is copied first on
  XLA:CPU, the whole model and cache once more per decoded token.

One call signature serves both:

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

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from spade_jax.models.config import ModelConfig
from spade_jax.models.moe import moe_forward
from spade_jax.models.sharding import constrain

_MASKED = -1e30
_KEY_CACHE_AXES = ("batch", "kv_heads", "head_dim", "cache_length")
_VALUE_CACHE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")

# What a rematerialised block keeps for the backward pass: "none" = everything (no remat),
# "dots" = outputs of the weight matmuls (attention scores, softmax and elementwise ops are
# recomputed), "full" = only the block's input (the whole block is recomputed).
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
}


class KVCache(NamedTuple):
    """Per-layer keys/values plus the segment id written at each slot.

    Laid out as attention multiplies them, batch and kv heads leading: keys
    `(batch, kv_heads, head_dim, length)`, values `(batch, kv_heads, length, head_dim)`.
    Both products then contract the second-to-last axis of the cache, which XLA:CPU runs
    without repacking it every step (see bench/RESULTS.md).
    """

    k_BKHS: tuple[jax.Array, ...]  # one array per layer
    v_BKSH: tuple[jax.Array, ...]
    segment_ids_BS: jax.Array  # int32; 0 = empty slot
    end_index: jax.Array  # int32 scalar: slots [0, end_index) are written

    @classmethod
    def init(cls, config: ModelConfig, batch: int, length: int, dtype=None) -> "KVCache":
        dtype = jnp.dtype(dtype or config.dtype)
        K, H = config.num_kv_heads, config.head_dim
        return cls(
            k_BKHS=tuple(jnp.zeros((batch, K, H, length), dtype) for _ in range(config.num_layers)),
            v_BKSH=tuple(jnp.zeros((batch, K, length, H), dtype) for _ in range(config.num_layers)),
            segment_ids_BS=jnp.zeros((batch, length), jnp.int32),
            end_index=jnp.zeros((), jnp.int32),
        )

    @property
    def length(self) -> int:
        return self.segment_ids_BS.shape[1]


def _init_value(rngs: nnx.Rngs, shape, dtype, scale: float | None = None, init: str = "normal") -> jax.Array:
    if init == "ones":
        return jnp.ones(shape, dtype)
    fan_in = shape[-2] if len(shape) >= 2 and scale is None else 1
    std = scale if scale is not None else 1.0 / math.sqrt(fan_in)
    return (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype)


def _param(rngs: nnx.Rngs, shape, axes, dtype, scale: float | None = None, init: str = "normal"):
    return nnx.Param(_init_value(rngs, shape, dtype, scale, init), logical_axes=axes)


def at_least_float32(dtype) -> jnp.dtype:
    """The dtype norms, rope, softmax and logits are computed in: float32, or float64 for a float64 model."""
    return jnp.promote_types(dtype, jnp.float32)


# Up to this many rows, `linear` multiplies weight-first on XLA:CPU: faster for decode-sized
# row counts, slower for long sequences (see bench/RESULTS.md).
_WEIGHT_FIRST_MAX_ROWS = 256


def linear(x_BTI, w_OI, out_dtype=None):
    """`x @ w.T` for a weight stored `(out, in)`, as torch.nn.Linear stores it.

    With few rows (a decode step) on CPU it is computed weight-first, `(w @ x.T).T`: the
    weight is then the left operand in its stored layout, which XLA:CPU's matmul runs
    faster (see bench/RESULTS.md). The barrier keeps XLA from folding the transpose back
    into the product.
    """
    rows = math.prod(x_BTI.shape[:-1])
    if rows <= _WEIGHT_FIRST_MAX_ROWS and jax.default_backend() == "cpu":
        y_OR = jnp.matmul(w_OI, x_BTI.reshape(rows, -1).T, preferred_element_type=out_dtype)
        return jax.lax.optimization_barrier(y_OR).T.reshape(*x_BTI.shape[:-1], w_OI.shape[0])
    return jnp.matmul(x_BTI, w_OI.T, preferred_element_type=out_dtype)


def rms_norm(x, weight, eps: float):
    wide = at_least_float32(x.dtype)
    x_wide = x.astype(wide)
    # Sum of squares as a contraction: one small matmul on XLA:CPU instead of a reduce kernel.
    mean_square = jnp.einsum("...d,...d->...", x_wide, x_wide)[..., None] / x.shape[-1]
    normed = x_wide * jax.lax.rsqrt(mean_square + eps)
    return (normed * weight.astype(wide)).astype(x.dtype)


def rope_inverse_frequencies(config: ModelConfig) -> jax.Array:
    """Inverse frequencies, with the Llama-3 long-context rescaling when configured."""
    H = config.head_dim
    wide = at_least_float32(config.dtype)
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, H, 2, dtype=wide) / H))
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
    """Rotary embedding, half-split layout (as Hugging Face Llama/Qwen).

    The angles are recomputed per call (q and k of every layer) on purpose: XLA fuses them
    into the rotation, which decodes faster than computing cos/sin once per pass and
    reading them back in every layer.
    """
    angles = positions_BT[..., None].astype(inv_freq_H2.dtype) * inv_freq_H2
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x = x_BTNH.astype(at_least_float32(x_BTNH.dtype))
    x1, x2 = jnp.split(x, 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_BTNH.dtype)


def attention(q_BTNH, k_BKHS, v_BKSH, mask_BTS):
    """Grouped-query attention over keys `(batch, kv_heads, head_dim, length)` and values
    `(batch, kv_heads, length, head_dim)` (the `KVCache` layout); softmax in (at least) float32.

    The scores are a matmul, not products summed over `head_dim`: those are fast for
    SmolLM2's shapes but far slower on XLA:CPU for one query per kv head over a long cache
    (see bench/RESULTS.md).
    """
    B, T, N, H = q_BTNH.shape
    K = k_BKHS.shape[1]
    q_BKGTH = q_BTNH.reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
    scores_BKGTS = jnp.einsum(
        "bkgth,bkhs->bkgts", q_BKGTH, k_BKHS, preferred_element_type=at_least_float32(q_BTNH.dtype)
    ) / math.sqrt(H)
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKGTS, _MASKED)
    probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(v_BKSH.dtype)
    out_BKGTH = jnp.einsum("bkgts,bksh->bkgth", probs_BKGTS, v_BKSH)
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def attention_with_history(q_BTNH, k_BKHS, v_BKSH, mask_BTS, k_BKHT, v_BKTH, mask_BTT):
    """`attention` over two key sets at once, a cache `S` and the chunk's own `T` keys, with one
    softmax across both: the same result as concatenating them, without copying the cache."""
    B, T, N, H = q_BTNH.shape
    K = k_BKHS.shape[1]
    wide = at_least_float32(q_BTNH.dtype)
    q_BKGTH = q_BTNH.reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
    scale = 1 / math.sqrt(H)
    cached_BKGTS = jnp.einsum("bkgth,bkhs->bkgts", q_BKGTH, k_BKHS, preferred_element_type=wide) * scale
    own_BKGTU = jnp.einsum("bkgth,bkhu->bkgtu", q_BKGTH, k_BKHT, preferred_element_type=wide) * scale
    cached_BKGTS = jnp.where(mask_BTS[:, None, None], cached_BKGTS, _MASKED)
    own_BKGTU = jnp.where(mask_BTT[:, None, None], own_BKGTU, _MASKED)
    top = jnp.maximum(cached_BKGTS.max(-1, keepdims=True), own_BKGTU.max(-1, keepdims=True))
    cached_BKGTS = jnp.exp(cached_BKGTS - top)
    own_BKGTU = jnp.exp(own_BKGTU - top)
    total = cached_BKGTS.sum(-1, keepdims=True) + own_BKGTU.sum(-1, keepdims=True)
    dt = v_BKSH.dtype
    out_BKGTH = (jnp.einsum("bkgts,bksh->bkgth", (cached_BKGTS / total).astype(dt), v_BKSH)
                 + jnp.einsum("bkgtu,bkuh->bkgth", (own_BKGTU / total).astype(dt), v_BKTH))
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def causal_self_attention(q_BTNH, k_BTKH, v_BTKH, mask_BTT):
    """`attention` of a sequence over itself, causal, in query blocks that skip future keys.

    Query block `[s, e)` reads keys `[0, e)` only, as every later key is masked for it:
    close to half the work of the full `(T, T)` product, and smaller working sets. The
    result equals `attention` at every query with at least one visible key; a query that
    sees none (padding, segment 0) gets a different meaningless average, which nothing reads.
    """
    T = q_BTNH.shape[1]
    k_BKHT, v_BKTH = k_BTKH.transpose(0, 2, 3, 1), v_BTKH.transpose(0, 2, 1, 3)
    block = _query_block(T)
    if block >= T:
        return attention(q_BTNH, k_BKHT, v_BKTH, mask_BTT)
    outs = []
    for start in range(0, T, block):
        end = min(start + block, T)
        outs.append(attention(
            q_BTNH[:, start:end], k_BKHT[..., :end], v_BKTH[:, :, :end], mask_BTT[:, start:end, :end]
        ))
    return jnp.concatenate(outs, axis=1)


def _same_kind_runs(config: ModelConfig) -> list[list[int]]:
    """The layers split into maximal runs of consecutive dense or sparse layers: one scan each."""
    runs: list[list[int]] = []
    for i, sparse in enumerate(config.sparse_layers):
        if runs and config.sparse_layers[runs[-1][-1]] == sparse:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


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
    """SwiGLU feed-forward weights of one layer, stored `(out, in)`."""

    def __init__(self, gate_FD, up_FD, down_DF):
        self.gate_FD = nnx.Param(gate_FD, logical_axes=("mlp", "embed"))
        self.up_FD = nnx.Param(up_FD, logical_axes=("mlp", "embed"))
        self.down_DF = nnx.Param(down_DF, logical_axes=("embed", "mlp"))

    @staticmethod
    def draw(config: ModelConfig, rngs: nnx.Rngs, num_layers: int) -> dict:
        """Initial values of `num_layers` layers, `(layers, ...)` each: drawn `(in, out)`, the
        layout whose fan-in `_init_value` reads, then transposed to the stored `(out, in)`."""
        L, D, F = num_layers, config.hidden_size, config.intermediate_size
        dt = jnp.dtype(config.param_dtype)
        return {
            "gate_FD": _init_value(rngs, (L, D, F), dt).swapaxes(1, 2),
            "up_FD": _init_value(rngs, (L, D, F), dt).swapaxes(1, 2),
            "down_DF": _init_value(rngs, (L, F, D), dt).swapaxes(1, 2),
        }

    def weights(self) -> dict:
        return {"gate": self.gate_FD[...], "up": self.up_FD[...], "down": self.down_DF[...]}

    @staticmethod
    def apply(w: dict, x_BTD):
        dt = x_BTD.dtype
        gate_BTF = linear(x_BTD, w["gate"].astype(dt))
        up_BTF = linear(x_BTD, w["up"].astype(dt))
        hidden_BTF = constrain(jax.nn.silu(gate_BTF) * up_BTF, ("batch", "length", "mlp"))
        return linear(hidden_BTF, w["down"].astype(dt))


class MoE(nnx.Module):
    """Router and stacked expert weights of one sparse layer.

    The router is stored `(out, in)` like every other weight; the experts are stored
    `(experts, in, out)`, the layout their batched matmuls (`models/moe.py`) read.
    """

    def __init__(self, router_ED, gate_EDF, up_EDF, down_EFD):
        self.router_ED = nnx.Param(router_ED, logical_axes=(None, "embed"))
        self.gate_EDF = nnx.Param(gate_EDF, logical_axes=("experts", "embed", "mlp"))
        self.up_EDF = nnx.Param(up_EDF, logical_axes=("experts", "embed", "mlp"))
        self.down_EFD = nnx.Param(down_EFD, logical_axes=("experts", "mlp", "embed"))

    @staticmethod
    def draw(config: ModelConfig, rngs: nnx.Rngs, num_layers: int) -> dict:
        """Initial values of `num_layers` sparse layers, `(layers, ...)` each, fan-in scaled."""
        L, E, D, F = num_layers, config.num_experts, config.hidden_size, config.moe_intermediate_size
        dt = jnp.dtype(config.param_dtype)
        return {
            "router_ED": _init_value(rngs, (L, D, E), dt).swapaxes(1, 2),
            "gate_EDF": _init_value(rngs, (L, E, D, F), dt),
            "up_EDF": _init_value(rngs, (L, E, D, F), dt),
            "down_EFD": _init_value(rngs, (L, E, F, D), dt),
        }

    def weights(self) -> dict:
        return {"router": self.router_ED[...], "gate": self.gate_EDF[...], "up": self.up_EDF[...],
                "down": self.down_EFD[...]}


class Attention(nnx.Module):
    """Grouped-query self-attention projections of one layer, stored `(out, in)` (+ Qwen3 per-head q/k RMSNorm)."""

    def __init__(self, q_NHD, k_KHD, v_KHD, o_DNH, q_norm_H=None, k_norm_H=None):
        self.q_NHD = nnx.Param(q_NHD, logical_axes=("heads", "head_dim", "embed"))
        self.k_KHD = nnx.Param(k_KHD, logical_axes=("kv_heads", "head_dim", "embed"))
        self.v_KHD = nnx.Param(v_KHD, logical_axes=("kv_heads", "head_dim", "embed"))
        self.o_DNH = nnx.Param(o_DNH, logical_axes=("embed", "heads", "head_dim"))
        if q_norm_H is not None:
            self.q_norm_H = nnx.Param(q_norm_H, logical_axes=("head_dim",))
            self.k_norm_H = nnx.Param(k_norm_H, logical_axes=("head_dim",))

    @staticmethod
    def draw(config: ModelConfig, rngs: nnx.Rngs) -> dict:
        """Initial values of every layer, `(layers, ...)` each (drawn `(in, out)`, as `MLP.draw`)."""
        L, D = config.num_layers, config.hidden_size
        N, K, H = config.num_heads, config.num_kv_heads, config.head_dim
        dt = jnp.dtype(config.param_dtype)
        values = {
            "q_NHD": _init_value(rngs, (L, D, N, H), dt, D**-0.5).transpose(0, 2, 3, 1),
            "k_KHD": _init_value(rngs, (L, D, K, H), dt, D**-0.5).transpose(0, 2, 3, 1),
            "v_KHD": _init_value(rngs, (L, D, K, H), dt, D**-0.5).transpose(0, 2, 3, 1),
            "o_DNH": _init_value(rngs, (L, N, H, D), dt, (N * H) ** -0.5).transpose(0, 3, 1, 2),
        }
        if config.qk_norm:
            values["q_norm_H"] = jnp.ones((L, H), dt)
            values["k_norm_H"] = jnp.ones((L, H), dt)
        return values

    def weights(self) -> dict:
        w = {"q": self.q_NHD[...], "k": self.k_KHD[...], "v": self.v_KHD[...], "o": self.o_DNH[...]}
        if hasattr(self, "q_norm_H"):
            w["q_norm"] = self.q_norm_H[...]
            w["k_norm"] = self.k_norm_H[...]
        return w


class Block(nnx.Module):
    """The weights of one decoder layer (pre-norm attention and pre-norm MLP or MoE); `apply_block` runs it."""

    def __init__(self, attn_norm_D, attn: Attention, mlp_norm_D, mlp: MLP | MoE):
        self.attn_norm_D = nnx.Param(attn_norm_D, logical_axes=("embed",))
        self.attn = attn
        self.mlp_norm_D = nnx.Param(mlp_norm_D, logical_axes=("embed",))
        self.mlp = mlp

    def weights(self) -> dict:
        return {
            "attn_norm": self.attn_norm_D[...],
            "mlp_norm": self.mlp_norm_D[...],
            "attn": self.attn.weights(),
            "mlp": self.mlp.weights(),
        }


def project_heads(h_BTD, w_NHD, dtype):
    """`einsum("btd,nhd->btnh")` as one `linear` over the heads flattened."""
    N, H, D = w_NHD.shape
    return linear(h_BTD, w_NHD.reshape(N * H, D).astype(dtype)).reshape(*h_BTD.shape[:2], N, H)


def attention_inputs(h_BTD, a: dict, config: ModelConfig, positions_BT, inv_freq):
    """Queries, keys and values of one layer's attention: projections, Qwen3's q/k norms, rope."""
    dt = jnp.dtype(config.dtype)
    q_BTNH = project_heads(h_BTD, a["q"], dt)
    k_BTKH = project_heads(h_BTD, a["k"], dt)
    v_BTKH = project_heads(h_BTD, a["v"], dt)
    if config.qk_norm:
        q_BTNH = rms_norm(q_BTNH, a["q_norm"], config.rms_norm_eps)
        k_BTKH = rms_norm(k_BTKH, a["k_norm"], config.rms_norm_eps)
    return apply_rope(q_BTNH, positions_BT, inv_freq), apply_rope(k_BTKH, positions_BT, inv_freq), v_BTKH


def block_output(x_BTD, out_BTNH, w: dict, config: ModelConfig, valid_BT=None):
    """The rest of a layer after attention: output projection and the pre-norm SwiGLU MLP (or
    routed experts), each added to the residual. Returns the new `x_BTD` and, for a sparse
    layer, its `RouterStats` over the tokens `valid_BT` marks (else None)."""
    o_DE = w["attn"]["o"].reshape(w["attn"]["o"].shape[0], -1).astype(x_BTD.dtype)
    x_BTD = x_BTD + linear(out_BTNH.reshape(*out_BTNH.shape[:2], -1), o_DE)
    x_BTD = constrain(x_BTD, ("batch", "length", "embed"))
    h_BTD = rms_norm(x_BTD, w["mlp_norm"], config.rms_norm_eps)
    if "router" in w["mlp"]:
        y_BTD, stats = moe_forward(w["mlp"], h_BTD, config, valid_BT)
    else:
        y_BTD, stats = MLP.apply(w["mlp"], h_BTD), None
    return constrain(x_BTD + y_BTD, ("batch", "length", "embed")), stats


def apply_block(
    x_BTD, w: dict, kv, *, config: ModelConfig, positions_BT, inv_freq, mask_BTS, write_at, attend_cache,
    valid_BT=None,
):
    """One decoder layer over `x_BTD`: pre-norm attention, then pre-norm SwiGLU MLP, each added to the residual.

    `w` is the layer's `Block.weights()`. `kv` is this layer's `(k_BKHS, v_BKSH)` cache, or None
    without a cache; the new keys/values are written to it at slots `[write_at, write_at + T)`
    (`write_at` a scalar, or one start per row).
    `attend_cache` says the queries attend over the whole (written) cache under `mask_BTS`
    `(B, T, cache length)`; otherwise they attend causally among themselves under `mask_BTS`
    `(B, T, T)`. Returns the new `x_BTD`, the updated `kv` and the layer's `RouterStats` (None
    for a dense layer) over the tokens `valid_BT` marks.
    """
    dt = jnp.dtype(config.dtype)
    h_BTD = rms_norm(x_BTD, w["attn_norm"], config.rms_norm_eps)
    q_BTNH, k_BTKH, v_BTKH = attention_inputs(h_BTD, w["attn"], config, positions_BT, inv_freq)
    q_BTNH = constrain(q_BTNH, ("batch", "length", "heads", None))
    if kv is not None:
        # Write the new keys/values in place in this layer's cache.
        k_BKHS, v_BKSH = kv
        k_BKHT = k_BTKH.transpose(0, 2, 3, 1).astype(k_BKHS.dtype)
        v_BKTH = v_BTKH.transpose(0, 2, 1, 3).astype(v_BKSH.dtype)
        if jnp.ndim(write_at) == 0:
            k_BKHS = jax.lax.dynamic_update_slice(k_BKHS, k_BKHT, (0, 0, 0, write_at))
            v_BKSH = jax.lax.dynamic_update_slice(v_BKSH, v_BKTH, (0, 0, write_at, 0))
        else:  # one slot per row (`Transformer.extend_rows`)
            k_BKHS = jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u, (0, 0, s)))(k_BKHS, k_BKHT, write_at)
            v_BKSH = jax.vmap(lambda c, u, s: jax.lax.dynamic_update_slice(c, u, (0, s, 0)))(v_BKSH, v_BKTH, write_at)
        kv = (constrain(k_BKHS, _KEY_CACHE_AXES), constrain(v_BKSH, _VALUE_CACHE_AXES))
    if attend_cache:
        out_BTNH = attention(q_BTNH, kv[0].astype(dt), kv[1].astype(dt), mask_BTS)
    else:
        out_BTNH = causal_self_attention(q_BTNH, k_BTKH.astype(dt), v_BTKH.astype(dt), mask_BTS)
    x_BTD, stats = block_output(x_BTD, out_BTNH, w, config, valid_BT)
    return x_BTD, kv, stats


class Transformer(nnx.Module):
    """The policy network: embeddings, `num_layers` blocks, final norm, LM head."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        V, D, L = config.vocab_size, config.hidden_size, config.num_layers
        dt = jnp.dtype(config.param_dtype)
        self.embed_VD = _param(rngs, (V, D), ("vocab", "embed"), dt, scale=1.0)
        # Drawn as (layers, ...) tensors, one draw per weight kind, then split per layer.
        sparse = config.sparse_layers
        attn, mlp = Attention.draw(config, rngs), MLP.draw(config, rngs, L - sum(sparse))
        experts = MoE.draw(config, rngs, sum(sparse)) if any(sparse) else {}

        def feed_forward(i: int):
            values, module = (experts, MoE) if sparse[i] else (mlp, MLP)
            j = sparse[:i].count(sparse[i])  # the layer's place among the layers of its kind
            return module(**{name: value[j] for name, value in values.items()})

        self.layers = nnx.List([
            Block(
                jnp.ones((D,), dt),
                Attention(**{name: value[i] for name, value in attn.items()}),
                jnp.ones((D,), dt),
                feed_forward(i),
            )
            for i in range(L)
        ])
        self.final_norm_D = _param(rngs, (D,), ("embed",), dt, init="ones")
        if not config.tie_word_embeddings:
            self.lm_head_VD = nnx.Param(_init_value(rngs, (D, V), dt).T, logical_axes=("vocab", "embed"))

    def __call__(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array,
        segment_ids_BT: jax.Array,
        cache: KVCache | None = None,
        *,
        remat: str = "none",
        cache_is_empty: bool = False,
    ) -> tuple[jax.Array, KVCache | None]:
        hidden_BTD, new_cache = self.hidden_and_cache(
            tokens_BT, positions_BT, segment_ids_BT, cache, remat=remat, cache_is_empty=cache_is_empty
        )
        return self.logits_from_hidden(hidden_BTD), new_cache

    def logits_from_hidden(self, hidden_BTD: jax.Array) -> jax.Array:
        head_VD = (self.embed_VD if self.config.tie_word_embeddings else self.lm_head_VD)[...]
        logits_BTV = linear(hidden_BTD, head_VD.astype(hidden_BTD.dtype), at_least_float32(hidden_BTD.dtype))
        return constrain(logits_BTV, ("batch", "length", "vocab"))

    def hidden_and_cache(
        self, tokens_BT, positions_BT, segment_ids_BT, cache=None, *, remat: str = "none", cache_is_empty: bool = False
    ):
        """Final-normed hidden states `(B, T, D)` and the updated cache.

        `remat` (a key of `REMAT_POLICIES`) only changes memory and compute of a backward
        pass through this call, never its values. `cache_is_empty` says the cache holds
        nothing yet (a first prefill): the new tokens then attend causally among themselves,
        as without a cache, instead of over every slot, and are written to the cache.
        """
        hidden_BTD, new_cache, _ = self._layers(
            tokens_BT, positions_BT, segment_ids_BT, cache, remat=remat, cache_is_empty=cache_is_empty
        )
        return hidden_BTD, new_cache

    def hidden_and_router_stats(self, tokens_BT, positions_BT, segment_ids_BT, *, remat: str = "none"):
        """Final-normed hidden states `(B, T, D)` (as `hidden_and_cache` without a cache) and the
        `RouterStats` of the sparse layers over the real tokens, each field with a leading
        layer axis in layer order (None for a dense model): what the update reports."""
        hidden_BTD, _, stats = self._layers(tokens_BT, positions_BT, segment_ids_BT, None, remat=remat)
        return hidden_BTD, stats

    def _layers(self, tokens_BT, positions_BT, segment_ids_BT, cache, *, remat: str, cache_is_empty: bool = False):
        if remat not in REMAT_POLICIES:
            raise ValueError(f"unknown remat policy {remat!r}; choose one of {sorted(REMAT_POLICIES)}")
        cfg = self.config
        dt = jnp.dtype(cfg.dtype)
        x_BTD = embed_lookup(self.embed_VD[...], tokens_BT).astype(dt)
        inv_freq = rope_inverse_frequencies(cfg)
        B, T = tokens_BT.shape

        if cache is not None:
            write_at = cache.end_index
            cache_segments_BS = jax.lax.dynamic_update_slice(
                cache.segment_ids_BS, segment_ids_BT.astype(jnp.int32), (0, write_at)
            )
        else:
            write_at = None
        attend_cache = cache is not None and not cache_is_empty
        if attend_cache:
            key_segments_BS = cache_segments_BS
            causal_TS = (write_at + jnp.arange(T))[:, None] >= jnp.arange(cache.length)[None, :]
        else:
            t = jnp.arange(T)
            causal_TS = t[:, None] >= t[None, :]
            key_segments_BS = segment_ids_BT
        mask_BTS = (
            causal_TS[None]
            & (segment_ids_BT[:, :, None] == key_segments_BS[:, None, :])
            & (segment_ids_BT[:, :, None] != 0)
        )

        block = functools.partial(
            apply_block, config=cfg, positions_BT=positions_BT, inv_freq=inv_freq, mask_BTS=mask_BTS,
            write_at=write_at, attend_cache=attend_cache, valid_BT=segment_ids_BT != 0,
        )
        layer_weights = [layer.weights() for layer in self.layers]
        stats = None
        if cache is None:
            def scanned(x_BTD, w):
                x_BTD, _, layer_stats = block(x_BTD, w, None)
                return x_BTD, layer_stats

            if REMAT_POLICIES[remat] is not None:
                scanned = jax.checkpoint(scanned, policy=REMAT_POLICIES[remat], prevent_cse=False)
            run_stats = []
            for run in _same_kind_runs(cfg):
                stacked = jax.tree.map(lambda *ws: jnp.stack(ws), *(layer_weights[i] for i in run))
                x_BTD, layer_stats = jax.lax.scan(scanned, x_BTD, stacked)
                if layer_stats is not None:
                    run_stats.append(layer_stats)
            if run_stats:
                stats = jax.tree.map(lambda *a: jnp.concatenate(a), *run_stats)
            new_cache = None
        else:
            keys, values = [], []
            for w, k_BKHS, v_BKSH in zip(layer_weights, cache.k_BKHS, cache.v_BKSH):
                x_BTD, (k_BKHS, v_BKSH), _ = block(x_BTD, w, (k_BKHS, v_BKSH))
                keys.append(k_BKHS)
                values.append(v_BKSH)
            new_cache = KVCache(
                tuple(keys), tuple(values),
                constrain(cache_segments_BS, ("batch", "cache_length")),
                write_at + T,
            )
        return rms_norm(x_BTD, self.final_norm_D[...], cfg.rms_norm_eps), new_cache, stats

    def extend_rows(self, tokens_BT, starts_B, layers_kv):
        """Appends `tokens_BT` to per-row caches at slots `[starts_B[b], starts_B[b] + T)`.

        The row cache of the rollout engine (`spade_jax.sampling.engine`): each row holds one
        conversation from slot 0, a token's position is its slot, and every slot below a row's
        start holds a real token, so a query attends to the slots up to its own and nothing
        else is masked. Slots past a row's real tokens may hold garbage (padding of the chunk,
        or writes of an idle row); a later append overwrites them before any query reads them.
        `layers_kv` is one `(k_BKHS, v_BKSH)` pair per layer. Returns the final-normed hidden
        states `(B, T, D)` and the updated pairs.
        """
        cfg = self.config
        B, T = tokens_BT.shape
        S = layers_kv[0][0].shape[-1]
        positions_BT = starts_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
        mask_BTS = positions_BT[:, :, None] >= jnp.arange(S, dtype=jnp.int32)[None, None, :]
        x_BTD = embed_lookup(self.embed_VD[...], tokens_BT).astype(jnp.dtype(cfg.dtype))
        block = functools.partial(
            apply_block, config=cfg, positions_BT=positions_BT, inv_freq=rope_inverse_frequencies(cfg),
            mask_BTS=mask_BTS, write_at=starts_B, attend_cache=True,
        )
        new_kv = []
        for layer, kv in zip(self.layers, layers_kv):
            x_BTD, kv, _ = block(x_BTD, layer.weights(), kv)
            new_kv.append(kv)
        return rms_norm(x_BTD, self.final_norm_D[...], cfg.rms_norm_eps), new_kv

    def append_rows(self, tokens_AT, starts_A, lengths_A, rows_A, layers_kv, *, with_history: bool):
        """Writes the keys/values of `tokens_AT` into rows `rows_A` of per-row caches, at slots
        `[starts_A[a], starts_A[a] + lengths_A[a])`; the chunk's padding (and a row with length 0)
        writes nothing.

        The rollout engine's append (`spade_jax.sampling.engine`). A chunk token attends causally
        to the chunk and, `with_history`, to its row's slots below `starts_A` (gathered out of
        the cache); without history (every row starts at slot 0) the chunk runs as a plain
        causal prefill. Only the new slots are scattered back. `layers_kv` is one
        `(k_BKHS, v_BKSH)` pair per layer over every row; returns the updated pairs.
        """
        cfg = self.config
        dt = jnp.dtype(cfg.dtype)
        A, T = tokens_AT.shape
        S = layers_kv[0][0].shape[-1]
        t_T = jnp.arange(T, dtype=jnp.int32)
        positions_AT = starts_A[:, None] + t_T[None, :]
        real_AT = t_T[None, :] < lengths_A[:, None]
        slots_AT = jnp.where(real_AT, positions_AT, S)  # out of range: dropped by the scatter
        causal_ATT = jnp.broadcast_to(t_T[:, None] >= t_T[None, :], (A, T, T))
        history_ATS = jnp.broadcast_to(jnp.arange(S)[None, None, :] < starts_A[:, None, None], (A, T, S))
        inv_freq = rope_inverse_frequencies(cfg)
        x_ATD = embed_lookup(self.embed_VD[...], tokens_AT).astype(dt)
        new_kv = []
        for layer, (k_BKHS, v_BKSH) in zip(self.layers, layers_kv):
            w = layer.weights()
            h_ATD = rms_norm(x_ATD, w["attn_norm"], cfg.rms_norm_eps)
            q_ATNH, k_ATKH, v_ATKH = attention_inputs(h_ATD, w["attn"], cfg, positions_AT, inv_freq)
            if with_history:
                out_ATNH = attention_with_history(
                    q_ATNH, k_BKHS[rows_A].astype(dt), v_BKSH[rows_A].astype(dt), history_ATS,
                    k_ATKH.transpose(0, 2, 3, 1), v_ATKH.transpose(0, 2, 1, 3), causal_ATT,
                )
            else:
                out_ATNH = causal_self_attention(q_ATNH, k_ATKH, v_ATKH, causal_ATT)
            x_ATD, _ = block_output(x_ATD, out_ATNH, w, cfg)
            rows_AT = jnp.broadcast_to(rows_A[:, None], (A, T))
            k_BKHS = k_BKHS.at[rows_AT, :, :, slots_AT].set(k_ATKH.astype(k_BKHS.dtype), mode="drop")
            v_BKSH = v_BKSH.at[rows_AT, :, slots_AT, :].set(v_ATKH.astype(v_BKSH.dtype), mode="drop")
            new_kv.append((constrain(k_BKHS, _KEY_CACHE_AXES), constrain(v_BKSH, _VALUE_CACHE_AXES)))
        return new_kv
