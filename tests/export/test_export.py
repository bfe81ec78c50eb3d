"""Export round trips: spade_jax -> Hugging Face directory -> transformers (PyTorch) and -> `load_pretrained`.

Random small Llama, Qwen3 and Qwen3-MoE policies (norm weights perturbed, so a swapped norm
shows) are exported in float32 with small shards; transformers must load every tensor it
expects and nothing else and give logits within 1e-4, and `load_pretrained` must give back the
same bits. A bfloat16 export, an export from an 8-device mesh and the export's errors too.
"""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM

from spade_jax.export import ExportError, export_hf, hf_config
from spade_jax.export.hf import INDEX_FILE, plan_shards, tensor_names
from spade_jax.models import ModelConfig, load_pretrained, make_mesh, random_policy
from spade_jax.models.loading import place_params
from spade_jax.models.policy import Policy
from spade_jax.models.sharding import TRAIN_RULES

TOLERANCE = 1e-4
V, B, T = 96, 2, 12
SHARD_BYTES = 24_000  # several files per model, one parameter (the embeddings) larger than a file

LLAMA3_ROPE = dict(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_max_position=64)
CASES = {
    "llama-gqa2-untied": dict(family="llama", hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=12),
    "qwen3-gqa4-headdim-tied-llama3rope": dict(family="qwen3", qk_norm=True, hidden_size=32, num_heads=8,
                                               num_kv_heads=2, head_dim=12, tie_word_embeddings=True,
                                               rope_theta=1e6, **LLAMA3_ROPE),
    "qwen3moe-mixed-layers": dict(family="qwen3_moe", qk_norm=True, hidden_size=32, num_heads=4, num_kv_heads=2,
                                  head_dim=8, num_layers=3, num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=16, norm_topk_prob=False, mlp_only_layers=(0,)),
}


def _config(name: str) -> ModelConfig:
    fields = dict(vocab_size=V, intermediate_size=40, num_layers=2, rms_norm_eps=1e-6, max_position_embeddings=256)
    return ModelConfig(**{**fields, **CASES[name]})


def _params(policy: Policy) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(policy.model, nnx.Param)))


def _perturbed_policy(config: ModelConfig, seed: int = 0) -> Policy:
    """A random policy whose norm weights are 1 + noise instead of ones."""
    policy = random_policy(config, seed=seed, mesh=make_mesh((1, 1, 1), jax.devices()[:1]))
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map_with_path(
        lambda path, w: (w + 0.3 * rng.standard_normal(w.shape)).astype(w.dtype)
        if "norm" in str(path[-1]) else w, _params(policy))
    state = nnx.state(policy.model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(policy.model, state)
    return policy


_EXPORTED: dict = {}


def _exported(name, tmp_path_factory):
    """The case's policy, its float32 export directory and the transformers model loaded from it (once)."""
    if name not in _EXPORTED:
        policy = _perturbed_policy(_config(name))
        out = tmp_path_factory.mktemp(name) / "hf"
        result = export_hf(policy, out, max_shard_bytes=SHARD_BYTES, progress=False)
        model, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
        _EXPORTED[name] = policy, out, result, model.eval(), info
    return _EXPORTED[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return (request.param, *_exported(request.param, tmp_path_factory))


def test_transformers_loads_every_tensor_and_matches_logits(case):
    name, policy, out, _, model, info = case
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    assert type(model).__name__ == hf_config(policy.config)["architectures"][0]
    for batch in range(2):
        tokens_BT = np.random.default_rng(batch).integers(0, V, (B, T))
        with torch.no_grad():
            ref_BTV = model(torch.tensor(tokens_BT)).logits.numpy()
        diff = float(np.abs(policy.logits(tokens_BT) - ref_BTV).max())
        print(f"{name} batch {batch}: max |diff| {diff:.2e}, max |logit| {np.abs(ref_BTV).max():.1f}")
        assert np.abs(ref_BTV).max() > 1.0
        assert diff <= TOLERANCE


def test_load_pretrained_gives_back_identical_parameters(case):
    _, policy, out, _, _, _ = case
    back = load_pretrained(out, mesh=make_mesh((1, 1, 1), jax.devices()[:1]), progress=False)
    ours, theirs = _params(policy), _params(back)
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_array_equal(a, b)


def test_config_reads_back_as_the_same_model(case):
    _, policy, out, _, _, _ = case
    written = json.loads((out / "config.json").read_text())
    back = ModelConfig.from_hf_config(written)
    if policy.config.rope_type == "default":  # scaling fields mean nothing without scaling
        back = back.replace(rope_original_max_position=policy.config.rope_original_max_position)
    assert back == policy.config


def _header(path) -> tuple[dict, int]:
    """A safetensors file's header and the offset its data starts at."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    assert (8 + size) % 8 == 0
    return header, 8 + size


def test_shard_index_covers_every_tensor_once(case):
    _, policy, out, result, _, _ = case
    index = json.loads((out / INDEX_FILE).read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert files == sorted(result.weight_files) and len(files) > 2
    assert sorted(set(index["weight_map"].values())) == files
    seen: list[str] = []
    total = 0
    for file in files:
        header, start = _header(out / file)
        assert header.pop("__metadata__") == {"format": "pt"}
        assert all(index["weight_map"][name] == file for name in header)
        ends = sorted(info["data_offsets"] for info in header.values())
        assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:]))  # contiguous
        size = ends[-1][1]
        assert size <= SHARD_BYTES or len(header) == 1
        assert (out / file).stat().st_size == start + size
        seen += list(header)
        total += size
    names = list(tensor_names(policy.config))
    assert sorted(seen) == sorted(names) == sorted(index["weight_map"]) and len(set(names)) == len(names)
    assert index["metadata"]["total_size"] == total == result.weight_bytes


def test_bfloat16_export_loads_and_stays_close(tmp_path, tmp_path_factory):
    policy = _exported("qwen3moe-mixed-layers", tmp_path_factory)[0]
    out = tmp_path / "bf16"
    export_hf(policy, out, dtype="bfloat16", max_shard_bytes=SHARD_BYTES, progress=False)
    assert {info["dtype"] for p in out.glob("*.safetensors") for k, info in _header(p)[0].items()
            if k != "__metadata__"} == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    back = load_pretrained(out, mesh=make_mesh((1, 1, 1), jax.devices()[:1]), progress=False)
    for a, b in zip(jax.tree.leaves(_params(policy)), jax.tree.leaves(_params(back))):
        np.testing.assert_array_equal(a.astype(jnp.bfloat16).astype(np.float32), b)  # round to nearest even
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens_BT = np.random.default_rng(5).integers(0, V, (B, T))
    with torch.no_grad():
        ref_BTV = model(torch.tensor(tokens_BT)).logits.numpy()
    assert float(np.abs(back.logits(tokens_BT) - ref_BTV).max()) <= TOLERANCE
    exact_BTV = policy.logits(tokens_BT)
    assert float(np.abs(exact_BTV - ref_BTV).max()) <= 0.02 * float(np.abs(exact_BTV).max())


def test_export_from_an_8_device_mesh_writes_the_same_files(tmp_path, tmp_path_factory):
    """Parameters sharded over fsdp and tensor (experts over fsdp) are gathered one by one to the same bytes."""
    policy, one, _, _, _ = _exported("qwen3moe-mixed-layers", tmp_path_factory)
    mesh = make_mesh((2, 2, 2), jax.devices()[:8])
    params = _params(policy)
    flat = {"/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    model = place_params(policy.config, mesh, TRAIN_RULES, {k: (lambda v=v: v) for k, v in flat.items()})
    sharded = Policy(model, policy.config, None, mesh, TRAIN_RULES)
    assert any(len(leaf.sharding.device_set) == 8 and not leaf.sharding.is_fully_replicated
               for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    export_hf(sharded, tmp_path / "eight", max_shard_bytes=SHARD_BYTES, progress=False)
    files = sorted(p.name for p in one.iterdir())
    assert files == sorted(p.name for p in (tmp_path / "eight").iterdir())
    for file in files:
        assert (one / file).read_bytes() == (tmp_path / "eight" / file).read_bytes(), file


def test_errors_name_the_problem(tmp_path):
    policy = SimpleNamespace(config=_config("llama-gqa2-untied"), tokenizer=None)  # refused before its weights
    with pytest.raises(ExportError, match="unsupported export dtype 'float16'"):
        export_hf(policy, tmp_path / "a", dtype="float16")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ExportError, match="is not an empty directory"):
        export_hf(policy, tmp_path / "full")
    with pytest.raises(ExportError, match="qk_norm=True matches no transformers architecture"):
        hf_config(_config("llama-gqa2-untied").replace(qk_norm=True))
    with pytest.raises(ExportError, match="max_shard_bytes must be > 0"):
        plan_shards([1, 2], 0)
    assert not (tmp_path / "a").exists() and [p.name for p in tmp_path.iterdir()] == ["full"]


def test_plan_shards_packs_in_order_and_isolates_large_tensors():
    assert plan_shards([4, 4, 4, 20, 1, 1], 10) == [[0, 1], [2], [3], [4, 5]]
    assert plan_shards([3, 3], 100) == [[0, 1]]


# ------------------------------------------------------------------ the tiny bootstrap


@pytest.fixture(scope="module")
def bootstrap_export(tiny_bootstrap_cache, tmp_path_factory):
    """The `tiny:runlocal` bootstrap policy (Llama, untied, SentencePiece/ChatML), its float32
    export, and transformers' model and tokenizer loaded from it."""
    from transformers import AutoTokenizer

    from configs import tiny
    from spade_jax.bootstrap import BootstrapConfig, cache_path, load_bootstrap

    policy = load_bootstrap(cache_path(tiny_bootstrap_cache, BootstrapConfig(**tiny.RUNLOCAL_BOOTSTRAP)))
    out = tmp_path_factory.mktemp("bootstrap") / "hf"
    result = export_hf(policy, out, progress=False)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return policy, out, result, model, AutoTokenizer.from_pretrained(out)


def test_bootstrap_exports_with_its_tokenizer_and_matches_logits(bootstrap_export):
    policy, out, result, model, tokenizer = bootstrap_export
    assert result.weight_files == ("model.safetensors",) and not (out / INDEX_FILE).exists()
    from transformers import PreTrainedTokenizerFast

    assert "tokenizer.json" in result.tokenizer_files and isinstance(tokenizer, PreTrainedTokenizerFast)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == list(policy.tokenizer.eos_token_ids)
    tokens_BT = np.random.default_rng(7).integers(0, policy.config.vocab_size, (B, T))
    with torch.no_grad():
        ref_BTV = model(torch.tensor(tokens_BT)).logits.numpy()
    assert float(np.abs(policy.logits(tokens_BT) - ref_BTV).max()) <= TOLERANCE
    back = load_pretrained(out, progress=False)
    for a, b in zip(jax.tree.leaves(_params(policy)), jax.tree.leaves(_params(back))):
        np.testing.assert_array_equal(a, b)


def test_bootstrap_greedy_generation_through_the_exported_chat_template(bootstrap_export):
    """32 greedy tokens after the exported chat template: transformers' generate equals spade_jax's engine."""
    from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT
    from spade_jax.sampling import generate_on_rows

    policy, _, _, model, tokenizer = bootstrap_export
    messages = [{"role": "system", "content": AGENT_SYSTEM_PROMPT},
                {"role": "user", "content": "You are in a maze. Moves left: 5. Reply with one of: up, down."}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    assert prompt == policy.tokenizer.apply_chat_template(messages)
    ours = generate_on_rows(policy, [prompt], max_new_tokens=32, temperature=0.0)
    ours_ids = [int(t) for t in ours.tokens[0, : ours.lengths[0]]]
    with torch.no_grad():
        theirs = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32)
    theirs_ids = [int(t) for t in theirs[0, len(prompt):]]
    stops = set(policy.tokenizer.eos_token_ids)
    if theirs_ids and theirs_ids[-1] in stops:
        assert bool(ours.finished[0])
    print(f"greedy: {len(ours_ids)} tokens {policy.tokenizer.decode(ours_ids)!r}")
    assert ours_ids == theirs_ids and len(ours_ids) >= 8
