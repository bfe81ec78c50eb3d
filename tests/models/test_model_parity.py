"""Logit parity of `load_pretrained` models against transformers' PyTorch models, and loader errors.

Random small Llama / Qwen3 checkpoints are written with `save_pretrained` (safetensors,
one file or sharded), loaded back with `load_pretrained` and compared in float32; the
real SmolLM2-135M GGUF is compared against transformers loading the same GGUF.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from spade_jax.models import CheckpointError, load_pretrained, make_mesh

from tests.models.gguf_files import finish, gguf_writer

TOLERANCE = 1e-4
# At SmolLM2's scale (logits up to |80|, residual activations up to |932|) float32 rounding
# alone separates two correct implementations by 1-2e-4 (measurements in bench/RESULTS.md).
# In float64 the two agree to 1e-12 (`test_smollm2_float64_matches_transformers_exactly`),
# so the gap is rounding, not the model.
SMOLLM2_TOLERANCE = 3e-4

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the test's head_dim spans unscaled, smoothed and fully scaled frequencies.
    "original_max_position_embeddings": 64,
}

# name: (family, config fields, max_shard_size or None)
CASES = {
    "llama-gqa1-untied": (
        "llama",
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
        None,
    ),
    "llama-gqa3-headdim-tied-llama3rope-sharded": (
        "llama",
        dict(
            hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
            tie_word_embeddings=True, rope_parameters={"rope_theta": 10000.0, **LLAMA3_ROPE},
        ),
        "40KB",
    ),
    "qwen3-gqa4-headdim-untied-sharded": (
        "qwen3",
        dict(
            hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=24,
            tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        ),
        "60KB",
    ),
    "qwen3-gqa1-tied-llama3rope": (
        "qwen3",
        dict(
            hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
            tie_word_embeddings=True, rope_parameters={"rope_theta": 500000.0, **LLAMA3_ROPE},
        ),
        None,
    ),
}


def _one_device():
    return make_mesh((1, 1, 1), jax.devices()[:1])


def _hf_model(family: str, fields: dict, seed: int = 0):
    """A random float32 transformers model with non-trivial norm weights."""
    torch.manual_seed(seed)
    config_cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[family]
    config = config_cls(
        vocab_size=96, intermediate_size=80, num_hidden_layers=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, initializer_range=0.2, **fields,
    )
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
    return model


_SAVED: dict = {}
B, T = 3, 18  # one input shape for every parity check of a case: one compilation


def _saved(name, tmp_path_factory):
    """The case's transformers model, its save_pretrained directory and our float32 load (once per module)."""
    if name not in _SAVED:
        family, fields, shard = CASES[name]
        model = _hf_model(family, fields)
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path, max_shard_size=shard) if shard else model.save_pretrained(path)
        if shard:
            assert (path / "model.safetensors.index.json").exists()
            assert len(list(path.glob("*.safetensors"))) > 2
        _SAVED[name] = name, model, path, load_pretrained(path, mesh=_one_device())
    return _SAVED[name]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return _saved(request.param, tmp_path_factory)


def _max_diff(ours: np.ndarray, ref: torch.Tensor, where=None) -> float:
    ref = ref.detach().numpy()
    if where is not None:
        ours, ref = ours[where], ref[where]
    return float(np.abs(ours - ref).max())


def test_logits_match_transformers_unpadded(case):
    name, model, _, policy = case
    tokens_BT = np.random.default_rng(1).integers(0, 96, (B, T))
    with torch.no_grad():
        ref = model(torch.tensor(tokens_BT)).logits
    diff = _max_diff(policy.logits(tokens_BT), ref)
    print(f"{name} unpadded: max |diff| {diff:.2e}, max |logit| {float(ref.abs().max()):.1f}")
    assert float(ref.abs().max()) > 1.0  # the comparison is not between near-zero logits
    assert diff <= TOLERANCE


def test_logits_match_transformers_padded(case):
    """Left- and right-padded rows (segment id 0) against transformers' attention mask."""
    name, model, _, policy = case
    tokens_BT = np.random.default_rng(2).integers(0, 96, (B, T))
    segments_BT = np.ones((B, T), np.int32)
    segments_BT[0, :5] = 0  # left padding
    segments_BT[1, 12:] = 0  # right padding
    positions_BT = np.maximum(np.cumsum(segments_BT, axis=1) - 1, 0)
    with torch.no_grad():
        ref = model(
            torch.tensor(tokens_BT),
            attention_mask=torch.tensor(segments_BT),
            position_ids=torch.tensor(positions_BT),
        ).logits
    ours = policy.logits(tokens_BT, segments_BT)
    diff = _max_diff(ours, ref, segments_BT == 1)
    print(f"{name} padded: max |diff| {diff:.2e}")
    assert diff <= TOLERANCE


def test_packed_segments_match_separate_sequences(case):
    """Sequences packed in one row attend only within themselves."""
    name, model, _, policy = case
    lengths = [(7, 9), (10, 8), (4, 4, 10)]  # per row; the first row ends in 2 padding tokens
    tokens_BT = np.random.default_rng(3).integers(0, 96, (B, T))
    segments_BT = np.zeros((B, T), np.int32)
    for b, row in enumerate(lengths):
        segments_BT[b, : sum(row)] = np.repeat(np.arange(1, len(row) + 1), row)
    ours = policy.logits(tokens_BT, segments_BT)
    diff = 0.0
    for b, row in enumerate(lengths):
        for start, n in zip(np.cumsum([0, *row[:-1]]), row):
            with torch.no_grad():
                ref = model(torch.tensor(tokens_BT[b : b + 1, start : start + n])).logits
            diff = max(diff, _max_diff(ours[b : b + 1, start : start + n], ref))
    print(f"{name} packed: max |diff| {diff:.2e}")
    assert diff <= TOLERANCE


@pytest.mark.parametrize("name", ["llama-gqa1-untied", "qwen3-gqa4-headdim-untied-sharded"])
def test_bfloat16_load_keeps_predictions(name, tmp_path_factory):
    _, _, path, policy = _saved(name, tmp_path_factory)
    bf16 = load_pretrained(path, dtype="bfloat16", mesh=_one_device(), tokenizer=False)
    assert bf16.config.param_dtype == "bfloat16" and bf16.config.dtype == "bfloat16"
    assert bf16.model.embed_VD[...].dtype == jax.numpy.bfloat16
    tokens_BT = np.random.default_rng(4).integers(0, 96, (B, T))
    full, half = policy.logits(tokens_BT), bf16.logits(tokens_BT)
    scale = np.abs(full).max()
    assert np.abs(full - half).max() <= 0.1 * scale
    assert (full.argmax(-1) == half.argmax(-1)).mean() >= 0.8


def test_config_read_from_checkpoint(case):
    name, model, _, policy = case
    hf, cfg = model.config, policy.config
    assert (cfg.family, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.tie_word_embeddings) == (
        CASES[name][0], hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim, hf.tie_word_embeddings,
    )
    assert cfg.rope_type == ("llama3" if "llama3rope" in name else "default")
    assert policy.tokenizer is None  # no tokenizer files were saved


# ----------------------------------------------------------------- GGUF files


def _write_gguf(model, path, arch: str) -> None:
    """A float32 GGUF of a transformers model, with llama.cpp's q/k row order for Llama."""
    cfg = model.config
    H = cfg.head_dim
    writer = gguf_writer(path, arch, cfg)

    def llama_cpp_order(w, heads):
        return w.reshape(heads, 2, H // 2, -1).swapaxes(1, 2).reshape(w.shape)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        w = tensor.detach().numpy().astype(np.float32)
        if arch == "llama" and ".q_proj." in hf_name:
            w = llama_cpp_order(w, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in hf_name:
            w = llama_cpp_order(w, cfg.num_key_value_heads)
        writer.add_tensor(names[hf_name], w)
    finish(writer)


@pytest.mark.parametrize("name", ["llama-gqa3-headdim-tied-llama3rope-sharded", "qwen3-gqa4-headdim-untied-sharded"])
def test_gguf_file_matches_transformers(name, tmp_path):
    """GGUF import: metadata -> config, q/k row order undone (GQA), tied/untied head, qwen3 q/k norms."""
    family, fields, _ = CASES[name]
    fields = {k: v for k, v in fields.items() if k != "rope_parameters"}  # GGUF rope scaling is unsupported
    model = _hf_model(family, fields, seed=5)
    _write_gguf(model, tmp_path / "m.gguf", family)
    policy = load_pretrained(tmp_path / "m.gguf", mesh=_one_device(), tokenizer=False)
    assert policy.config.family == family
    assert policy.config.head_dim == model.config.head_dim
    assert policy.config.tie_word_embeddings == model.config.tie_word_embeddings
    tokens_BT = np.random.default_rng(6).integers(0, 96, (2, 19))
    with torch.no_grad():
        ref = model(torch.tensor(tokens_BT)).logits
    diff = _max_diff(policy.logits(tokens_BT), ref)
    print(f"{name} gguf: max |diff| {diff:.2e}")
    assert diff <= TOLERANCE


# -------------------------------------------------------------- real SmolLM2


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_gguf_path):
    return AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name, dtype=torch.float32
    ).eval()


def test_smollm2_gguf_matches_transformers(smollm2_policy, smollm2_hf):
    tok = smollm2_policy.tokenizer
    prompts = [
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        [{"role": "system", "content": "You solve puzzles."}, {"role": "user", "content": "2+2=?"}],
    ]
    rows = [tok.apply_chat_template(m) for m in prompts]
    T = max(map(len, rows))
    tokens_BT = np.full((2, T), tok.pad_id)
    segments_BT = np.zeros((2, T), np.int32)
    for b, row in enumerate(rows):  # left-padded, as the sampler lays out prompts
        tokens_BT[b, T - len(row):] = row
        segments_BT[b, T - len(row):] = 1
    positions_BT = np.maximum(np.cumsum(segments_BT, axis=1) - 1, 0)
    ours = smollm2_policy.logits(tokens_BT, segments_BT)
    with torch.no_grad():
        ref = smollm2_hf(
            torch.tensor(tokens_BT), attention_mask=torch.tensor(segments_BT),
            position_ids=torch.tensor(positions_BT),
        ).logits
    diff = _max_diff(ours, ref, segments_BT == 1)
    print(f"SmolLM2 GGUF padded chat prompts: max |diff| {diff:.2e}, max |logit| {float(ref.abs().max()):.1f}")
    assert diff <= SMOLLM2_TOLERANCE
    assert (ours.argmax(-1) == ref.numpy().argmax(-1))[segments_BT == 1].all()


def test_smollm2_gguf_random_tokens_match_transformers(smollm2_policy, smollm2_hf):
    tokens_BT = np.random.default_rng(7).integers(0, smollm2_policy.config.vocab_size, (2, 48))
    with torch.no_grad():
        ref = smollm2_hf(torch.tensor(tokens_BT)).logits
    diff = _max_diff(smollm2_policy.logits(tokens_BT), ref)
    print(f"SmolLM2 GGUF random tokens: max |diff| {diff:.2e}, max |logit| {float(ref.abs().max()):.1f}")
    assert diff <= SMOLLM2_TOLERANCE


_FLOAT64_PARITY = r"""
import sys
import numpy as np, torch, jax
from transformers import AutoModelForCausalLM
from transformers.models.llama import modeling_llama
from spade_jax.models import load_pretrained, make_mesh

# transformers computes RMSNorm and rope in float32 even in a float64 model: widen both.
def norm(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
def rope(self, x, position_ids):
    angles = position_ids[..., None].to(x.dtype) * self.inv_freq.to(x.dtype)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()
modeling_llama.LlamaRMSNorm.forward = norm
modeling_llama.LlamaRotaryEmbedding.forward = rope

path = sys.argv[1]
ours = load_pretrained(path, dtype="float64", mesh=make_mesh((1, 1, 1), jax.devices()[:1]), tokenizer=False)
ref = AutoModelForCausalLM.from_pretrained(path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1]).eval().double()
H, theta = ref.config.head_dim, ref.config.rope_parameters["rope_theta"]
ref.model.rotary_emb.inv_freq = 1.0 / theta ** (torch.arange(0, H, 2, dtype=torch.float64) / H)
tokens_BT = np.random.default_rng(7).integers(0, ours.config.vocab_size, (2, 48))
logits = ours.logits(tokens_BT)
with torch.no_grad():
    expected = ref(torch.tensor(tokens_BT)).logits.numpy()
print(logits.dtype, float(np.abs(logits - expected).max()), float(np.abs(expected).max()))
"""


def test_smollm2_float64_matches_transformers_exactly(smollm2_gguf_path):
    """In float64 (own process: 64-bit JAX is global) both models give the same logits to 1e-9."""
    env = {**os.environ, "JAX_ENABLE_X64": "1", "XLA_FLAGS": ""}
    proc = subprocess.run(
        [sys.executable, "-c", _FLOAT64_PARITY, str(smollm2_gguf_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dtype, diff, largest = proc.stdout.split()[-3:]
    print(f"SmolLM2 GGUF float64: max |diff| {float(diff):.2e}, max |logit| {float(largest):.1f}")
    assert dtype == "float64" and float(largest) > 10
    assert float(diff) <= 1e-9


def test_float64_needs_64_bit_jax(saved_llama):
    with pytest.raises(CheckpointError, match="JAX_ENABLE_X64"):
        load_pretrained(saved_llama, dtype="float64")


def test_smollm2_config_from_gguf_metadata(smollm2_policy):
    cfg = smollm2_policy.config
    assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == ("llama", 30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.rope_theta == 100000.0 and cfg.tie_word_embeddings
    assert cfg.rms_norm_eps == pytest.approx(1e-5)


# ------------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("saved-llama")
    _hf_model("llama", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)).save_pretrained(path)
    return path


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_error_path_does_not_exist(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint path .*nowhere does not exist"):
        load_pretrained(tmp_path / "nowhere")


def test_error_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_pretrained(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="neither a Hugging Face model directory nor a .gguf file"):
        load_pretrained(tmp_path / "weights.bin")


def test_error_unsupported_architecture(saved_llama, tmp_path):
    path = _copy(saved_llama, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported architecture MistralForCausalLM; supported: "
                       "LlamaForCausalLM, Qwen3ForCausalLM"):
        load_pretrained(path)


def test_error_unsupported_gguf_architecture(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match="unsupported architecture 'gpt2'.*supported GGUF architectures: llama, qwen3"):
        load_pretrained(tmp_path / "m.gguf")


def test_error_missing_tensor(saved_llama, tmp_path):
    path = _copy(saved_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight$"):
        load_pretrained(path)


def test_error_wrong_shape_names_tensor_and_both_shapes(saved_llama, tmp_path):
    path = _copy(saved_llama, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 64  # the weights were saved with 80
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        load_pretrained(path)
    message = str(err.value)
    assert "wrong shapes: model.layers.0.mlp.gate_proj.weight has shape (80, 32), expected (64, 32)" in message
    assert "model.layers.0.mlp.down_proj.weight has shape (32, 80), expected (32, 64)" in message
    assert "missing" not in message and "unexpected" not in message


def test_error_unexpected_tensor(saved_llama, tmp_path):
    path = _copy(saved_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected tensors: model\.layers\.0\.self_attn\.q_proj\.bias$"):
        load_pretrained(path)


def test_error_no_weights_and_bad_dtype(saved_llama, tmp_path):
    path = _copy(saved_llama, tmp_path / "m")
    with pytest.raises(CheckpointError, match="unsupported dtype 'float16'; supported: float32, bfloat16"):
        load_pretrained(path, dtype="float16")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors weights in"):
        load_pretrained(path)


def test_error_unsupported_activation(saved_llama, tmp_path):
    path = _copy(saved_llama, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="config.json: hidden_act 'gelu' is not supported; supported: silu"):
        load_pretrained(path)


class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_when_asked_on_a_terminal(saved_llama, monkeypatch):
    from spade_jax.models import loading

    monkeypatch.setattr(loading, "_PROGRESS_MIN_BYTES", 0)  # the test checkpoint counts as big
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    outputs = {}
    for name, stream, progress in [
        ("terminal", _FakeTerminal(), True),
        ("terminal, progress=False", _FakeTerminal(), False),
        ("not a terminal", io.StringIO(), True),
    ]:
        monkeypatch.setattr(sys, "stderr", stream)
        load_pretrained(saved_llama, tokenizer=False, progress=progress)
        outputs[name] = stream.getvalue()
    assert "loading weights" in outputs["terminal"]
    assert outputs["terminal, progress=False"] == "" and outputs["not a terminal"] == ""
    assert stdout.getvalue() == ""  # load_pretrained prints nothing


def test_bfloat16_checkpoint_loads_exactly(tmp_path):
    """Real checkpoints are stored in bfloat16 (which numpy lacks): read bit-exactly, computed in float32."""
    model = _hf_model("qwen3", CASES["qwen3-gqa4-headdim-untied-sharded"][1], seed=8)
    with torch.no_grad():  # the reference: bfloat16-rounded weights (not rope buffers), in float32
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", framework="np") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"
    policy = load_pretrained(tmp_path, mesh=_one_device())
    assert policy.config.param_dtype == "float32"
    np.testing.assert_array_equal(
        np.asarray(policy.model.embed_VD[...]), model.model.embed_tokens.weight.detach().numpy()
    )
    tokens_BT = np.random.default_rng(9).integers(0, 96, (2, 13))
    with torch.no_grad():
        ref = model(torch.tensor(tokens_BT)).logits
    diff = _max_diff(policy.logits(tokens_BT), ref)
    print(f"bfloat16 checkpoint: max |diff| {diff:.2e}")
    assert diff <= TOLERANCE
