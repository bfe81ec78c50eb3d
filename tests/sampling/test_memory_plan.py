"""The per-device memory plan: hand-counted bytes on small configs, the published model sizes,
and the 30B preset's plan on its TPU v5p-64 mesh."""

import math

import pytest

from experiments import presets
from spade_jax.models.config import ModelConfig
from spade_jax.sampling.memory_plan import (
    GIB, PUBLISHED_ARCHITECTURES, memory_plan, mesh_stub, per_device, plan_for_config, resolve_mesh_shape)
from spade_jax.models.sharding import TRAIN_RULES
from spade_jax.selfplay.config import validate


# Llama family, tied embeddings: 256*64 + 2 layers * (q 4*16*64 + k, v 2*16*64 + o 64*4*16 + 2 norms of 64
# + gate, up, down 128*64) + final norm 64 = 90432 parameters, every axis even.
TINY = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, tie_word_embeddings=True)


def _plan(config=TINY, mesh=(1, 2, 1), **overrides):
    kwargs = dict(rows_per_micro_batch=2, row_length=8, sampler_rows=4, context_length=32, remat="full",
                  param_dtype="float32", compute_dtype="float32", kl_reference=True)
    return memory_plan(config, mesh, **{**kwargs, **overrides})


def _preset():
    return presets.load("configs/qwen3_30b_a3b.py")


def test_tiny_dense_plan_on_two_fsdp_devices():
    plan = _plan()
    assert TINY.num_params == 90432
    # Every weight has an embed axis of 64 (or is the embedding), halved by fsdp=2: 45216 each, f32.
    assert plan.parameters == 45216 * 4
    assert plan.optimizer == 2 * 45216 * 4
    assert plan.kl_reference == 45216 * 4
    assert plan.gradients == 2 * 45216 * 4
    # The layers without the embedding (8192) and final norm (32): 2 * 18496 elements.
    assert plan.layer_stack == 2 * 18496 * 4
    # Cache: 4 rows over data*fsdp = 2 -> 2 rows * 2 kv heads * 16 * 32 slots, keys and values, 2 layers.
    assert plan.kv_cache == 2 * 2 * (2 * 2 * 16 * 32) * 4
    # remat full: each layer keeps its input, 2 rows / 2 devices * 8 tokens * 64.
    assert plan.activations == 2 * (8 * 64) * 4
    assert plan.moe_dispatch == 0
    assert _plan(kl_reference=False).kl_reference == 0
    assert _plan(compute_dtype="bfloat16").kv_cache == plan.kv_cache // 2


def test_dots_keeps_the_weight_matmul_outputs():
    plan = _plan(remat="dots")
    # Per layer and device (1 row of 8 tokens): input, o output and down output 64 each, q 4*16,
    # k and v 2*16 each, gate and up 128 each = 576 elements per token.
    assert plan.activations == 2 * 8 * (3 * 64 + 64 + 2 * 32 + 2 * 128) * 4
    with pytest.raises(ValueError, match="not planned"):
        _plan(remat="none")


def test_moe_dispatch_buffer_and_expert_sharding():
    moe = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, family="qwen3_moe", qk_norm=True, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32)
    # 1 row of 8 tokens per device; the fsdp group of 2 is gathered: 16 tokens * 2 = 32
    # assignments. Dropless: each of the 2 local experts has room for all 32.
    assert _plan(moe).moe_dispatch == 2 * 32 * 64 * 4
    # Capacity 1.5: 2 experts x ceil(1.5 * 32 / 4 experts) = 24 rows; the default floor of 64
    # rows per expert keeps a dispatch this small dropless.
    assert _plan(moe.replace(moe_capacity_factor=1.5, moe_min_capacity=1)).moe_dispatch == 24 * 64 * 4
    assert _plan(moe.replace(moe_capacity_factor=1.5)).moe_dispatch == 2 * 32 * 64 * 4
    # Each of 8 fsdp devices holds 16 whole experts, split over tensor along their width.
    mesh = mesh_stub((1, 8, 4))
    assert per_device((128, 2048, 768), ("experts", "embed", "mlp"), mesh, TRAIN_RULES) == 16 * 2048 * 192


def test_published_parameter_counts():
    arch = PUBLISHED_ARCHITECTURES
    assert round(arch["qwen3_0p6b"].num_params / 1e6) == 596
    assert round((arch["qwen3_0p6b"].num_params + 151936 * 1024) / 1e6) == 752  # embeddings stored twice
    assert round(arch["qwen3_4b"].num_params / 1e7) == 402
    assert round(arch["qwen3_8b"].num_params / 1e7) == 819
    assert math.floor(arch["qwen3_30b_a3b"].num_params / 1e8) == 305  # 30.5B total
    assert math.floor(arch["qwen3_30b_a3b"].num_active_params / 1e8) == 33  # 3.3B active


def test_30b_plan_on_v5p_64():
    arch = PUBLISHED_ARCHITECTURES["qwen3_30b_a3b"]
    plan = _plan(arch, (1, 32, 1), rows_per_micro_batch=32, row_length=4096, compute_dtype="bfloat16")
    # Everything is split 32 ways but the 48 layers' q and k norms (128 each), which have no mesh axis.
    replicated = 48 * 2 * 128
    assert plan.parameters == ((arch.num_params - replicated) // 32 + replicated) * 4
    assert plan.parameters + plan.optimizer < 95 * GIB


def test_a_bfloat16_sampling_copy_is_counted_while_sampling():
    plain = _plan()
    copied = _plan(sampling_dtype="bfloat16")
    assert plain.sampling_weights == 0 == _plan(sampling_dtype="float32").sampling_weights
    # 2 layers x 2 norms + the final norm = 320 scales stay f32, the other 90112 weights in bf16, halved by fsdp=2
    assert copied.sampling_weights == (90112 * 2 + 320 * 4) // 2
    assert copied.sampling == plain.sampling + copied.sampling_weights  # freed while the update runs
    assert copied.resident == plain.resident and copied.update == plain.update


def test_30b_preset_fits_v5p_64_with_headroom():
    c = _preset()
    c.model.path = "/checkpoint"
    validate(c, 32)
    assert c.rl.kl_coef == 0.005
    plan, mesh, _ = plan_for_config(c, 32, "qwen3_30b_a3b")
    assert mesh == (1, 8, 4)
    assert plan.parameters + plan.optimizer < 95 * GIB
    assert plan.peak < 0.8 * 95 * GIB


def test_mesh_shape_resolution():
    assert resolve_mesh_shape((1, 8, -1), 64) == (1, 8, 8)
    with pytest.raises(ValueError, match="does not fit"):
        resolve_mesh_shape((1, 3, -1), 32)
