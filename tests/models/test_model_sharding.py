"""The model gives the same numbers on 1 CPU device and on a (data=2, fsdp=2, tensor=2) mesh.

Also: parameters are laid out as the rules say (axes that do not divide a dimension are
dropped), and KV-cache prefill + token-by-token decode equals one full forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from spade_jax.models import KVCache, ModelConfig, TRAIN_RULES, activation_sharding, load_pretrained, make_mesh
from spade_jax.models.policy import random_policy, segment_positions

# Every sharded dimension divides by 2: vocab, embed, mlp, heads, kv heads; batch 4 by data*fsdp.
CONFIG = ModelConfig(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, family="qwen3", qk_norm=True,
)

EXPECTED_SPECS = {  # TRAIN_RULES on (data, fsdp, tensor) = (2, 2, 2); "layers/{i}/..." for every layer i
    "embed_VD": P("tensor", "fsdp"),
    "lm_head_VD": P("tensor", "fsdp"),
    "final_norm_D": P("fsdp"),
    "layers/{i}/attn_norm_D": P("fsdp"),
    "layers/{i}/mlp_norm_D": P("fsdp"),
    "layers/{i}/attn/q_NHD": P("tensor", None, "fsdp"),
    "layers/{i}/attn/k_KHD": P("tensor", None, "fsdp"),
    "layers/{i}/attn/v_KHD": P("tensor", None, "fsdp"),
    "layers/{i}/attn/o_DNH": P("fsdp", "tensor", None),
    "layers/{i}/attn/q_norm_H": P(None),
    "layers/{i}/attn/k_norm_H": P(None),
    "layers/{i}/mlp/gate_FD": P("tensor", "fsdp"),
    "layers/{i}/mlp/up_FD": P("tensor", "fsdp"),
    "layers/{i}/mlp/down_DF": P("fsdp", "tensor"),
}


@pytest.fixture(scope="module")
def meshes():
    assert len(jax.devices()) >= 8, "tests/conftest.py should provide 8 fake CPU devices"
    return {"1dev": make_mesh((1, 1, 1), jax.devices()[:1]), "222": make_mesh((2, 2, 2), jax.devices()[:8])}


@pytest.fixture(scope="module")
def policies(meshes):
    return {name: random_policy(CONFIG, seed=3, mesh=mesh) for name, mesh in meshes.items()}


def _params(policy) -> dict[str, jax.Array]:
    flat = nnx.to_flat_state(nnx.state(policy.model, nnx.Param))
    return {"/".join(map(str, path)): var[...] for path, var in flat}


def _spec(array: jax.Array) -> tuple:
    """The array's PartitionSpec with one entry per dimension (trailing Nones made explicit)."""
    spec = tuple(array.sharding.spec)
    return spec + (None,) * (array.ndim - len(spec))


def _padded_batch(rng, B=4, T=12):
    tokens_BT = rng.integers(0, CONFIG.vocab_size, (B, T))
    segments_BT = np.ones((B, T), np.int32)
    segments_BT[1, :4] = 0  # left padding
    segments_BT[2, 9:] = 0  # right padding
    segments_BT[3, 6:] = 2  # two packed sequences
    return tokens_BT, segments_BT


def test_parameters_sharded_as_rules_say(policies):
    params = _params(policies["222"])
    expected = {
        name.format(i=i): spec for name, spec in EXPECTED_SPECS.items() for i in range(CONFIG.num_layers)
    }
    assert set(params) == set(expected)
    for name, value in params.items():
        assert _spec(value) == tuple(expected[name]), name
        divisors = [1 if axes is None else 2 for axes in expected[name]]
        expected_shard = tuple(d // k for d, k in zip(value.shape, divisors))
        assert all(s.data.shape == expected_shard for s in value.addressable_shards), name
    assert len(params["embed_VD"].addressable_shards) == 8


def test_same_initial_parameters_on_both_meshes(policies):
    one, eight = _params(policies["1dev"]), _params(policies["222"])
    for name in one:
        np.testing.assert_array_equal(np.asarray(one[name]), np.asarray(eight[name]), err_msg=name)


def test_forward_same_on_one_and_eight_devices(policies):
    tokens_BT, segments_BT = _padded_batch(np.random.default_rng(0))
    one = policies["1dev"].logits(tokens_BT, segments_BT)
    eight = policies["222"].logits(tokens_BT, segments_BT)
    assert np.abs(one).max() > 1.0
    np.testing.assert_allclose(eight, one, atol=1e-5, rtol=0)


def test_no_involuntary_rematerialisation(policies, capfd):
    """The embedding lookup and the rest of the forward partition without replicating whole tensors."""
    tokens_BT, segments_BT = _padded_batch(np.random.default_rng(1), T=10)  # a fresh shape: compiles now
    policies["222"].logits(tokens_BT, segments_BT)
    assert "Involuntary full rematerialization" not in capfd.readouterr().err


@jax.jit(static_argnames=("graphdef", "mesh", "cache_is_empty"))
def _step(graphdef, state, tokens_BT, positions_BT, segments_BT, cache, *, mesh, cache_is_empty=False):
    model = nnx.merge(graphdef, state)
    with activation_sharding(mesh, TRAIN_RULES):
        return model(tokens_BT, positions_BT, segments_BT, cache, cache_is_empty=cache_is_empty)


@pytest.mark.parametrize("cache_is_empty", [False, True], ids=["prefill-over-cache", "prefill-among-prompt"])
@pytest.mark.parametrize("mesh_name", ["1dev", "222"])
def test_prefill_then_decode_equals_full_forward(policies, mesh_name, cache_is_empty, capfd):
    policy = policies[mesh_name]
    tokens_BT, segments_BT = _padded_batch(np.random.default_rng(2), T=14)
    segments_BT[3, 6:] = 1  # decode continues every row's single segment ...
    segments_BT[2, 9:] = 1  # ... so no right padding either
    positions_BT = segment_positions(segments_BT)
    full_BTV = policy.logits(tokens_BT, segments_BT, positions_BT)

    prompt = 8
    graphdef, state = nnx.split(policy.model)
    cache = KVCache.init(CONFIG, batch=4, length=16)
    logits, cache = _step(
        graphdef, state, tokens_BT[:, :prompt], positions_BT[:, :prompt], segments_BT[:, :prompt],
        cache, mesh=policy.mesh, cache_is_empty=cache_is_empty,
    )
    pieces = [np.asarray(logits)]
    for t in range(prompt, tokens_BT.shape[1]):
        logits, cache = _step(
            graphdef, state, tokens_BT[:, t:t + 1], positions_BT[:, t:t + 1], segments_BT[:, t:t + 1],
            cache, mesh=policy.mesh,
        )
        pieces.append(np.asarray(logits))
    assert int(cache.end_index) == tokens_BT.shape[1]
    incremental_BTV = np.concatenate(pieces, axis=1)
    real = segments_BT != 0
    np.testing.assert_allclose(incremental_BTV[real], full_BTV[real], atol=1e-5, rtol=0)
    assert "Involuntary full rematerialization" not in capfd.readouterr().err


def test_smollm2_on_222_mesh_matches_one_device(smollm2_gguf_path, smollm2_policy, meshes):
    """9 query / 3 kv heads do not divide tensor=2: those axes stay unsharded, the rest shard."""
    sharded = load_pretrained(smollm2_gguf_path, mesh=meshes["222"], tokenizer=False)
    params = _params(sharded)
    assert _spec(params["layers/0/attn/q_NHD"]) == (None, None, "fsdp")
    assert _spec(params["layers/0/attn/k_KHD"]) == (None, None, "fsdp")
    assert _spec(params["layers/29/attn/o_DNH"]) == ("fsdp", None, None)
    assert _spec(params["embed_VD"]) == ("tensor", "fsdp")
    assert _spec(params["layers/29/mlp/gate_FD"]) == ("tensor", "fsdp")
    tokens_BT = np.random.default_rng(3).integers(0, sharded.config.vocab_size, (4, 24))
    segments_BT = np.ones_like(tokens_BT)
    segments_BT[0, :7] = 0
    one = smollm2_policy.logits(tokens_BT, segments_BT)
    eight = sharded.logits(tokens_BT, segments_BT)
    real = segments_BT != 0
    diff = float(np.abs(one - eight)[real].max())
    print(f"SmolLM2 1 device vs (2,2,2): max |diff| {diff:.2e}")
    # Sharded contractions sum in a different order; at SmolLM2's logit scale (|logit| ~ 40) float32
    # rounding alone moves logits by ~1e-4 (see SMOLLM2_TOLERANCE in test_model_parity.py).
    assert diff <= 3e-4
    assert (one.argmax(-1) == eight.argmax(-1))[real].all()


def test_kv_cache_sharded_as_rules_say(policies):
    """The cache the model returns is batch-sharded over (data, fsdp) and head-sharded over tensor."""
    policy = policies["222"]
    graphdef, state = nnx.split(policy.model)
    tokens_BT, segments_BT = _padded_batch(np.random.default_rng(4), T=4)
    _, cache = _step(
        graphdef, state, tokens_BT, segment_positions(segments_BT), segments_BT,
        KVCache.init(CONFIG, batch=4, length=8), mesh=policy.mesh,
    )
    assert len(cache.k_BKHS) == len(cache.v_BKSH) == CONFIG.num_layers
    for kv, local_shape in [(k, (1, 1, 16, 8)) for k in cache.k_BKHS] + [(v, (1, 1, 8, 16)) for v in cache.v_BKSH]:
        assert _spec(kv) == (("data", "fsdp"), "tensor", None, None)
        assert kv.addressable_shards[0].data.shape == local_shape
        assert kv.dtype == jnp.float32
    assert _spec(cache.segment_ids_BS) == (("data", "fsdp"), None)


def test_place_params_puts_host_arrays_on_the_mesh_and_refuses_a_mismatch():
    from spade_jax.models.loading import CheckpointError, place_params
    from spade_jax.models.policy import init_model

    host = {}
    for key_path, value in jax.tree_util.tree_flatten_with_path(
            nnx.to_pure_dict(nnx.state(init_model(CONFIG, seed=3))))[0]:
        host["/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)] = np.asarray(value)
    mesh = make_mesh((2, 2, 2))
    model = place_params(CONFIG, mesh, TRAIN_RULES, {name: lambda v=v: v for name, v in host.items()})
    placed = jax.tree_util.tree_leaves(nnx.to_pure_dict(nnx.state(model)))
    assert len(placed) == len(host) and all(a.sharding.mesh.shape == mesh.shape for a in placed)
    np.testing.assert_array_equal(sorted(float(np.asarray(a).sum()) for a in placed),
                                  sorted(float(v.sum()) for v in host.values()))
    missing = dict(host)
    name = missing.popitem()[0]
    with pytest.raises(CheckpointError, match="missing"):
        place_params(CONFIG, mesh, TRAIN_RULES, {k: lambda v=v: v for k, v in missing.items()})
    wrong = {k: (lambda v=v: v[..., :1]) if k == name else (lambda v=v: v) for k, v in host.items()}
    with pytest.raises(CheckpointError, match="shape"):
        place_params(CONFIG, mesh, TRAIN_RULES, wrong)
