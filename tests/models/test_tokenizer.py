"""The `Tokenizer` interface: SentencePiece (trained here on a few KB) and transformers (SmolLM2's GGUF)."""

from __future__ import annotations

import inspect

import pytest

from spade_jax.envs import contract
from spade_jax.models import HFTokenizer, SentencePieceTokenizer
from spade_jax.models.tokenizer import IM_END, IM_START, render_chatml

CODE = '''class GuessEnv:
    def step(self, action: str):
        """Reward 1.0 for the right guess."""
        return "ok", 1.0 if action == "\\\\boxed{42}" else 0.0, True, False, {}
'''
TEXTS = [
    "The quick brown fox jumps over the lazy dog while numbers like 12345 and 678 are split.",
    "Ünïcödé, 日本語 and emoji 🙂 still round-trip through byte fallback.",
    CODE,
    inspect.getsource(contract),
]
MESSAGES = [
    {"role": "system", "content": "You play games."},
    {"role": "user", "content": "Reply with \\boxed{3}."},
]


@pytest.fixture(scope="module")
def spm_tokenizer(tmp_path_factory):
    corpus = "\n".join(TEXTS) * 3
    assert 4_000 < len(corpus) < 40_000
    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    return SentencePieceTokenizer.train([corpus], 400, prefix, user_defined_symbols=["<tool_call>", "</tool_call>"])


def test_spm_round_trips_text_exactly(spm_tokenizer):
    for text in TEXTS + ["  leading and trailing spaces  ", "tabs\tand\n\nnewlines\n", "x" * 300]:
        ids = spm_tokenizer.encode(text)
        assert all(0 <= i < spm_tokenizer.vocab_size for i in ids)
        assert spm_tokenizer.decode(ids) == text


def test_spm_chat_tokens_are_single_tokens(spm_tokenizer):
    tok = spm_tokenizer
    for symbol in (IM_START, IM_END, "<tool_call>", "</tool_call>"):
        assert len(tok.encode(symbol)) == 1, symbol
    assert tok.encode(f"a{IM_END}b")[1] == tok.im_end_id
    assert tok.eos_token_ids == (tok.im_end_id, SentencePieceTokenizer.EOS_ID)
    assert tok.pad_id == SentencePieceTokenizer.PAD_ID
    assert tok.vocab_size == 400


def test_spm_chatml_template(spm_tokenizer):
    tok = spm_tokenizer
    text = tok.apply_chat_template_text(MESSAGES)
    assert text == (
        "<|im_start|>system\nYou play games.<|im_end|>\n"
        "<|im_start|>user\nReply with \\boxed{3}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template_text(MESSAGES, add_generation_prompt=False) == text[: -len("<|im_start|>assistant\n")]
    ids = tok.apply_chat_template(MESSAGES)
    assert ids == tok.encode(text)
    assert ids.count(tok.im_start_id) == 3 and ids.count(tok.im_end_id) == 2
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.decode(ids) == "system\nYou play games.\nuser\nReply with \\boxed{3}.\nassistant\n"


def test_spm_rejects_models_without_chat_tokens(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS * 5), model_prefix=str(tmp_path / "plain"), vocab_size=64,
        minloglevel=2,
    )
    with pytest.raises(ValueError, match="lacks the chat token '<\\|im_start\\|>'.*SentencePieceTokenizer.train"):
        SentencePieceTokenizer(tmp_path / "plain.model")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SentencePieceTokenizer(tmp_path / "missing.model")


def test_malformed_messages_are_rejected(spm_tokenizer):
    with pytest.raises(ValueError, match="chat message 1 must be a dict with string 'role' and 'content'"):
        spm_tokenizer.apply_chat_template([MESSAGES[0], {"role": "user"}])


def test_render_chatml_without_generation_prompt():
    assert render_chatml([{"role": "user", "content": "hi"}], add_generation_prompt=False) == (
        "<|im_start|>user\nhi<|im_end|>\n"
    )


# ------------------------------------------------------ transformers (SmolLM2)


def test_smollm2_tokenizer_matches_transformers(smollm2_policy):
    tok = smollm2_policy.tokenizer
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.vocab_size == 49152 == smollm2_policy.config.vocab_size
    assert tok.eos_token_ids[0] == 2 and 0 in tok.eos_token_ids  # <|im_end|>, then <|endoftext|>
    assert tok.pad_id == 2
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    # SmolLM2's template inserts its default system prompt when none is given.
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
        19712, 8182, 2, 198, 1, 4093, 198, 26843, 665, 2, 198, 1, 520, 9531, 198,
    ]
    assert ids == list(tok.hf.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], add_generation_prompt=True, return_dict=False
    ))
    assert tok.decode(ids[-5:], skip_special_tokens=False) == "\n<|im_start|>assistant\n"
    assert tok.decode(ids[-5:]) == "\nassistant\n"
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text


def test_gguf_tokenizer_cache_equals_fresh_build(smollm2_gguf_path, tmp_path):
    fresh = HFTokenizer.from_gguf(smollm2_gguf_path, cache_dir=tmp_path)
    assert len(list((tmp_path / "gguf_tokenizers").iterdir())) == 1
    cached = HFTokenizer.from_gguf(smollm2_gguf_path, cache_dir=tmp_path)
    for text in TEXTS + [f"{IM_START}user\nhi{IM_END}"]:
        assert cached.encode(text) == fresh.encode(text)
    assert cached.apply_chat_template_text(MESSAGES) == fresh.apply_chat_template_text(MESSAGES)
    assert (cached.eos_token_ids, cached.pad_id, cached.vocab_size) == (
        fresh.eos_token_ids, fresh.pad_id, fresh.vocab_size,
    )


def test_hf_directory_tokenizer_is_loaded_with_the_weights(smollm2_policy, tmp_path):
    """A Hugging Face directory with tokenizer files gets them, plus generation_config stop ids."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from spade_jax.models import load_pretrained

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    smollm2_policy.tokenizer.hf.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    tok = load_pretrained(tmp_path).tokenizer
    assert isinstance(tok, HFTokenizer)
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.eos_token_ids[:2] == (2, 7)
    assert "<|im_start|>assistant" in tok.apply_chat_template_text(MESSAGES)
