"""One Qwen3-30B-A3B MoE layer compiled for a TPU slice on this CPU: the dispatch's cost.

Compares `models/moe.py`'s per-expert buffers (at a capacity factor) with a dropless
`jax.lax.ragged_dot` dispatch over the same sorted rows (defined here: the design the
buffers replaced), forward alone and forward + gradient, by XLA:TPU's memory and cost
analysis per device. Runs in the TPU venv (`bash bench/aot_tpu_setup.sh`):

    JAX_PLATFORMS=cpu .venv-tpu/bin/python bench/aot_moe_dispatch.py --dispatch=buffers --capacity_factor=2
    JAX_PLATFORMS=cpu .venv-tpu/bin/python bench/aot_moe_dispatch.py --dispatch=ragged
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from spade_jax.models import moe  # noqa: E402
from spade_jax.sampling.memory_plan import PUBLISHED_ARCHITECTURES  # noqa: E402
from spade_jax.models.sharding import TRAIN_RULES, activation_sharding, logical_to_spec, make_mesh  # noqa: E402

flags.DEFINE_enum("dispatch", "buffers", ["buffers", "ragged"], "models/moe.py's buffers, or ragged_dot over sorted rows")
flags.DEFINE_float("capacity_factor", 2.0, "moe_capacity_factor for the buffers")
flags.DEFINE_string("topology", "v5p:4x4x2", "TPU topology (jax.experimental.topologies)")
flags.DEFINE_list("mesh", ["1", "8", "4"], "(data, fsdp, tensor)")
flags.DEFINE_integer("rows", 8, "rows of the micro-batch")
flags.DEFINE_integer("row_length", 8192, "tokens per row")
FLAGS = flags.FLAGS


def ragged_local_experts(h_BTD, top_i_BTP, top_w_BTP, w, config, *, first_expert):
    """Dropless: every assignment a row of one buffer sorted by expert (others last), one
    `ragged_dot` per projection with the local experts' group sizes."""
    B, T, D = h_BTD.shape
    k, El = top_i_BTP.shape[-1], w["gate"].shape[0]
    A, dt = B * T * k, h_BTD.dtype
    expert_A = top_i_BTP.reshape(A)
    local_A = (expert_A >= first_expert) & (expert_A < first_expert + El)
    key_A = jnp.where(local_A, expert_A - first_expert, El)
    order_A = jnp.argsort(key_A, stable=True)
    sizes_E = jnp.zeros((El + 1,), jnp.int32).at[key_A].add(1)[:El]
    token_A = order_A // k
    x_AD = h_BTD.reshape(B * T, D)[token_A]
    gate_AF = jax.lax.ragged_dot(x_AD, w["gate"].astype(dt), sizes_E)
    up_AF = jax.lax.ragged_dot(x_AD, w["up"].astype(dt), sizes_E)
    y_AD = jax.lax.ragged_dot(jax.nn.silu(gate_AF) * up_AF, w["down"].astype(dt), sizes_E)
    weight_A = jnp.where(key_A[order_A] < El, top_w_BTP.reshape(A)[order_A], 0).astype(dt)
    y_MD = jnp.zeros((B * T, D), dt).at[token_A].add(y_AD * weight_A[:, None])
    return y_MD.reshape(B, T, D), jnp.zeros((), jnp.float32)


def main(argv):
    del argv
    devices = topologies.get_topology_desc(topology_name=FLAGS.topology, platform="tpu").devices
    mesh = make_mesh(tuple(int(s) for s in FLAGS.mesh), devices)
    cfg = PUBLISHED_ARCHITECTURES["qwen3_30b_a3b"].replace(
        dtype="bfloat16", param_dtype="float32", moe_capacity_factor=FLAGS.capacity_factor)
    if FLAGS.dispatch == "ragged":
        moe._local_experts = ragged_local_experts
    E, D, F = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size

    def abstract(shape, axes, dtype):
        spec = logical_to_spec(axes, shape, mesh, TRAIN_RULES)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    w = {"router": abstract((E, D), (None, "embed"), jnp.float32),
         "gate": abstract((E, D, F), ("experts", "embed", "mlp"), jnp.float32),
         "up": abstract((E, D, F), ("experts", "embed", "mlp"), jnp.float32),
         "down": abstract((E, F, D), ("experts", "mlp", "embed"), jnp.float32)}
    x = abstract((FLAGS.rows, FLAGS.row_length, D), ("batch", "length", "embed"), jnp.bfloat16)

    def loss(w, x):
        with activation_sharding(mesh, TRAIN_RULES):
            return jnp.sum(moe.moe_forward(w, x, cfg)[0].astype(jnp.float32))

    print(f"{FLAGS.dispatch} (capacity factor {FLAGS.capacity_factor}), {FLAGS.topology}, mesh {dict(mesh.shape)}, "
          f"{FLAGS.rows} x {FLAGS.row_length} tokens")
    print("| program | temp GiB / device | TFLOP / device | compile s |\n| --- | ---: | ---: | ---: |")
    for name, fn in (("forward", loss), ("forward + gradient", jax.grad(loss, argnums=(0, 1)))):
        start = time.time()
        compiled = jax.jit(fn).lower(w, x).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes / 2**30
        flops = compiled.cost_analysis()["flops"] / 1e12
        print(f"| {name} | {temp:.2f} | {flops:.3f} | {time.time() - start:.0f} |")


if __name__ == "__main__":
    app.run(main)
