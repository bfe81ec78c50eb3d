"""Exported tokenizer files: `AutoTokenizer.from_pretrained` gives the project tokenizer's ids, text and chats."""

from __future__ import annotations

import inspect
import json
import random

import pytest

from spade_jax.bootstrap.build import TOKENIZER_SYMBOLS
from spade_jax.envs import contract
from spade_jax.export.tokenizer_files import CHATML_TEMPLATE, TokenizerExportError, save_tokenizer
from spade_jax.models import HFTokenizer, SentencePieceTokenizer
from spade_jax.models import tokenizer as tokenizer_module
from spade_jax.models.tokenizer import IM_END, IM_START

CORPUS = inspect.getsource(contract) + inspect.getsource(tokenizer_module)
TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog; it's 3:45 pm and I'LL say don't.",
    "Ünïcödé, 日本語, Ελληνικά and emoji 🙂🚀, combining e\u0301, ZWJ 👩\u200d💻, NBSP\u00a0here",
    "def f(x: int) -> int:\n    \"\"\"Square.\"\"\"\n    return x ** 2  # {x!r}\n\n\tif x: pass\r\n",
    "digits 0 1 12 123 1234 3.14159 -2e10 0x1F 1,000,000",
    "runs:  two   three    four\t\ttabs\n\n\nnewlines \n \n  trailing   ",
    " " * 17 + "x" + "\n" * 5,
    f"{IM_START}system\nBe brief.{IM_END}\n{IM_START}user\n2+2?{IM_END}\n{IM_START}assistant\n4{IM_END}\n",
    "Reply \\boxed{42} <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> <answer>7</answer>",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "You play games."},
        {"role": "user", "content": "Reply with \\boxed{3}."},
        {"role": "assistant", "content": "<answer>\\boxed{3}</answer>"},
        {"role": "user", "content": "Again, 日本語 🙂\n\n  indented"},
        {"role": "assistant", "content": "<tool_call>{\"name\": \"guess\"}</tool_call>"},
        {"role": "user", "content": ""},
    ],
]


def _texts(extra_lines: int = 200) -> list[str]:
    """TEXTS plus random spans of source lines (code, docstrings, indentation)."""
    lines = CORPUS.split("\n")
    rng = random.Random(0)
    spans = []
    for _ in range(extra_lines):
        start = rng.randrange(len(lines))
        spans.append("\n".join(lines[start:start + rng.randrange(1, 8)]))
    # Literal control-piece spellings are special tokens to transformers only (module docstring).
    return TEXTS + [s for s in spans if not any(t in s for t in ("<s>", "</s>", "<unk>", "<pad>"))]


@pytest.fixture(scope="module")
def spm_tokenizer(tmp_path_factory):
    """A 400-piece tokenizer trained as the bootstrap trains its (build.py's options and symbols)."""
    prefix = tmp_path_factory.mktemp("spm") / "tokenizer"
    return SentencePieceTokenizer.train(
        [CORPUS], 400, prefix, user_defined_symbols=TOKENIZER_SYMBOLS, split_by_unicode_script=False,
        split_by_whitespace=False, max_sentencepiece_length=16, num_threads=1,
    )


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_policy):
    return smollm2_policy.tokenizer


@pytest.fixture(params=["smollm2", "spm"])
def exported(request, tmp_path):
    """(project tokenizer, the AutoTokenizer of its exported files, the files written)."""
    from transformers import AutoTokenizer

    tok = request.getfixturevalue("smollm2_tokenizer" if request.param == "smollm2" else "spm_tokenizer")
    files = save_tokenizer(tok, tmp_path)
    return tok, AutoTokenizer.from_pretrained(str(tmp_path)), files, tmp_path


def test_exported_files_load_as_a_plain_fast_tokenizer(exported):
    from transformers import PreTrainedTokenizerFast

    tok, hf, files, out = exported
    assert files == ["chat_template.jinja", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in out.iterdir()) == files
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert isinstance(hf, PreTrainedTokenizerFast)
    assert len(hf) == tok.vocab_size
    assert hf.eos_token_id == tok.eos_token_ids[0] and hf.pad_token_id == tok.pad_id
    if isinstance(tok, SentencePieceTokenizer):
        assert (hf.bos_token_id, hf.unk_token_id) == (SentencePieceTokenizer.BOS_ID, SentencePieceTokenizer.UNK_ID)
        assert hf.eos_token == IM_END
    else:
        assert (hf.bos_token_id, hf.unk_token_id) == (tok.hf.bos_token_id, tok.hf.unk_token_id)


def test_exported_ids_and_text_equal_the_project_tokenizers(exported):
    tok, hf, _, _ = exported
    texts = _texts()
    assert len(texts) > 150
    for text in texts:
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids, text
        assert hf(text)["input_ids"] == ids  # nothing added by default either
        assert hf.decode(ids, skip_special_tokens=False) == text
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    for symbol in (IM_START, IM_END, *(TOKENIZER_SYMBOLS if isinstance(tok, SentencePieceTokenizer) else ())):
        assert len(hf.encode(symbol, add_special_tokens=False)) == 1, symbol


def test_exported_chat_template_renders_the_projects_chats(exported):
    tok, hf, _, _ = exported
    for chat in CHATS:
        for generation_prompt in (True, False):
            text = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
            assert text == tok.apply_chat_template_text(chat, add_generation_prompt=generation_prompt)
        ids = hf.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
        assert list(ids) == tok.apply_chat_template(chat)


def test_exported_project_tokenizer_reads_back(exported):
    """`load_pretrained`'s route for a directory: the exported files give the same tokenizer."""
    tok, _, _, out = exported
    back = HFTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert back.encode(text) == tok.encode(text)
    assert back.apply_chat_template_text(CHATS[1]) == tok.apply_chat_template_text(CHATS[1])
    assert back.eos_token_ids[0] == tok.eos_token_ids[0] and back.pad_id == tok.pad_id
    assert back.escape_special(f"a{IM_END}b") == tok.escape_special(f"a{IM_END}b") != f"a{IM_END}b"


def test_literal_control_spellings_differ_from_sentencepiece_as_documented(spm_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    save_tokenizer(spm_tokenizer, tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.encode("a</s>", add_special_tokens=False)[-1] == SentencePieceTokenizer.EOS_ID
    assert SentencePieceTokenizer.EOS_ID not in spm_tokenizer.encode("a</s>")


def test_chat_template_override_and_bad_input(spm_tokenizer, smollm2_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    custom = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    save_tokenizer(smollm2_tokenizer, tmp_path, chat_template=custom)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf.apply_chat_template(CHATS[0], tokenize=False) == "[user] Hi there\n"
    assert (tmp_path / "chat_template.jinja").read_text() == custom
    save_tokenizer(spm_tokenizer, tmp_path)
    assert AutoTokenizer.from_pretrained(str(tmp_path)).chat_template == CHATML_TEMPLATE
    with pytest.raises(TokenizerExportError, match="does not render a one-message chat"):
        save_tokenizer(spm_tokenizer, tmp_path, chat_template="{% for m in messages %}")
    with pytest.raises(TokenizerExportError, match="non-empty string"):
        save_tokenizer(spm_tokenizer, tmp_path, chat_template="  ")
    with pytest.raises(TokenizerExportError, match="does not exist"):
        save_tokenizer(spm_tokenizer, tmp_path / "missing")
    with pytest.raises(TokenizerExportError, match="cannot export a str"):
        save_tokenizer("tokenizer", tmp_path)


def test_only_sentencepiece_models_trained_here_export(tmp_path):
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.split("\n")), model_prefix=str(tmp_path / "plain"), vocab_size=300,
        user_defined_symbols=[IM_START, IM_END], add_dummy_prefix=False, minloglevel=2,
    )  # unigram, NFKC, no byte fallback: loads as a SentencePieceTokenizer, tokenises otherwise
    with pytest.raises(TokenizerExportError, match="lacks model_type BPE, byte_fallback, identity normalisation"):
        save_tokenizer(SentencePieceTokenizer(tmp_path / "plain.model"), tmp_path)
