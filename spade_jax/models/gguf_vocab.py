"""A GGUF file's tokenizer, built from its metadata with `gguf` and `tokenizers` (no torch).

transformers' own GGUF route (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) reads the
metadata with a reader that imports torch, which the runtime install does not have. This module
reads the same llama.cpp keys (`tokenizer.ggml.*`, `tokenizer.chat_template`) with the `gguf`
package and builds the tokenizer transformers builds from them (transformers 5.24,
`integrations/gguf/gguf_tokenizer_mapping.py`), token for token:

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE on the file's vocabulary and merges;
  tokens spelled outside the byte alphabet are respelled through it.
- `tokenizer.ggml.pre` picks the split before the byte-level step: GPT-2's regex (the
  `ByteLevel` default) for "default", "gpt-2", "smollm", "starcoder", "refact"; the Llama 3
  regex for "llama-bpe", "llama3", ...; Qwen 2's for "qwen2" (Qwen 2 and 3), "deepseek-r1-qwen"
  (without the NFC normaliser of Qwen's tokenizer.json, as in transformers). Others are refused.
  llama.cpp also splits digits one by one for "smollm"/"starcoder"; transformers does not, and
  neither does this (SmolLM2's vocabulary has no multi-digit token, so only a run of spaces
  before a digit tokenises differently).
- Control tokens (token type 3) become special added tokens, user-defined ones (type 4) plain
  added tokens, so both are matched whole; bos/eos/unk/pad come from their `*_token_id` keys.

`tokenizer.ggml.model == "llama"` (SentencePiece BPE: Llama 2, Mistral, TinyLlama) is rebuilt
as transformers' `LlamaTokenizer` is: merges recovered from the scores, "▁" for spaces, byte
fallback, a "▁" prepended to the text unless `tokenizer.ggml.add_space_prefix` is false (which
transformers ignores, llama.cpp not). Other model types are refused with an error naming them.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

_GPT2_PRE = ("default", "gpt-2", "gpt2", "smollm", "starcoder", "refact")
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}
_MAX_TOKENS = 1 << 21  # a bound on the vocabulary a file may claim


class GGUFTokenizerError(ValueError):
    """A GGUF file whose tokenizer metadata cannot be built into a tokenizer; the message says why."""


@functools.lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def read_metadata(path: str | os.PathLike) -> dict:
    """The `tokenizer.*` metadata of a GGUF file (and `general.architecture`), as Python values."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(Path(path))
    except (ValueError, OSError) as e:
        raise GGUFTokenizerError(f"cannot read GGUF file {path}: {e}") from e
    keys = [k for k in reader.fields if k.startswith("tokenizer.") or k == "general.architecture"]
    return {k: reader.fields[k].contents() for k in keys}


def _special_token(meta: dict, tokens: list[str], name: str) -> str | None:
    token_id = meta.get(f"tokenizer.ggml.{name}")
    if token_id is None:
        return None
    if not isinstance(token_id, int) or not 0 <= token_id < len(tokens):
        raise GGUFTokenizerError(
            f"tokenizer.ggml.{name}={token_id!r} is not a token id of the {len(tokens)}-token vocabulary"
        )
    return tokens[token_id]


def _byte_level_bpe(meta: dict, tokens: list[str], token_types: list[int]):
    """The byte-level BPE `tokenizers.Tokenizer` of a "gpt2" vocabulary, with its added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in _GPT2_PRE and pre not in _SPLITS:
        raise GGUFTokenizerError(
            f"unknown GGUF pre-tokenizer tokenizer.ggml.pre={pre!r}; known: {sorted([*_GPT2_PRE, *_SPLITS])}"
        )
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or len(merges) > _MAX_TOKENS or not all(
        isinstance(m, str) and m.count(" ") == 1 for m in merges
    ):
        raise GGUFTokenizerError("tokenizer.ggml.merges must be a list of 'left right' strings for a gpt2 vocabulary")
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    tok = Tokenizer(BPE(
        vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
        continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
    ))
    if pre in _SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel (transformers skips it too).
    control = [t for t, k in zip(tokens, token_types) if k == CONTROL and set(t) <= alphabet]
    user = [t for t, k in zip(tokens, token_types) if k == USER_DEFINED and t in vocab]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece BPE vocabulary implies: every split of a token into two tokens,
    best token score first (transformers' `generate_merges`, order and ties included)."""
    merges = []
    for token, score in scores.items():
        splits = [(token[:k], token[k:], score) for k in range(1, len(token))]
        local = [m for m in splits if m[0] in vocab and m[1] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _sentencepiece_bpe(meta: dict, tokens: list[str], token_types: list[int]):
    """The `tokenizers.Tokenizer` of a "llama" (SentencePiece BPE) vocabulary, with its added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(tokens):
        raise GGUFTokenizerError(
            f"tokenizer.ggml.scores must hold one score per token ({len(tokens)}) for a llama vocabulary"
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _merges_from_scores(vocab, dict(zip(tokens, map(float, scores))))
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(steps + [decoders.Strip(content=" ", left=1)] * prefix)
    typed = list(zip(tokens, token_types))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in typed if k == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in typed if k == USER_DEFINED])
    return tok


def tokenizer_from_gguf(path: str | os.PathLike):
    """The `transformers.PreTrainedTokenizerFast` a GGUF file's metadata describes, chat template included."""
    from transformers import PreTrainedTokenizerFast

    meta = read_metadata(path)
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise GGUFTokenizerError(f"{path} holds no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
    if not isinstance(tokens, list) or not 0 < len(tokens) <= _MAX_TOKENS or not all(
        isinstance(t, str) for t in tokens
    ):
        raise GGUFTokenizerError(f"tokenizer.ggml.tokens of {path} must be a list of 1..{_MAX_TOKENS} strings")
    token_types = meta.get("tokenizer.ggml.token_type") or []
    if len(token_types) not in (0, len(tokens)):
        raise GGUFTokenizerError(f"tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens")
    builders = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}
    if model not in builders:
        raise GGUFTokenizerError(
            f"{path}: GGUF tokenizer model {model!r} is not supported (supported: 'gpt2', byte-level BPE as "
            "SmolLM2, Llama 3 and Qwen use; 'llama', SentencePiece BPE); load a Hugging Face directory instead"
        )
    backend = builders[model](meta, tokens, token_types)
    template = meta.get("tokenizer.chat_template")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=_special_token(meta, tokens, "bos_token_id"),
        eos_token=_special_token(meta, tokens, "eos_token_id"),
        unk_token=_special_token(meta, tokens, "unknown_token_id"),
        pad_token=_special_token(meta, tokens, "padding_token_id"),
        chat_template=template if isinstance(template, str) else None,
        # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise.
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama")),
        add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )
