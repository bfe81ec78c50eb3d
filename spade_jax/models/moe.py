"""Qwen3-MoE's sparse feed-forward: a softmax top-k router over stacked SwiGLU experts.

The weights live in `transformer.MoE`; this module routes tokens and dispatches them.

Routing is transformers' `Qwen3MoeSparseMoeBlock`: router logits in the compute dtype,
softmax in float32, the top `num_experts_per_tok` probabilities (renormalised to sum to 1
when `norm_topk_prob`) weight the chosen experts' outputs.

Dispatch is sort-based and dropless by default. Each token's k assignments are sorted by
expert and every expert multiplies only its own rows, with one grouped matmul
(`jax.lax.ragged_dot`) per projection: the FLOPs are those of the k chosen experts, not of
all E. On TPU and GPU `ragged_dot` is a native grouped matmul; XLA:CPU expands it into a
masked product over every expert, which is why CPU runs only small test configs. Dropless
rather than capacity-based because self-play scores the same tokens twice, in the sampler
and in the update, grouped differently (decode rows vs packed training rows): with a
capacity, which tokens an expert drops depends on the grouping, so the two would compute
different policies and the importance ratio would carry that error. `moe_capacity_factor`
c > 0 still bounds the dispatch buffer (each shard of experts takes at most c times its fair
share of assignments; the rest are dropped and counted) for memory-bound settings.

Expert parallelism runs over the `fsdp` mesh axis: the stacked expert weights are sharded
along E there (rule "experts"), so each device holds E / fsdp whole experts and no expert
weight is ever gathered; tokens travel instead. Inside `shard_map` each device gathers the
tokens of its fsdp group (they are batch-sharded over fsdp), runs its local experts on the
assignments routed to them, and a reduce-scatter returns every token's summed output to the
device that owns it. Along the tensor axis each expert's hidden width is split as a dense
MLP's is, and the partial outputs are summed. When E does not divide the fsdp size, or
without a mesh, the experts are FSDP-sharded along embed like every other weight and XLA
gathers them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from spade_jax.models.config import ModelConfig
from spade_jax.models.sharding import active_sharding, logical_to_spec

EXPERT_AXIS = "fsdp"


class RouterStats(NamedTuple):
    """What the router did in one sparse layer over the real (non-padding) tokens."""

    load_E: jax.Array  # assignments per expert (float32; sums to tokens * k)
    prob_E: jax.Array  # router probability summed per expert
    tokens: jax.Array  # real tokens routed
    dropped: jax.Array  # assignments dropped by the capacity (0 when dropless)


def route(h_BTD, router_ED, config: ModelConfig):
    """Router probabilities `(B, T, E)` (float32) and the top-k experts and weights `(B, T, P)`."""
    logits_BTE = jnp.einsum("btd,ed->bte", h_BTD, router_ED.astype(h_BTD.dtype))
    probs_BTE = jax.nn.softmax(logits_BTE.astype(jnp.float32), axis=-1)
    top_w_BTP, top_i_BTP = jax.lax.top_k(probs_BTE, config.num_experts_per_tok)
    if config.norm_topk_prob:
        top_w_BTP = top_w_BTP / top_w_BTP.sum(-1, keepdims=True)
    return probs_BTE, top_i_BTP, top_w_BTP.astype(h_BTD.dtype)


def moe_forward(w: dict, h_BTD, config: ModelConfig, valid_BT=None):
    """The sparse feed-forward of one layer: `(B, T, D)` outputs and its `RouterStats`.

    `valid_BT` marks the real tokens the statistics count (all when None); routing and
    outputs do not depend on it.
    """
    probs_BTE, top_i_BTP, top_w_BTP = route(h_BTD, w["router"], config)
    y_BTD, dropped = _dispatch(h_BTD, top_i_BTP, top_w_BTP, w, config)
    E = config.num_experts
    valid_BT = jnp.ones(h_BTD.shape[:2], bool) if valid_BT is None else valid_BT.astype(bool)
    weight_BT = valid_BT.astype(jnp.float32)
    load_E = jnp.einsum("btke,bt->e", jax.nn.one_hot(top_i_BTP, E, dtype=jnp.float32), weight_BT)
    prob_E = jnp.einsum("bte,bt->e", probs_BTE, weight_BT)
    return y_BTD, RouterStats(load_E, prob_E, weight_BT.sum(), dropped)


def load_balancing_loss(stats: RouterStats, config: ModelConfig) -> jax.Array:
    """Switch-style auxiliary loss over layers, as transformers' `load_balancing_loss_func`:
    E * sum_e (assignments to e / tokens) * (mean router probability of e), with both
    fractions pooled over the layers given (a leading layer axis). 1 * k when balanced."""
    tokens = jnp.maximum(jnp.sum(stats.tokens), 1.0)
    fraction_E = stats.load_E.reshape(-1, config.num_experts).sum(0) / tokens
    prob_E = stats.prob_E.reshape(-1, config.num_experts).sum(0) / tokens
    return config.num_experts * jnp.sum(fraction_E * prob_E)


def expert_parallelism(config: ModelConfig) -> int:
    """Devices the experts are split over under the active mesh (1: none, XLA gathers them)."""
    active = active_sharding()
    if active is None:
        return 1
    size = active[0].shape[EXPERT_AXIS]
    return size if size > 1 and config.num_experts % size == 0 else 1


def _dispatch(h_BTD, top_i_BTP, top_w_BTP, w: dict, config: ModelConfig):
    """Every token's weighted sum over its experts, and the number of dropped assignments."""
    ep = expert_parallelism(config)
    if ep == 1:
        return _local_experts(h_BTD, top_i_BTP, top_w_BTP, w, config, first_expert=0, shards=1)
    mesh, rules = active_sharding()
    batch = logical_to_spec(("batch",), h_BTD.shape[:1], mesh, rules)[0]
    batch_axes = (batch,) if isinstance(batch, str) else tuple(batch or ())
    gathered = EXPERT_AXIS in batch_axes
    width = logical_to_spec(("experts", "embed", "mlp"), w["gate"].shape, mesh, rules)[2]
    width_axes = (width,) if isinstance(width, str) else tuple(width or ())
    tokens = PartitionSpec(batch, None, None)
    # An expert's hidden width is split like a dense MLP's (tensor parallel), so tensor ranks
    # share the work of each expert rather than repeat it.
    gate_up, down = PartitionSpec(EXPERT_AXIS, None, width), PartitionSpec(EXPERT_AXIS, width, None)
    # Devices that hold the same tokens and the same experts count the same drops once.
    repeats = math.prod(mesh.shape[a] for a in mesh.axis_names
                        if a not in batch_axes and a != EXPERT_AXIS and a not in width_axes)

    def local(h_BTD, top_i_BTP, top_w_BTP, gate, up, down):
        if gathered:
            h_BTD, top_i_BTP, top_w_BTP = (jax.lax.all_gather(a, EXPERT_AXIS, tiled=True)
                                           for a in (h_BTD, top_i_BTP, top_w_BTP))
        first = jax.lax.axis_index(EXPERT_AXIS) * gate.shape[0]
        y_BTD, dropped = _local_experts(h_BTD, top_i_BTP, top_w_BTP, {"gate": gate, "up": up, "down": down},
                                        config, first_expert=first, shards=ep)
        if gathered:
            y_BTD = jax.lax.psum_scatter(y_BTD, EXPERT_AXIS, scatter_dimension=0, tiled=True)
        else:
            y_BTD = jax.lax.psum(y_BTD, EXPERT_AXIS)
        if width_axes:
            y_BTD = jax.lax.psum(y_BTD, width_axes)
        return y_BTD, jnp.reshape(dropped / repeats, (1,) * len(mesh.axis_names))

    y_BTD, dropped = jax.shard_map(
        local, mesh=mesh,
        in_specs=(tokens, tokens, tokens, gate_up, gate_up, down),
        out_specs=(tokens, PartitionSpec(*mesh.axis_names)),
        check_vma=False,
    )(h_BTD, top_i_BTP, top_w_BTP, w["gate"], w["up"], w["down"])
    return y_BTD, jnp.sum(dropped)


def _local_experts(h_BTD, top_i_BTP, top_w_BTP, w: dict, config: ModelConfig, *, first_expert, shards: int):
    """The outputs of experts `[first_expert, first_expert + local)` for every token given.

    Assignments to these experts are sorted by expert (others last) and cut to the buffer's
    rows: all of them when dropless, else `moe_capacity_factor` times this shard's fair share.
    """
    B, T, D = h_BTD.shape
    k = top_i_BTP.shape[-1]
    El = w["gate"].shape[0]  # the experts held here
    A = B * T * k
    dt = h_BTD.dtype
    x_MD = h_BTD.reshape(B * T, D)
    expert_A = top_i_BTP.reshape(A)
    token_A = jnp.repeat(jnp.arange(B * T), k)
    local_A = (expert_A >= first_expert) & (expert_A < first_expert + El)
    key_A = jnp.where(local_A, expert_A - first_expert, El)
    cf = config.moe_capacity_factor
    rows = A if cf == 0 else min(A, math.ceil(cf * A / shards))
    order_R = jnp.argsort(key_A, stable=True)[:rows]
    sizes_E = jnp.zeros((El + 1,), jnp.int32).at[key_A].add(1)[:El]
    kept_E = jnp.diff(jnp.minimum(jnp.cumsum(sizes_E), rows), prepend=0).astype(jnp.int32)
    token_R = token_A[order_R]
    x_RD = x_MD[token_R]
    gate_RF = jax.lax.ragged_dot(x_RD, w["gate"].astype(dt), kept_E)
    up_RF = jax.lax.ragged_dot(x_RD, w["up"].astype(dt), kept_E)
    y_RD = jax.lax.ragged_dot(jax.nn.silu(gate_RF) * up_RF, w["down"].astype(dt), kept_E)
    in_group_R = jnp.arange(rows) < kept_E.sum()
    weight_R = jnp.where(in_group_R, top_w_BTP.reshape(A)[order_R], 0).astype(dt)
    y_MD = jnp.zeros((B * T, D), dt).at[token_R].add(y_RD * weight_R[:, None])
    dropped = (sizes_E.sum() - kept_E.sum()).astype(jnp.float32)
    return y_MD.reshape(B, T, D), dropped


__all__ = ["RouterStats", "load_balancing_loss", "moe_forward", "route", "expert_parallelism",
           "EXPERT_AXIS"]
