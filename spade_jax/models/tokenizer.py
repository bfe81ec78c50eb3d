"""Tokenizers behind one small interface: Hugging Face (with its chat template) and SentencePiece (ChatML).

The rest of the code base only sees `Tokenizer`: text <-> ids, chat messages -> prompt
ids, the stop tokens that end a turn, the pad id and the vocabulary size. `encode`
never adds special tokens (chat templates carry their own), so prompt ids are exactly
the template's text tokenised.

`escape_special(text)` makes text from outside the policy (environment observations,
hints, transcripts, code written by the designer) safe to put in a prompt: `encode` turns
every occurrence of a special token's string into that token, so an observation holding
"<|im_end|>\n<|im_start|>assistant" would otherwise close the user turn and forge an
assistant one. Each such occurrence gets U+2060 WORD JOINER after its first character
(invisible, so the text still reads the same); text holding none is returned unchanged,
so its tokenisation is untouched. Special tokens are the ones that structure a
conversation (those `decode(skip_special_tokens=True)` drops and text can produce).
Ordinary added tokens ("<tool_call>", "<think>", the bootstrap tokenizer's "\\boxed{")
are vocabulary: they tokenise text the way the policy itself writes it, so they stay.
`escape_chat_markers(text)` does the same without a tokenizer, for the special-token
spellings of the common chat formats (every "<|...|>", Gemma, Llama 2 / Mistral, StarCoder):
for prompts rendered before the policy's tokenizer is known (designer exemplars).
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from absl import logging

Message = Mapping[str, str]  # {"role": ..., "content": ...}

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

WORD_JOINER = "\u2060"

# Tokens that end a turn or a document in the chat formats we meet (ChatML, Llama 3, Gemma, Phi).
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
)


class Tokenizer(abc.ABC):
    """What the sampler, designer and agent need from a tokenizer."""

    eos_token_ids: tuple[int, ...]  # stop tokens: end of sequence and end of turn
    pad_id: int
    vocab_size: int

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without added special tokens."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""

    @abc.abstractmethod
    def apply_chat_template_text(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text of a conversation (ending with the assistant header if asked)."""

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[int]:
        """The prompt ids of a conversation."""
        return self.encode(self.apply_chat_template_text(messages, add_generation_prompt))

    @abc.abstractmethod
    def escape_special(self, text: str) -> str:
        """`text` with no special token's string left in it (see the module docstring)."""


class _SpecialEscaper:
    """Breaks every occurrence of a set of token strings with a word joiner after its first character.

    Strings shorter than two characters cannot be broken that way and strings of whitespace
    only are ordinary text (some tokenizers add runs of spaces as tokens), so both are left
    alone. Overlapping strings ("ab", "bc" in "abc") are handled by repeating the pass until
    none is left; a pass never creates an occurrence, so this ends.
    """

    def __init__(self, strings: Iterable[str]):
        self.strings = tuple(sorted(
            {s for s in strings if isinstance(s, str) and len(s) >= 2 and s.strip() and WORD_JOINER not in s},
            key=lambda s: (-len(s), s),
        ))
        self._pattern = re.compile("|".join(map(re.escape, self.strings))) if self.strings else None

    def __call__(self, text: str) -> str:
        return text if self._pattern is None else _break_matches(self._pattern, text)


def _break_matches(pattern: re.Pattern, text: str) -> str:
    """``text`` with a word joiner after the first character of every match, until none is left."""
    while pattern.search(text) is not None:
        text = pattern.sub(lambda m: m.group()[0] + WORD_JOINER + m.group()[1:], text)
    return text


# Special-token spellings of the common chat formats, for text rendered without a tokenizer.
_CHAT_MARKERS = (
    "<s>", "</s>", "<bos>", "<eos>", "<pad>", "<unk>", "<start_of_turn>", "<end_of_turn>",  # Llama 2, Gemma
    "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>",  # Llama 2 / Mistral
    "<repo_name>", "<reponame>", "<file_sep>", "<filename>", "<gh_stars>", "<issue_start>",  # StarCoder,
    "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>", "<jupyter_code>",  # SmolLM2
    "<jupyter_output>", "<jupyter_script>", "<empty_output>",
)
_CHAT_MARKER_PATTERN = re.compile(
    r"<\|[^|<>\s]{1,80}\|>|<\uff5c[^\uff5c<>\s]{1,80}\uff5c>"  # <|im_end|>, <|eot_id|>, DeepSeek's <｜...｜>
    + "|" + "|".join(map(re.escape, sorted(_CHAT_MARKERS, key=len, reverse=True)))
)


def escape_chat_markers(text: str) -> str:
    """`text` with every common chat-format special-token spelling broken by a word joiner.

    For model-written text put into prompts rendered without a tokenizer; with one at hand
    use `Tokenizer.escape_special`, which knows exactly that tokenizer's specials.
    """
    return _break_matches(_CHAT_MARKER_PATTERN, text)


def _check_messages(messages: Sequence[Message]) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
            m.get("content"), str
        ):
            raise ValueError(
                f"chat message {i} must be a dict with string 'role' and 'content', got {m!r}"
            )


class HFTokenizer(Tokenizer):
    """A transformers tokenizer and its chat template."""

    def __init__(self, tokenizer, extra_eos_ids: Iterable[int] = ()):
        self.hf = tokenizer
        vocab = tokenizer.get_vocab()
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        eos += list(extra_eos_ids)
        eos += [vocab[t] for t in END_OF_TURN_TOKENS if t in vocab]
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos))
        if not self.eos_token_ids:
            raise ValueError("tokenizer defines no end-of-sequence or end-of-turn token")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_token_ids[0])
        self.vocab_size = len(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        specials = [t.content for t in added if getattr(t, "special", False)]
        self._escaper = _SpecialEscaper([*specials, *tokenizer.all_special_tokens])

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> "HFTokenizer":
        """The tokenizer of a Hugging Face model directory (plus `generation_config.json` stop ids)."""
        from transformers import AutoTokenizer

        directory = Path(directory)
        extra: list[int] = []
        gen_config = directory / "generation_config.json"
        if gen_config.exists():
            eos = json.loads(gen_config.read_text()).get("eos_token_id")
            extra = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(AutoTokenizer.from_pretrained(str(directory)), extra)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> "HFTokenizer":
        """The tokenizer a GGUF file's metadata describes (`gguf_vocab.tokenizer_from_gguf`: no torch).

        Building it parses the whole GGUF vocabulary (several seconds), so the result
        is saved once in `cache_dir` (default `$SPADE_JAX_CACHE` or `~/.cache/spade_jax`,
        keyed by the file's path, size and mtime) and read back from there afterwards;
        without the cache (none yet, or not writable) it is built from the file each time.
        """
        from transformers import AutoTokenizer

        from spade_jax.models.gguf_vocab import tokenizer_from_gguf

        path = Path(path).resolve()
        stat = path.stat()
        key = hashlib.sha1(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        root = Path(cache_dir or os.environ.get("SPADE_JAX_CACHE") or Path.home() / ".cache" / "spade_jax")
        cached = root / "gguf_tokenizers" / f"{path.stem}-{key}"
        if (cached / "tokenizer_config.json").exists():
            return cls(AutoTokenizer.from_pretrained(str(cached)))
        tokenizer = tokenizer_from_gguf(path)
        staging = None
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            staging = tempfile.mkdtemp(dir=cached.parent)
            tokenizer.save_pretrained(staging)
            os.replace(staging, cached)
        except OSError as e:  # read-only home, a concurrent writer won: the cache is only an optimisation
            logging.info("GGUF tokenizer not cached in %s: %s", cached, e)
            if staging:
                shutil.rmtree(staging, ignore_errors=True)
        return cls(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def escape_special(self, text: str) -> str:
        """Every special token's string (the special added tokens and `all_special_tokens`) neutralised."""
        return self._escaper(text)

    def apply_chat_template_text(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        _check_messages(messages)
        if not self.hf.chat_template:
            raise ValueError("this tokenizer has no chat template; use a chat/instruct model's tokenizer")
        return self.hf.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt
        )


def render_chatml(messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    """ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message."""
    _check_messages(messages)
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model with a ChatML template whose markers are single tokens.

    Models made by `train` keep text exactly (identity normalisation, no dummy prefix,
    byte fallback), so `decode(encode(text)) == text` for any text, code included.
    """

    UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3

    def __init__(self, model_file: str | os.PathLike):
        import sentencepiece as spm

        model_file = Path(model_file)
        if not model_file.exists():
            raise FileNotFoundError(f"SentencePiece model {model_file} does not exist")
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        chat_ids = []
        for token in (IM_START, IM_END):
            i = self.sp.piece_to_id(token)
            if i == self.sp.unk_id() or self.sp.encode(token) != [i]:
                raise ValueError(
                    f"SentencePiece model {model_file} lacks the chat token {token!r} as a "
                    "user-defined symbol; train it with SentencePieceTokenizer.train"
                )
            chat_ids.append(i)
        self.im_start_id, self.im_end_id = chat_ids
        eos = [i for i in (self.im_end_id, self.sp.eos_id()) if i >= 0]
        self.eos_token_ids = tuple(dict.fromkeys(eos))
        self.pad_id = self.sp.pad_id() if self.sp.pad_id() >= 0 else self.eos_token_ids[0]
        self.vocab_size = self.sp.get_piece_size()
        self._special_ids = frozenset(
            i
            for i in range(self.vocab_size)
            if self.sp.is_control(i) or i in chat_ids or i == self.sp.unk_id()
        )
        # Of the special pieces only the ChatML markers (user-defined symbols) come out of
        # encoding text: control pieces (<s>, </s>) and <unk> never do.
        self._escaper = _SpecialEscaper((IM_START, IM_END))

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        model_prefix: str | os.PathLike,
        user_defined_symbols: Sequence[str] = (),
        *,
        model_type: str = "bpe",
        **trainer_options,
    ) -> "SentencePieceTokenizer":
        """Trains a model on `texts` (split into lines) and returns it; writes `{model_prefix}.model`.

        The ChatML markers are always added as user-defined symbols (single tokens);
        `user_defined_symbols` adds more (tool-call tags, say).
        """
        import sentencepiece as spm

        symbols = list(dict.fromkeys([IM_START, IM_END, *user_defined_symbols]))
        lines = (line for text in texts for line in text.split("\n") if line)
        options = dict(
            model_type=model_type,
            vocab_size=vocab_size,
            user_defined_symbols=symbols,
            byte_fallback=True,
            normalization_rule_name="identity",
            add_dummy_prefix=False,
            remove_extra_whitespaces=False,
            split_digits=True,
            allow_whitespace_only_pieces=True,
            unk_id=cls.UNK_ID,
            bos_id=cls.BOS_ID,
            eos_id=cls.EOS_ID,
            pad_id=cls.PAD_ID,
            minloglevel=2,
        )
        options.update(trainer_options)
        Path(model_prefix).parent.mkdir(parents=True, exist_ok=True)
        spm.SentencePieceTrainer.train(sentence_iterator=lines, model_prefix=str(model_prefix), **options)
        return cls(f"{model_prefix}.model")

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text, out_type=int))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self.sp.decode(ids)

    def escape_special(self, text: str) -> str:
        """The ChatML markers' strings neutralised (other user-defined symbols are vocabulary)."""
        return self._escaper(text)

    def apply_chat_template_text(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> str:
        return render_chatml(messages, add_generation_prompt)
