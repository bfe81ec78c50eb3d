"""A policy's tokenizer and chat template as Hugging Face tokenizer files.

API for the weights exporter: `save_tokenizer(policy.tokenizer, out_dir, chat_template=None)`
writes `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json` and
`chat_template.jinja` into the existing directory `out_dir` and returns those names (sorted).
`transformers.AutoTokenizer.from_pretrained(out_dir)` then loads a `PreTrainedTokenizerFast`
(`tokenizer_class` in the config, a plain `tokenizer.json`: no custom code; checked with
transformers 5.24 and 4.51) whose ids,
decoding and `apply_chat_template(..., tokenize=False)` equal the project tokenizer's. Both
classes are handled: `HFTokenizer` (SmolLM2, Qwen: its own `tokenizer.json` and chat template)
and `SentencePieceTokenizer` (the `tiny` bootstrap: rebuilt as a `tokenizers` BPE model, with
the ChatML template `CHATML_TEMPLATE`, which renders exactly `render_chatml`). `chat_template`
replaces the template written (default: the one the tokenizer renders with); pass the run's if
it differs. The exported `eos_token` is the tokenizer's first stop id (SmolLM2's and `tiny`'s `<|im_end|>`);
put all of `tokenizer.eos_token_ids` into `generation_config.json`'s `eos_token_id` so
generation stops on every token the project stops on. The files are loaded back before it
returns (about a second): a probe text must tokenise the same and the template must render a
one-message chat, and the tokenizer's own template render exactly its chat; anything else, or a
tokenizer it cannot export, raises `TokenizerExportError`.

One difference from SentencePiece: the control pieces' spellings (`<s>`, `</s>`, `<pad>`,
`<unk>`) written literally in text are the special tokens to transformers (as in every Hugging
Face Llama tokenizer) but plain characters to SentencePiece.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from spade_jax.models.tokenizer import IM_END, IM_START, HFTokenizer, SentencePieceTokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '" + IM_START + "' + message['role'] + '\\n' + message['content'] + '" + IM_END + "' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + IM_START + "assistant\\n' }}{% endif %}"
)
_MAX_TEMPLATE_CHARS = 1 << 20


class TokenizerExportError(ValueError):
    """A tokenizer or chat template that cannot be written as Hugging Face files; the message says why."""


def save_tokenizer(tokenizer, out_dir: str | os.PathLike, *, chat_template: str | None = None) -> list[str]:
    """Writes `tokenizer`'s Hugging Face tokenizer files into `out_dir`; returns the file names written."""
    out = Path(out_dir)
    if not out.is_dir():
        raise TokenizerExportError(f"output directory {out} does not exist")
    if isinstance(tokenizer, SentencePieceTokenizer):
        backend, specials = _sentencepiece_backend(tokenizer)
        template = CHATML_TEMPLATE
        extra = dict(clean_up_tokenization_spaces=False, add_bos_token=False, add_eos_token=False)
    elif isinstance(tokenizer, HFTokenizer):
        backend, specials, template, extra = _hf_parts(tokenizer)
    else:
        raise TokenizerExportError(f"cannot export a {type(tokenizer).__name__}; HFTokenizer or SentencePieceTokenizer")
    template = _check_template(chat_template if chat_template is not None else template)
    added = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                 "single_word": t.single_word, "special": t.special}
        for i, t in sorted(backend.get_added_tokens_decoder().items())
    }
    extra_specials = [
        t["content"] for t in added.values() if t["special"] and t["content"] not in specials.values()
    ]
    special_map = {**{k: v for k, v in specials.items() if v is not None}, "additional_special_tokens": extra_specials}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        **extra,
        "added_tokens_decoder": added,
        "chat_template": template,
    }
    files = {
        "tokenizer.json": backend.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2, ensure_ascii=False),
        "chat_template.jinja": template,
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    _verify(out, tokenizer, own_template=chat_template is None)
    return sorted(files)


def _check_template(template) -> str:
    if not isinstance(template, str) or not template.strip():
        raise TokenizerExportError(f"the chat template must be a non-empty string, got {type(template).__name__}")
    if len(template) > _MAX_TEMPLATE_CHARS:
        raise TokenizerExportError(f"the chat template has {len(template)} characters; at most {_MAX_TEMPLATE_CHARS}")
    return template


_PROBE_TEXT = f"Hi 日本 🙂\n\n  x = 12  {IM_START}user\n{IM_END}"
_PROBE_CHAT = [{"role": "user", "content": "Hi"}]


def _verify(out: Path, tokenizer, *, own_template: bool) -> None:
    """Loads the files back with `AutoTokenizer`: a probe text must give the same ids, and the
    template must render (and, when it is the tokenizer's own, render what the tokenizer does)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    if hf.encode(_PROBE_TEXT, add_special_tokens=False) != tokenizer.encode(_PROBE_TEXT):
        raise TokenizerExportError(f"the tokenizer written to {out} does not tokenise as {type(tokenizer).__name__}")
    try:
        text = hf.apply_chat_template(_PROBE_CHAT, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # jinja2's syntax and render errors, the template's own raise_exception
        raise TokenizerExportError(f"the chat template does not render a one-message chat: {e}") from e
    if own_template and text != tokenizer.apply_chat_template_text(_PROBE_CHAT):
        raise TokenizerExportError(f"the chat template written to {out} renders differently from the tokenizer's")


def _hf_parts(tokenizer: HFTokenizer):
    """The backend, special tokens, chat template and settings of a transformers tokenizer."""
    hf = tokenizer.hf
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerExportError(f"{type(hf).__name__} has no `tokenizers` backend to write as tokenizer.json")
    template = hf.chat_template
    if isinstance(template, dict):  # named templates: the one apply_chat_template uses
        template = template.get("default")
    specials = {name: getattr(hf, name) for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    specials = {k: str(v) if v is not None else None for k, v in specials.items()}
    extra = dict(
        clean_up_tokenization_spaces=bool(getattr(hf, "clean_up_tokenization_spaces", False)),
        add_bos_token=bool(getattr(hf, "add_bos_token", False)),
        add_eos_token=bool(getattr(hf, "add_eos_token", False)),
        model_max_length=int(min(hf.model_max_length, 1 << 62)),
    )
    return backend, specials, template, extra


def _sentencepiece_backend(tokenizer: SentencePieceTokenizer):
    """A `tokenizers` BPE model that tokenises exactly as the SentencePiece model does.

    SentencePiece BPE merges, at each step, the adjacent pair whose concatenation is the
    best-scoring normal piece; a BPE model whose merges are those pieces' splits, ranked by
    the piece's score, does the same. The trained models keep text as it is apart from
    spaces, written "▁" (identity normalisation, no dummy prefix), and fall back to bytes.
    Control pieces and the ChatML markers become special added tokens, the other
    user-defined symbols plain added tokens: all are matched whole in the text.
    """
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    sp = tokenizer.sp
    proto = sentencepiece_model_pb2.ModelProto.FromString(sp.serialized_model_proto())
    trainer, norm = proto.trainer_spec, proto.normalizer_spec
    Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
    problems = [
        what for what, bad in (
            ("model_type BPE", trainer.model_type != sentencepiece_model_pb2.TrainerSpec.BPE),
            ("byte_fallback", not trainer.byte_fallback),
            ("identity normalisation", norm.precompiled_charsmap or norm.name not in ("identity", "")),
            ("no dummy prefix", norm.add_dummy_prefix),
            ("no whitespace removal", norm.remove_extra_whitespaces),
            ("escaped whitespace", not norm.escape_whitespaces),
            ("whitespace as prefix", trainer.treat_whitespace_as_suffix),
        ) if bad
    ]
    if problems:
        raise TokenizerExportError(
            "only SentencePiece models made by SentencePieceTokenizer.train export; this one lacks "
            + ", ".join(problems)
        )
    pieces = list(proto.pieces)
    vocab = {p.piece: i for i, p in enumerate(pieces)}
    normal = {p.piece: p.score for p in pieces if p.type == Piece.NORMAL}
    ranked = []
    for i, p in enumerate(pieces):
        if p.type != Piece.NORMAL:
            continue
        for k in range(1, len(p.piece)):
            left, right = p.piece[:k], p.piece[k:]
            if left in normal and right in normal:
                ranked.append((-p.score, i, k, left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    backend = Tokenizer(BPE(
        vocab=vocab, merges=merges, unk_token=pieces[sp.unk_id()].piece, byte_fallback=True, fuse_unk=True,
        dropout=None,
    ))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    special = [p.piece for p in pieces if p.type in (Piece.CONTROL, Piece.UNKNOWN) or p.piece in (IM_START, IM_END)]
    plain = [p.piece for p in pieces if p.type == Piece.USER_DEFINED and p.piece not in special]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in plain])

    def piece(i: int) -> str | None:
        return pieces[i].piece if 0 <= i < len(pieces) else None

    specials = {
        "bos_token": piece(sp.bos_id()), "eos_token": piece(tokenizer.eos_token_ids[0]),
        "unk_token": piece(sp.unk_id()), "pad_token": piece(tokenizer.pad_id),
    }
    return backend, specials
