"""Qwen3-MoE: parity with transformers' PyTorch model, loading, sampling, expert parallelism, router statistics.

Random small `Qwen3MoeForCausalLM`s (several expert counts and top-k, `norm_topk_prob` both
ways, dense layers mixed in by `mlp_only_layers` and `decoder_sparse_step`) are written with
`save_pretrained` as sharded safetensors, loaded with `load_pretrained` and compared in float32.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from tests.models.gguf_files import finish, gguf_writer

from spade_jax.models import ModelConfig, load_pretrained, make_mesh, random_policy
from spade_jax.models.policy import segment_positions
from spade_jax.models.sharding import activation_sharding
from spade_jax.models.moe import RouterStats, load_balancing_loss
from spade_jax.rl.batch import TrainSequence, pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer
from spade_jax.sampling.engine import generate_on_rows

TOLERANCE = 1e-5
V = 96

# name: (num_experts, top_k, norm_topk_prob, mlp_only_layers, decoder_sparse_step, layers)
CASES = {
    "e4-k2-norm-dense1": (4, 2, True, [1], 1, 3),
    "e8-k1-nonorm": (8, 1, False, [], 1, 2),
    "e6-k3-nonorm-sparse-step2": (6, 3, False, [], 2, 4),
    "e16-k4-norm-dense0": (16, 4, True, [0], 1, 3),
}


def _one_device():
    return make_mesh((1, 1, 1), jax.devices()[:1])


def _hf_moe(experts, top_k, norm, mlp_only, sparse_step, layers, seed=0):
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=V, hidden_size=32, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=experts,
        num_experts_per_tok=top_k, norm_topk_prob=norm, mlp_only_layers=mlp_only,
        decoder_sparse_step=sparse_step, max_position_embeddings=256, rms_norm_eps=1e-6,
    )
    model = Qwen3MoeForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(1.0 + 0.3 * torch.randn_like(param) if "norm" in name else 0.2 * torch.randn_like(param))
    return model


_SAVED: dict = {}


def _saved(name, tmp_path_factory):
    """The case's transformers model, its sharded save_pretrained directory and our float32 load."""
    if name not in _SAVED:
        model = _hf_moe(*CASES[name])
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path, max_shard_size="30KB")
        assert len(list(path.glob("*.safetensors"))) > 2
        _SAVED[name] = model, path, load_pretrained(path, mesh=_one_device(), tokenizer=False)
    return _SAVED[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return _saved(request.param, tmp_path_factory)


def _torch_logits(model, tokens_BT, mask_BT=None):
    with torch.no_grad():
        mask = None if mask_BT is None else torch.tensor(mask_BT)
        return model(torch.tensor(tokens_BT), attention_mask=mask).logits.numpy()


def test_logits_match_transformers(case):
    model, _, policy = case
    hf = model.config
    assert policy.config.sparse_layers == tuple(
        i not in hf.mlp_only_layers and (i + 1) % hf.decoder_sparse_step == 0 for i in range(hf.num_hidden_layers))
    assert 0 < sum(policy.config.sparse_layers)
    tokens_BT = np.random.default_rng(1).integers(0, V, (3, 17))
    diff = np.abs(policy.logits(tokens_BT) - _torch_logits(model, tokens_BT)).max()
    assert diff <= TOLERANCE, diff


def test_padded_rows_match_transformers(case):
    """Left padding: segment 0 tokens are routed too but change no real token's logits."""
    model, _, policy = case
    tokens_BT = np.random.default_rng(2).integers(0, V, (2, 15))
    segments_BT = np.ones_like(tokens_BT)
    segments_BT[0, :6] = 0
    ours = policy.logits(tokens_BT, segments_BT)
    ref = _torch_logits(model, tokens_BT[:1, 6:])
    assert np.abs(ours[0, 6:] - ref[0]).max() <= TOLERANCE


def test_sharded_checkpoint_round_trips_every_tensor(case):
    model, _, policy = case
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    sparse = policy.config.sparse_layers
    for i, layer in enumerate(policy.model.layers):
        prefix = f"model.layers.{i}.mlp."
        if not sparse[i]:
            np.testing.assert_array_equal(np.asarray(layer.mlp.gate_FD[...]), state[prefix + "gate_proj.weight"])
            continue
        np.testing.assert_array_equal(np.asarray(layer.mlp.router_ED[...]), state[prefix + "gate.weight"])
        # transformers keeps the experts fused, (experts, 2 * F, D) gate then up, and (experts, D, F)
        gate_up = state[prefix + "experts.gate_up_proj"]
        F = gate_up.shape[1] // 2
        np.testing.assert_array_equal(np.asarray(layer.mlp.gate_EDF[...]), gate_up[:, :F].swapaxes(1, 2))
        np.testing.assert_array_equal(np.asarray(layer.mlp.up_EDF[...]), gate_up[:, F:].swapaxes(1, 2))
        np.testing.assert_array_equal(np.asarray(layer.mlp.down_EFD[...]), state[prefix + "experts.down_proj"].swapaxes(1, 2))


def test_config_read_from_checkpoint(case):
    model, _, policy = case
    hf, ours = model.config, policy.config
    assert (ours.family, ours.num_experts, ours.num_experts_per_tok, ours.moe_intermediate_size, ours.norm_topk_prob) == (
        "qwen3_moe", hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size, hf.norm_topk_prob)
    assert ours.num_params == sum(p.numel() for p in model.parameters())


def _write_moe_gguf(model, path) -> None:
    """A float32 qwen3moe GGUF (llama.cpp's names: experts stacked per layer)."""
    cfg = model.config
    writer = gguf_writer(path, "qwen3moe", cfg)
    writer.add_expert_count(cfg.num_experts)
    writer.add_expert_used_count(cfg.num_experts_per_tok)
    writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    state = {k: v.numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp"}
    F = cfg.moe_intermediate_size
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            writer.add_tensor(f"blk.{i}.{gg}.weight", state[f"model.layers.{i}.{hf}.weight"])
        gate_up = state[f"model.layers.{i}.mlp.experts.gate_up_proj"]
        writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :F]))
        writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, F:]))
        writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", state[f"model.layers.{i}.mlp.experts.down_proj"])
    finish(writer)


def test_gguf_qwen3moe_matches_transformers(tmp_path):
    model = _hf_moe(8, 2, True, [], 1, 2, seed=3)  # llama.cpp's qwen3moe: every layer sparse, weights renormalised
    _write_moe_gguf(model, tmp_path / "m.gguf")
    policy = load_pretrained(tmp_path / "m.gguf", mesh=_one_device(), tokenizer=False)
    assert (policy.config.family, policy.config.num_experts, policy.config.num_experts_per_tok) == ("qwen3_moe", 8, 2)
    tokens_BT = np.random.default_rng(4).integers(0, V, (2, 13))
    assert np.abs(policy.logits(tokens_BT) - _torch_logits(model, tokens_BT)).max() <= TOLERANCE


def test_greedy_generation_matches_transformers_for_32_tokens(tmp_path_factory):
    model, _, policy = _saved("e4-k2-norm-dense1", tmp_path_factory)
    prompts = [list(np.random.default_rng(5 + i).integers(0, V, n)) for i, n in enumerate((5, 11, 8))]
    gen = generate_on_rows(policy, prompts, max_new_tokens=32, temperature=0, stop_token_ids=[])
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32,
                                 min_new_tokens=32, pad_token_id=0)
        assert gen.row_tokens(i) == out[0, len(prompt):].tolist(), i


# ----------------------------------------------------------------- expert parallelism and training

MOE = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=8, family="qwen3_moe", qk_norm=True, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=16, mlp_only_layers=(1,))


def _sequences(n=8):
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        length = 12 + 3 * i
        mask = np.arange(length) >= 4
        out.append(TrainSequence(tokens=rng.integers(1, V, length), loss_mask=mask,
                                 sampler_logprobs=np.where(mask, -4.0, 0.0), advantage=float(rng.normal()),
                                 weight=1.0, role="agent"))
    return out


def _train(mesh, micro_rows, steps=2, config=MOE, loss=LossConfig()):
    """A Trainer's updates on the packed test batch; also the layer-0 router after each step."""
    policy = random_policy(config, seed=0, mesh=mesh)
    # eps=1 keeps Adam's step smooth in the gradient (see tests/rl/test_train.py): float-level noise
    # between layouts cannot flip near-zero updates.
    trainer = Trainer(policy, OptimConfig(lr=1e-2, eps=1.0, weight_decay=0.0),
                      dataclasses.replace(loss, micro_batch_rows=micro_rows))
    batch = pack(_sequences(), row_length=48, row_multiple=8)
    metrics, routers = [], []
    for _ in range(steps):
        metrics.append(trainer.update(batch))
        routers.append(np.asarray(policy.model.layers[0].mlp.router_ED[...]))
    return policy, trainer, batch, metrics, routers


_RUNS: dict = {}


def _one_device_run():
    if "one" not in _RUNS:
        _RUNS["one"] = _train(_one_device(), 0)
    return _RUNS["one"]


def test_experts_shard_over_fsdp_and_the_update_equals_one_device():
    ref_policy, ref_trainer, batch, ref_metrics, _ = _one_device_run()
    policy, trainer, _, metrics, _ = _train(make_mesh((1, 4, 2), jax.devices()[:8]), 4)
    gate = policy.model.layers[0].mlp.gate_EDF[...]
    assert tuple(gate.sharding.spec) == ("fsdp", None, "tensor")  # 2 experts per device, half the width of each
    assert gate.addressable_shards[0].data.shape == (2, 32, 8)
    np.testing.assert_allclose(policy.logits(batch.tokens_RT[:2]), ref_policy.logits(batch.tokens_RT[:2]), atol=2e-5)
    for k in ("loss", "grad_norm", "router_load_max", "router_aux_loss"):
        np.testing.assert_allclose(metrics[-1][k], ref_metrics[-1][k], rtol=1e-5)
    np.testing.assert_allclose(trainer.router_load_LE, ref_trainer.router_load_LE, atol=1e-6)
    untouched = random_policy(MOE, seed=0, mesh=_one_device()).logits(batch.tokens_RT[:2])
    assert np.abs(untouched - ref_policy.logits(batch.tokens_RT[:2])).max() > 1e-3


def _router_stats(config, tokens_BT, segments_BT, mesh=None):
    policy = random_policy(config, seed=0, mesh=mesh or _one_device())
    graphdef, state = nnx.split(policy.model)
    positions_BT = segment_positions(segments_BT)

    @jax.jit
    def run(state):
        with activation_sharding(policy.mesh, policy.rules):
            return nnx.merge(graphdef, state).hidden_and_router_stats(tokens_BT, positions_BT, segments_BT)

    hidden_BTD, stats = run(state)
    return np.asarray(hidden_BTD), jax.tree.map(np.asarray, stats)


TOKENS_BT = np.random.default_rng(8).integers(0, V, (2, 16))
SEGMENTS_BT = np.concatenate([np.zeros((2, 5), np.int32), np.ones((2, 11), np.int32)], axis=1)


def test_router_statistics_count_real_tokens_and_match_transformers_aux_loss():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    _, stats = _router_stats(MOE, TOKENS_BT, SEGMENTS_BT)
    assert stats.load_E.shape == (2, 8)  # the two sparse layers (layer 1 is dense)
    np.testing.assert_array_equal(stats.tokens, [22, 22])  # padding is routed but not counted
    np.testing.assert_array_equal(stats.load_E.sum(1), [44, 44])  # 22 tokens x 2 experts
    np.testing.assert_allclose(stats.prob_E.sum(1), [22, 22], rtol=1e-5)
    np.testing.assert_array_equal(stats.dropped, [0, 0])
    _, _, _, metrics, _ = _one_device_run()
    assert metrics[0]["router_load_max"] >= 1.0 >= metrics[0]["router_load_min"]
    assert metrics[0]["router_dropped"] == 0.0
    # the aux loss from counts, against transformers' function over the same router logits
    rng = np.random.default_rng(0)
    logits = [torch.tensor(rng.normal(size=(20, 8)).astype(np.float32)) for _ in range(2)]
    ref = float(load_balancing_loss_func(tuple(logits), 8, 2))
    probs = [torch.softmax(l, -1).numpy() for l in logits]
    top = [np.argsort(-p, -1)[:, :2] for p in probs]
    stats = RouterStats(
        load_E=np.stack([np.bincount(t.ravel(), minlength=8) for t in top]).astype(np.float32),
        prob_E=np.stack([p.sum(0) for p in probs]), tokens=np.array([20.0, 20.0]), dropped=np.zeros(2))
    assert float(load_balancing_loss(stats, MOE)) == pytest.approx(ref, rel=1e-5)


def test_aux_loss_is_off_by_default_and_adds_its_coefficient_times_the_balance_loss_when_on():
    assert LossConfig().router_aux_coef == 0.0
    _, _, _, base, base_routers = _one_device_run()
    _, _, _, aux, aux_routers = _train(_one_device(), 0, steps=1, loss=LossConfig(router_aux_coef=10.0))
    assert aux[0]["router_aux_loss"] == pytest.approx(base[0]["router_aux_loss"])  # same parameters scored
    assert aux[0]["loss"] - base[0]["loss"] == pytest.approx(10.0 * base[0]["router_aux_loss"], rel=1e-5)
    assert np.abs(aux_routers[0] - base_routers[0]).max() > 1e-4


def test_capacity_drops_are_counted_and_a_generous_capacity_equals_dropless():
    dropless, _ = _router_stats(MOE, TOKENS_BT, SEGMENTS_BT)
    roomy, roomy_stats = _router_stats(MOE.replace(moe_capacity_factor=8.0, moe_min_capacity=1), TOKENS_BT, SEGMENTS_BT)
    np.testing.assert_array_equal(roomy, dropless)  # 8 x the fair share of 8 experts: every assignment fits
    assert roomy_stats.dropped.sum() == 0
    tight_config = MOE.replace(moe_capacity_factor=0.5, moe_min_capacity=1)
    tight, tight_stats = _router_stats(tight_config, TOKENS_BT, SEGMENTS_BT)
    assert np.abs(tight - dropless).max() > 1e-3
    # 32 tokens x 2 assignments (padding included) into 8 experts x ceil(0.5 x 64 / 8) = 32 rows
    assert (tight_stats.dropped >= 32).all()
    # with the experts over 4 devices (the tokens gathered in order) the same assignments drop, counted once
    sharded, sharded_stats = _router_stats(tight_config, TOKENS_BT, SEGMENTS_BT, make_mesh((1, 4, 2), jax.devices()[:8]))
    np.testing.assert_allclose(sharded, tight, atol=1e-5)
    np.testing.assert_array_equal(sharded_stats.dropped, tight_stats.dropped)
    # the floor keeps a dispatch this small dropless
    floored, floored_stats = _router_stats(MOE.replace(moe_capacity_factor=0.5), TOKENS_BT, SEGMENTS_BT)
    np.testing.assert_array_equal(floored, dropless)
    assert floored_stats.dropped.sum() == 0


def test_rollout_engine_with_sharded_experts_equals_one_device():
    """The rollout engine (rows refilled as replies end) on 8 devices, experts over fsdp (4 per
    device, width over tensor) and rows over data and fsdp, gives the greedy tokens of every
    prompt decoding at once on one device."""
    prompts = [list(np.random.default_rng(9 + i).integers(0, V, 6 + i)) for i in range(10)]
    one = random_policy(MOE, seed=2, mesh=_one_device())
    ref = generate_on_rows(one, prompts, max_new_tokens=12, temperature=0, stop_token_ids=[], rows=16).tokens
    sharded = random_policy(MOE, seed=2, mesh=make_mesh((2, 2, 2), jax.devices()[:8]))
    assert sharded.model.layers[0].mlp.gate_EDF[...].addressable_shards[0].data.shape == (4, 32, 8)
    out = generate_on_rows(sharded, prompts, max_new_tokens=12, temperature=0, stop_token_ids=[], rows=8).tokens
    np.testing.assert_array_equal(out, ref)
