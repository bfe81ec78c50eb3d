"""The special tokens of the tokenizers the project ships, read from the tokenizers themselves, and a
check that exported files hold none of them literally (tests of `trajectories` and `envpack`).

Shipped: the packaged SmolLM2 GGUF (its control and user-defined tokens), the bootstrap's
SentencePiece (`SentencePieceTokenizer.train`: its control and unknown pieces and the ChatML
markers), and the turn markers `spade_jax.models.tokenizer` knows.
"""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def gguf_special_tokens(gguf_path: Path) -> tuple[str, ...]:
    from spade_jax.models.gguf_vocab import CONTROL, USER_DEFINED, read_metadata

    meta = read_metadata(gguf_path)
    return tuple(t for t, kind in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"])
                 if kind in (CONTROL, USER_DEFINED))


def sentencepiece_special_tokens(tokenizer) -> tuple[str, ...]:
    from spade_jax.models.tokenizer import IM_END, IM_START

    sp = tokenizer.sp
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
    return (*pieces, IM_START, IM_END)


def shipped_special_tokens(gguf_path: Path, sentencepiece_tokenizer) -> tuple[str, ...]:
    """Every special-token string of the shipped tokenizers, longest first."""
    from spade_jax.models.tokenizer import END_OF_TURN_TOKENS

    tokens = {*gguf_special_tokens(gguf_path), *sentencepiece_special_tokens(sentencepiece_tokenizer),
              *END_OF_TURN_TOKENS}
    assert len(tokens) > 20 and {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>"} <= tokens
    return tuple(sorted(tokens, key=lambda t: (-len(t), t)))


def literal_special_tokens(root: Path, tokens) -> dict[str, list[str]]:
    """File (relative to `root`, or `root`'s name when it is a file) -> the tokens it holds literally,
    for every file under `root` that holds one (read as UTF-8 bytes, so nothing is decoded first)."""
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    found = {}
    for path in files:
        data = path.read_bytes()
        hits = [t for t in tokens if t.encode("utf-8") in data]
        if hits:
            found[path.name if path == root else str(path.relative_to(root))] = hits
    return found
