"""Qwen3-MoE's sparse feed-forward: a softmax top-k router over stacked SwiGLU experts.

The weights live in `transformer.MoE`; this module routes tokens and dispatches them.

Routing is transformers' `Qwen3MoeSparseMoeBlock`: router logits in the compute dtype,
softmax in float32, the top `num_experts_per_tok` probabilities (renormalised to sum to 1
when `norm_topk_prob`) weight the chosen experts' outputs.

Dispatch is sort-based with per-expert buffers (no one-hot dispatch tensors). Each token's k
assignments are sorted by expert and written to a buffer of `capacity` rows per expert; each
expert multiplies its rows with one batched matmul (`einsum` over the experts), so the FLOPs,
in the forward and the backward pass, are those of the buffer: c times the k chosen experts'
with a capacity factor c, not all E experts'. With `moe_capacity_factor` 0 (the default) the
buffer holds every assignment for every expert, so nothing is dropped and the sampler and
the update compute exactly the same function; that costs E times the FLOPs, right for the
test-sized models on CPU and wrong at scale. Large MoE presets set c (the 30B preset: 2), and
a dispatch too small to need one (a decode step) stays dropless through `moe_min_capacity`.
Dropped assignments add nothing to their token (the residual passes) and are counted in the
update's `router_dropped`: with a capacity, the sampler (decode rows) and the update (packed
rows) group tokens differently and may drop different ones, a policy mismatch the truncated
importance weights see as any other.

`jax.lax.ragged_dot` (a grouped matmul over the sorted rows) would be dropless at the cost of
the k chosen experts, but compiled for TPU v5p here it costs its full row count in the forward
pass and every local expert times that for the weight gradient (cost analysis of XLA:TPU,
bench/RESULTS.md), so the buffers are the predictable choice.

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
        return _local_experts(h_BTD, top_i_BTP, top_w_BTP, w, config, first_expert=0)
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
    # Devices that hold the same tokens and the same experts (tensor ranks hold slices of the
    # same experts) count the same drops: once.
    repeats = math.prod(mesh.shape[a] for a in mesh.axis_names if a not in batch_axes and a != EXPERT_AXIS)

    def local(h_BTD, top_i_BTP, top_w_BTP, gate, up, down):
        if gathered:
            h_BTD, top_i_BTP, top_w_BTP = (jax.lax.all_gather(a, EXPERT_AXIS, tiled=True)
                                           for a in (h_BTD, top_i_BTP, top_w_BTP))
        first = jax.lax.axis_index(EXPERT_AXIS) * gate.shape[0]
        y_BTD, dropped = _local_experts(h_BTD, top_i_BTP, top_w_BTP, {"gate": gate, "up": up, "down": down},
                                        config, first_expert=first)
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


def capacity(config: ModelConfig, assignments: int) -> int:
    """Buffer rows per expert for `assignments` routed (to any expert) in one dispatch.

    Dropless (`moe_capacity_factor` 0): all of them, the most one expert can get. Otherwise c
    times the fair share, but never below `moe_min_capacity` (capped at all of them): a decode
    step routes a few hundred assignments, where one expert's load varies most, so small
    dispatches stay dropless at a negligible buffer.
    """
    cf = config.moe_capacity_factor
    if cf == 0:
        return assignments
    return min(assignments, max(math.ceil(cf * assignments / config.num_experts), config.moe_min_capacity))


def _local_experts(h_BTD, top_i_BTP, top_w_BTP, w: dict, config: ModelConfig, *, first_expert):
    """The outputs of experts `[first_expert, first_expert + local)` for every token given.

    Assignments to these experts are sorted by expert and written to a buffer of `capacity`
    rows per expert (the rest, if any, are dropped and counted); each expert multiplies its
    rows with one batched matmul, whose FLOPs and gradient are those of the buffer.
    """
    B, T, D = h_BTD.shape
    k = top_i_BTP.shape[-1]
    El = w["gate"].shape[0]  # the experts held here
    M, A = B * T, B * T * k
    C = capacity(config, A)
    dt = h_BTD.dtype
    expert_A = top_i_BTP.reshape(A)
    local_A = (expert_A >= first_expert) & (expert_A < first_expert + El)
    key_A = jnp.where(local_A, expert_A - first_expert, El)
    order_A = jnp.argsort(key_A, stable=True)
    key_sorted_A = key_A[order_A]
    sizes_E = jnp.zeros((El + 1,), jnp.int32).at[key_A].add(1)
    starts_E = jnp.cumsum(sizes_E) - sizes_E
    rank_A = jnp.arange(A) - starts_E[key_sorted_A]  # place among its expert's assignments
    kept_A = (key_sorted_A < El) & (rank_A < C)
    slot_A = jnp.where(kept_A, key_sorted_A * C + rank_A, El * C)  # El * C: dropped
    # Each buffer row's token and weight (an empty row reads token 0 with weight 0).
    token_S = jnp.zeros((El * C + 1,), jnp.int32).at[slot_A].set(order_A // k)[:-1]
    weight_S = jnp.zeros((El * C + 1,), dt).at[slot_A].set(top_w_BTP.reshape(A)[order_A].astype(dt))[:-1]
    x_ECD = h_BTD.reshape(M, D)[token_S].reshape(El, C, D)
    gate_ECF = jnp.einsum("ecd,edf->ecf", x_ECD, w["gate"].astype(dt))
    up_ECF = jnp.einsum("ecd,edf->ecf", x_ECD, w["up"].astype(dt))
    y_ECD = jnp.einsum("ecf,efd->ecd", jax.nn.silu(gate_ECF) * up_ECF, w["down"].astype(dt))
    y_MD = jnp.zeros((M, D), dt).at[token_S].add(y_ECD.reshape(El * C, D) * weight_S[:, None])
    dropped = (jnp.sum(local_A) - jnp.sum(kept_A)).astype(jnp.float32)
    return y_MD.reshape(B, T, D), dropped


__all__ = ["RouterStats", "load_balancing_loss", "moe_forward", "route", "expert_parallelism",
           "EXPERT_AXIS"]
