"""`bench/aot_tpu.py`: every large preset is runnable on the TPU slice its docstring names (the
config validates there: mesh, micro-batch rows) and plans its engine programs on the sampling
weights a TPU run reads, without compiling anything; and its per-device byte and bound arithmetic
on small hand-computed cases."""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from bench import aot_tpu as aot

REPO = Path(__file__).resolve().parents[2]
MESH = AbstractMesh((4, 1, 2), ("data", "fsdp", "tensor"))


def leaf(shape, dtype, *spec):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(MESH, P(*spec)))


def test_every_large_preset_plans_for_its_tpu_slice():
    out = subprocess.run([sys.executable, "bench/aot_tpu.py", "--dry_run"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for preset, slice_, mesh in (("qwen3_0p6b", "v4-8", "(4, 1, 1)"), ("qwen3_4b", "v4-32", "(1, 8, 2)"),
                                 ("qwen3_8b", "v4-64", "(1, 8, 4)"), ("qwen3_30b_a3b", "v5p-64", "(1, 8, 4)")):
        assert f"{preset} on {slice_} " in out.stdout and f"mesh {mesh}" in out.stdout, out.stdout
    # every preset samples with model.sampling_dtype="auto": a bfloat16 copy on TPU
    assert out.stdout.count("sampling weights: bfloat16 (a copy of the matrices)") == 4, out.stdout
    assert "not runnable" not in out.stdout + out.stderr


def test_dry_run_with_float32_sampling_reads_the_masters():
    out = subprocess.run([sys.executable, "bench/aot_tpu.py", "--dry_run", "--preset=qwen3_0p6b",
                          "--sampling_dtype=float32"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sampling weights: float32 (the masters)" in out.stdout, out.stdout


def test_per_device_bytes_sums_each_leafs_shard():
    tree = {
        "w": leaf((8, 6), jnp.float32, ("data", "fsdp"), "tensor"),  # shard (2, 3): 6 x 4 = 24 bytes
        "norm": leaf((16,), jnp.bfloat16),  # replicated: 16 x 2 = 32
        "emb": leaf((4, 10), jnp.bfloat16, None, "tensor"),  # shard (4, 5): 20 x 2 = 40
        "count": leaf((), jnp.int32),  # a scalar: 4
    }
    assert aot.per_device_bytes(tree) == 24 + 32 + 40 + 4


def test_sampling_copy_casts_the_floating_matrices_only():
    tree = {"w": leaf((8, 6), jnp.float32, "data", "tensor"), "norm": leaf((16,), jnp.float32),
            "ids": leaf((4, 4), jnp.int32, "data")}
    copy = aot.sampling_copy(tree, "bfloat16")
    assert {k: v.dtype for k, v in copy.items()} == {"w": jnp.bfloat16, "norm": jnp.float32, "ids": jnp.int32}
    assert all(copy[k].sharding == tree[k].sharding and copy[k].shape == tree[k].shape for k in tree)
    assert aot.per_device_bytes(copy) == 2 * 3 * 2 + 16 * 4 + 1 * 4 * 4
    assert aot.sampling_copy(tree, None) == tree


def test_decode_bound_reads_every_weight_and_every_full_row():
    # KV: 2 rows x 16 slots x 3 layers x (K and V) x 4 heads x 8 dims x 2 bytes = 12288 bytes
    bytes_, seconds = aot.decode_bound(weight_bytes=1000, rows_per_device=2, cache_length=16, layers=3,
                                       kv_heads_per_device=4, head_dim=8, cache_itemsize=2, hbm_bytes_per_s=1e4)
    assert bytes_ == 13288
    assert seconds == pytest.approx(1.3288)
