"""Per-device memory of a training setup, counted before any device is touched.

    python -m spade_jax.sampling.memory_plan --config=configs/qwen3_30b_a3b.py --devices=32 --chip=v5p
    python -m spade_jax.sampling.memory_plan --config=configs/qwen3_30b_a3b.py \
        --config.mesh.shape=2,32,1 --devices=64 --chip=v4

`memory_plan` reads every parameter's shape and logical axes from the real model
(`abstract_model`, shapes only) and shards them with `logical_to_spec`, the rule the run
itself uses, over a mesh given as its `(data, fsdp, tensor)` sizes. What it counts:

- always resident: parameters, AdamW's two moments (the parameters' dtype, optax's default),
  the KL reference copy when `rl.kl_coef > 0`;
- the update: the scan's stacked copy of the layer weights; the gradients (the accumulator
  of the micro-batch scan plus one micro-batch's gradients); the activations one micro-batch
  saves for the backward pass under the remat policy ("dots": every layer's input and the
  outputs of its weight matmuls, i.e. q, k, v, the attention output projection and, in a
  dense layer, gate, up and down; in a sparse layer the router logits, as the experts' batched
  matmuls are not what "dots" saves; "full": only every layer's input); the working set of one layer's forward and
  backward (its weights gathered over fsdp in the compute dtype and their gradients, one
  attention query block's float32 scores and probabilities, every intermediate and its
  cotangent); the MoE dispatch buffer; the chunked LM head (a chunk's float32 logits, softmax
  and gradient, the gathered head weight and its gradient, the hidden states and theirs);
- sampling: the samplers' copy of the weights when `model.sampling_dtype` differs from the
  parameters' (`models/sampling_weights.py`: matrices in that dtype, norm scales as they are;
  freed while the update runs), the rollout engine's KV cache, and one layer's gathered weights
  plus a decode step's float32 logits.

The update and sampling never run at once, so the peak is the resident total plus the larger
of the two; within a phase every transient is counted as if alive together (an upper bound).
Remat "none" keeps every intermediate, attention probabilities included, and is not planned.
`PUBLISHED_ARCHITECTURES` holds the presets' published model shapes for planning and AOT
compiles without a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from typing import Sequence

import jax.numpy as jnp
from flax import nnx

from spade_jax.models.config import ModelConfig
from spade_jax.models.moe import capacity
from spade_jax.models.policy import abstract_model
from spade_jax.models.sampling_weights import resolve_sampling_dtype
from spade_jax.models.sharding import MESH_AXES, TRAIN_RULES, Rules, logical_to_spec
from spade_jax.models.transformer import REMAT_POLICIES

GIB = 1024**3

# Usable HBM per chip, GiB: TPU v5p 95, v4 32, v5e 16; H100 80 GB; H200 141 GB of which the
# CUDA runtime reports about 139 GiB.
CHIP_HBM_GIB = {"v5p": 95.0, "v4": 32.0, "v5e": 16.0, "h100": 80.0, "h200": 139.0}

# Optimizer state per parameter, in units of the parameter's own size.
OPTIMIZER_MOMENTS = {"adamw": 2}

_QWEN3 = dict(family="qwen3", qk_norm=True, vocab_size=151936, head_dim=128, rms_norm_eps=1e-6,
              rope_theta=1e6, max_position_embeddings=40960)

# Shapes from each model's config.json on the Hugging Face Hub (Qwen/Qwen3-0.6B, Qwen/Qwen3-4B,
# Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B-Instruct-2507), keyed by the preset in configs/ that runs it.
PUBLISHED_ARCHITECTURES: dict[str, ModelConfig] = {
    "qwen3_0p6b": ModelConfig(**_QWEN3, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                              num_kv_heads=8, tie_word_embeddings=True),
    "qwen3_4b": ModelConfig(**_QWEN3, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32,
                            num_kv_heads=8, tie_word_embeddings=True),
    "qwen3_8b": ModelConfig(**_QWEN3, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                            num_kv_heads=8, tie_word_embeddings=False),
    "qwen3_30b_a3b": ModelConfig(**{**_QWEN3, "family": "qwen3_moe", "rope_theta": 1e7,
                                    "max_position_embeddings": 262144},
                                 hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
                                 num_kv_heads=4, tie_word_embeddings=False, num_experts=128,
                                 num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
}

_KEY_CACHE_AXES = ("batch", "kv_heads", "head_dim", "cache_length")
_BTD = ("batch", "length", "embed")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device, by what holds them (see the module docstring for each line's model)."""

    parameters: int
    optimizer: int
    kl_reference: int
    layer_stack: int
    gradients: int
    activations: int
    layer_working_set: int
    moe_dispatch: int
    lm_head: int
    kv_cache: int
    sampler_working_set: int
    sampling_weights: int = 0

    RESIDENT = ("parameters", "optimizer", "kl_reference")
    UPDATE = ("layer_stack", "gradients", "activations", "layer_working_set", "moe_dispatch", "lm_head")
    SAMPLING = ("sampling_weights", "kv_cache", "sampler_working_set")

    @property
    def resident(self) -> int:
        return sum(getattr(self, name) for name in self.RESIDENT)

    @property
    def update(self) -> int:
        return sum(getattr(self, name) for name in self.UPDATE)

    @property
    def sampling(self) -> int:
        return sum(getattr(self, name) for name in self.SAMPLING)

    @property
    def peak(self) -> int:
        return self.resident + max(self.update, self.sampling)

    def table(self, hbm_bytes: int | None = None) -> str:
        """Markdown table in GiB per device, with phase totals and the headroom left in `hbm_bytes`."""
        lines = ["| per device | GiB |", "| --- | ---: |"]
        for group, names in (("resident", self.RESIDENT), ("update", self.UPDATE), ("sampling", self.SAMPLING)):
            lines += [f"| {group}: {name.replace('_', ' ')} | {getattr(self, name) / GIB:.2f} |" for name in names]
            lines.append(f"| **{group} total** | **{getattr(self, group) / GIB:.2f}** |")
        lines.append(f"| **peak** (resident + max(update, sampling)) | **{self.peak / GIB:.2f}** |")
        if hbm_bytes is not None:
            lines.append(f"| HBM | {hbm_bytes / GIB:.2f} |")
            lines.append(f"| **headroom** | **{(hbm_bytes - self.peak) / GIB:.2f}** |")
        return "\n".join(lines)


def mesh_stub(mesh_shape: Sequence[int]) -> types.SimpleNamespace:
    """What `logical_to_spec` reads of a `Mesh` (its `shape` by axis name), without devices."""
    if len(mesh_shape) != len(MESH_AXES) or any(s < 1 for s in mesh_shape):
        raise ValueError(f"mesh shape must be {len(MESH_AXES)} positive sizes {MESH_AXES}, got {tuple(mesh_shape)}")
    return types.SimpleNamespace(shape=dict(zip(MESH_AXES, (int(s) for s in mesh_shape))))


def resolve_mesh_shape(shape: Sequence[int], devices: int) -> tuple[int, int, int]:
    """`shape` with its -1 (if any) taking the devices the other axes leave; must use them all."""
    known = math.prod(s for s in shape if s != -1)
    resolved = tuple(devices // known if s == -1 else int(s) for s in shape)
    if list(shape).count(-1) > 1 or devices % known or math.prod(resolved) != devices:
        raise ValueError(f"mesh {tuple(shape)} does not fit {devices} devices")
    return resolved


def _mesh_axes(entry) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def per_device(shape: Sequence[int], axes: Sequence[str | None], mesh, rules: Rules) -> int:
    """Elements of an array of `shape` with logical `axes` that one device holds."""
    spec = logical_to_spec(axes, shape, mesh, rules)
    return math.prod(shape) // math.prod(mesh.shape[a] for entry in spec for a in _mesh_axes(entry))


def _gathered(shape, axes, mesh, rules) -> int:
    """Elements of a weight as one layer computes with it: gathered over every mesh axis except
    tensor (tensor-parallel matmuls) and, for the experts, their own axis (each device computes
    with its experts' shards where they lie, models/moe.py)."""
    spec = logical_to_spec(axes, shape, mesh, rules)
    experts = "experts" in axes
    shards = 1
    for name, entry in zip(axes, spec):
        for axis in _mesh_axes(entry):
            if axis == "tensor" or (experts and name == "experts"):
                shards *= mesh.shape[axis]
    return math.prod(shape) // shards


def memory_plan(
    model_config: ModelConfig,
    mesh_shape: Sequence[int],
    *,
    rows_per_micro_batch: int,
    row_length: int,
    sampler_rows: int,
    context_length: int,
    remat: str,
    param_dtype: str,
    compute_dtype: str,
    optimizer: str = "adamw",
    kl_reference: bool,
    logits_chunk: int = 128,
    rules: Rules = TRAIN_RULES,
    sampling_dtype: str | jnp.dtype | None = None,
) -> MemoryPlan:
    """Bytes per device of training `model_config` on a `(data, fsdp, tensor)` mesh of `mesh_shape`.

    `rows_per_micro_batch` packed rows of `row_length` tokens per micro-batch; the sampler
    holds `sampler_rows` rows of `context_length` cache slots. `kl_reference`: the update keeps
    a copy of the initial parameters (`rl.kl_coef > 0`). `sampling_dtype`: the dtype of the
    samplers' copy of the weights (None, or `param_dtype`: they read the parameters, no copy).
    """
    if remat not in REMAT_POLICIES or remat == "none":
        raise ValueError(f"remat {remat!r} is not planned; choose dots or full")
    if optimizer not in OPTIMIZER_MOMENTS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZER_MOMENTS)}")
    cfg = model_config.replace(param_dtype=param_dtype, dtype=compute_dtype)
    mesh = mesh_stub(mesh_shape)
    p_bytes, b = jnp.dtype(param_dtype).itemsize, jnp.dtype(compute_dtype).itemsize
    _, state = abstract_model(cfg)
    params, layers, copy_bytes = 0, {}, 0
    copies = sampling_dtype is not None and jnp.dtype(sampling_dtype) != jnp.dtype(param_dtype)
    for path, var in nnx.to_flat_state(state):
        axes = var.get_metadata().get("logical_axes") or (None,) * len(var.shape)
        params += per_device(var.shape, axes, mesh, rules)
        if copies:
            itemsize = jnp.dtype(sampling_dtype).itemsize if len(var.shape) >= 2 else p_bytes
            copy_bytes += per_device(var.shape, axes, mesh, rules) * itemsize
        if path[0] == "layers":
            held, gathered = layers.get(path[1], (0, 0))
            layers[path[1]] = (held + per_device(var.shape, axes, mesh, rules),
                               gathered + _gathered(var.shape, axes, mesh, rules))

    D, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    N, K, H, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_experts
    R, T = rows_per_micro_batch, row_length

    def act(shape, axes):
        return per_device(shape, axes, mesh, rules)

    residual = act((R, T, D), _BTD)
    q = act((R, T, N, H), ("batch", "length", "heads", None))
    kv = act((R, T, K, H), ("batch", "length", "kv_heads", None))
    mlp = act((R, T, F), ("batch", "length", "mlp"))
    router = act((R, T, E), ("batch", "length", None))
    block = max(128, -(-T // 16))  # transformer._query_block
    scores = act((R, N, block, T), ("batch", "heads", None, None))
    # Expert parallelism (models/moe.py): a device holding E / fsdp experts sees the tokens of
    # its whole fsdp group when the batch is sharded over fsdp, and gives each of its experts a
    # buffer of `capacity` rows for the group's assignments.
    fsdp = mesh.shape["fsdp"]
    ep = fsdp if E and fsdp > 1 and E % fsdp == 0 else 1
    batch_spec = logical_to_spec(("batch",), (R,), mesh, rules)[0]
    group = ep if ep > 1 and "fsdp" in _mesh_axes(batch_spec) else 1
    assignments = residual // D * group * cfg.num_experts_per_tok
    rows = E // ep * capacity(cfg, assignments) if E else 0

    def saved(sparse: bool) -> int:
        if remat == "full":
            return residual
        feed_forward = router if sparse else 2 * mlp + residual
        return residual + q + 2 * kv + residual + feed_forward

    def intermediates(sparse: bool) -> int:
        attention = 3 * residual + 2 * q + 3 * kv  # x, normed x, o output; q and q roped; k, k roped, v
        expert_width = cfg.moe_intermediate_size // (mesh.shape["tensor"] if E and not
                                                     cfg.moe_intermediate_size % mesh.shape["tensor"] else 1)
        feed_forward = (router + 2 * group * residual + rows * (D + 3 * expert_width)
                        if sparse else 3 * mlp + residual)
        return attention + feed_forward

    sparse_layers = cfg.sparse_layers
    activations = sum(saved(sparse) for sparse in sparse_layers) * b
    layer_working_set = max(
        2 * gathered * b + 2 * intermediates(sparse_layers[i]) * b + scores * (4 + b) * 2
        for i, (_, gathered) in layers.items()
    )
    C = min(logits_chunk or T, T)
    head_weight = _gathered((V, D), ("vocab", "embed"), mesh, rules)
    lm_head = 3 * act((R, C, V), ("batch", "length", "vocab")) * 4 + 2 * head_weight * b + 2 * residual * b
    kv_cache = 2 * cfg.num_layers * per_device((sampler_rows, K, H, context_length), _KEY_CACHE_AXES, mesh, rules) * b
    sampler_logits = act((sampler_rows, V), ("batch", "vocab")) * 4
    return MemoryPlan(
        parameters=params * p_bytes,
        optimizer=OPTIMIZER_MOMENTS[optimizer] * params * p_bytes,
        kl_reference=params * p_bytes if kl_reference else 0,
        layer_stack=sum(held for held, _ in layers.values()) * p_bytes,
        gradients=2 * params * p_bytes,
        activations=activations,
        layer_working_set=layer_working_set,
        moe_dispatch=rows * D * b if any(sparse_layers) else 0,
        lm_head=lm_head,
        kv_cache=kv_cache,
        sampler_working_set=max(gathered for _, gathered in layers.values()) * b + sampler_logits,
        sampling_weights=copy_bytes,
    )


def _model_config(c, arch: str) -> ModelConfig:
    """The preset's model: the checkpoint's config.json when `model.path` has one, else `arch`."""
    path = os.path.join(c.model.path, "config.json") if c.model.path else ""
    if path and os.path.exists(path):
        with open(path) as f:
            return ModelConfig.from_hf_config(json.load(f))
    if arch not in PUBLISHED_ARCHITECTURES:
        raise ValueError(f"no config.json under model.path and --arch {arch!r} is not one of "
                         f"{sorted(PUBLISHED_ARCHITECTURES)}")
    return PUBLISHED_ARCHITECTURES[arch]


def plan_for_config(c, devices: int, arch: str) -> tuple[MemoryPlan, tuple[int, int, int], str]:
    """The plan of a self-play ConfigDict on `devices` devices, its mesh, and which sampler batch
    sized the cache: the agent's engine (`agent.rows` rounded up as the engine does, over
    `agent.context_budget` slots) or the designer's (`designer.num_slots` prompts, bounded by a
    training row), whichever holds more slots."""
    from spade_jax.sampling.batching import bucket

    mesh_shape = resolve_mesh_shape(tuple(c.mesh.shape), devices)
    if not c.rl.micro_batch_rows:
        raise ValueError("config.rl.micro_batch_rows is 0 (the whole batch at once): set the micro-batch to plan")
    batch_shards = mesh_shape[0] * mesh_shape[1]
    agent = (bucket(c.agent.rows, 1, batch_shards), c.agent.context_budget)
    designer = (bucket(c.designer.num_slots, 1, batch_shards), c.rl.row_length)
    rows, context = max(agent, designer, key=lambda rc: rc[0] * rc[1])
    which = "agent" if (rows, context) == agent else "designer"
    plan = memory_plan(
        _model_config(c, arch).replace(moe_capacity_factor=c.model.moe_capacity_factor), mesh_shape,
        rows_per_micro_batch=c.rl.micro_batch_rows, row_length=c.rl.row_length,
        sampler_rows=rows, context_length=context, remat=c.rl.remat,
        param_dtype=c.model.param_dtype, compute_dtype=c.model.dtype,
        kl_reference=c.rl.kl_coef > 0, logits_chunk=c.rl.logits_chunk,
        sampling_dtype=resolve_sampling_dtype(c.model.sampling_dtype, "tpu"),  # planned for an accelerator
    )
    return plan, mesh_shape, f"{which}: {rows} rows x {context} slots"


def main(argv) -> None:
    del argv
    from absl import flags
    from ml_collections import config_flags

    f = flags.FLAGS
    c = f.config
    arch = f.arch or os.path.splitext(os.path.basename(config_flags.get_config_filename(f["config"])))[0]
    devices = f.devices or math.prod(c.mesh.shape)
    if devices < 1:
        raise SystemExit("the mesh has a -1 axis: give --devices")
    plan, mesh_shape, sampler = plan_for_config(c, devices, arch)
    hbm = f.hbm_gib if f.hbm_gib is not None else CHIP_HBM_GIB.get(f.chip) if f.chip else None
    print(f"{arch} on {devices} devices, mesh (data, fsdp, tensor) = {mesh_shape}; "
          f"micro-batch {c.rl.micro_batch_rows} x {c.rl.row_length}, remat {c.rl.remat}; sampler {sampler}")
    print(plan.table(None if hbm is None else int(hbm * GIB)))


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Preset file, optionally with `:args`.", lock_config=True)
    flags.DEFINE_integer("devices", None, "Devices in the slice (default: the mesh shape's product).")
    flags.DEFINE_float("hbm_gib", None, "HBM per device in GiB, for the headroom line.")
    flags.DEFINE_enum("chip", None, sorted(CHIP_HBM_GIB), "Known chip: sets --hbm_gib when that is not given.")
    flags.DEFINE_string("arch", None, "Key of PUBLISHED_ARCHITECTURES (default: the preset file's name).")
    flags.mark_flag_as_required("config")
    app.run(main)
