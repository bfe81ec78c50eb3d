"""Grounding documents for the designer: a TFDS data source sampled with a checkpointable cursor.

Sources (`CorpusConfig`):
  * local ``.jsonl`` / ``.txt`` files (``paths``), built once into an array_record TFDS
    dataset under ``data_dir`` by `corpus_builder.prepare_local_corpus` (cached by content);
  * any TFDS catalog dataset with a text feature already prepared in array_record format
    under ``data_dir`` (``name`` e.g. "c4/en" or "wikipedia/20230601.en", ``text_key``,
    optional ``id_key``), e.g. on a bucket;
  * neither: the small corpus shipped with the package (``data/corpus.jsonl``).
All three are read with ``tfds.data_source`` (random access, no TensorFlow).

Sampling is uniform without replacement within an epoch: epoch e visits the documents
in a pseudo-random permutation keyed by (seed, e), and the next epoch reshuffles. The
permutation is a keyed Feistel network with cycle walking, so it needs O(1) memory
even for corpora of hundreds of millions of documents. The cursor state is a dict of
four ints (`Corpus.state`); restoring it continues the exact same sequence.

Each document is truncated to ``max_words`` whitespace-separated words (formatting
kept) and presented to the designer wrapped by `Document.as_reference`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spade_jax.designer.corpus_builder import CorpusError

PACKAGED_CORPUS = Path(__file__).parent / "data" / "corpus.jsonl"
_WORD = re.compile(r"\S+")
_MASK64 = (1 << 64) - 1


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    """Where documents come from and how they are sampled.

    paths: local .jsonl/.txt files or directories (see corpus_builder for the format).
    name: a TFDS dataset name, used when ``paths`` is empty; both empty means the
      packaged corpus. split: TFDS split of ``name``. data_dir: TFDS data directory
      ("": TFDS's default, ``$TFDS_DATA_DIR`` or ~/tensorflow_datasets); local files
      are built there too. text_key / id_key: features of ``name`` holding the text and
      a stable id (with id_key "" the id is ``name/split/index``, stable for a given
      prepared dataset). max_words: truncation length. seed: sampling order.
    """

    paths: tuple[str, ...] = ()
    name: str = ""
    split: str = "train"
    data_dir: str = ""
    text_key: str = "text"
    id_key: str = ""
    max_words: int = 6000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Document:
    """A (possibly truncated) document: text holds at most max_words words of the original."""

    doc_id: str
    text: str
    n_words: int
    truncated: bool

    def as_reference(self) -> str:
        """The document wrapped as the designer's reference material."""
        note = (f"\n[... truncated: first {len(_WORD.findall(self.text))} of {self.n_words} words]"
                if self.truncated else "")
        return f'<reference_document id="{self.doc_id}">\n{self.text}{note}\n</reference_document>'


def truncate_words(text: str, max_words: int) -> tuple[str, int, bool]:
    """(first max_words words of text with original spacing, total words, whether cut)."""
    if max_words < 1:
        raise CorpusError(f"max_words must be >= 1, got {max_words}")
    end, n = None, 0
    for n, m in enumerate(_WORD.finditer(text), start=1):
        if n == max_words:
            end = m.end()
    if n <= max_words:
        return text.strip(), n, False
    return text[:end].strip(), n, True


def _mix64(x: int) -> int:
    """splitmix64 finaliser: a fast, well-mixed 64-bit hash."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


class FeistelPermutation:
    """A pseudo-random permutation of range(n) keyed by (seed, epoch), O(1) memory.

    A 4-round balanced Feistel network on the smallest even bit width covering n is a
    bijection of [0, 2^bits); cycle walking (re-applying it until the value is < n)
    restricts it to a bijection of [0, n), with fewer than 4 steps on average.
    """

    ROUNDS = 4

    def __init__(self, n: int, seed: int, epoch: int):
        if n < 1:
            raise CorpusError("cannot sample from an empty corpus")
        self.n = n
        half = max(1, ((n - 1).bit_length() + 1) // 2)
        self._half, self._half_mask = half, (1 << half) - 1
        base = _mix64((seed & _MASK64) ^ _mix64((epoch + 0x9E3779B97F4A7C15) & _MASK64))
        self._keys = [_mix64(base + r + 1) for r in range(self.ROUNDS)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self._half, x & self._half_mask
        for k in self._keys:
            left, right = right, left ^ (_mix64(right ^ k) & self._half_mask)
        return (left << self._half) | right

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._encrypt(i)
        while x >= self.n:
            x = self._encrypt(x)
        return x


class Corpus:
    """Random-access documents plus the sampling cursor (the state that is checkpointed)."""

    def __init__(self, source: Sequence[Any], *, text_key: str = "text", id_key: str | None = None,
                 id_prefix: str = "", max_words: int = 6000, seed: int = 0):
        """source: random-access records (a tfds data source, or any sequence of dicts)."""
        self._source = source
        self._n = len(source)
        if self._n == 0:
            raise CorpusError(f"corpus {id_prefix or 'source'} has no documents")
        if max_words < 1:
            raise CorpusError(f"max_words must be >= 1, got {max_words}")
        self.text_key, self.id_key, self.id_prefix = text_key, id_key, id_prefix
        self.max_words, self.seed = int(max_words), int(seed)
        self._epoch, self._position = 0, 0
        self._perm = FeistelPermutation(self._n, self.seed, 0)

    @classmethod
    def from_config(cls, cfg: CorpusConfig) -> Corpus:
        """Opens the configured source with ``tfds.data_source`` (building local files first)."""
        import tensorflow_datasets as tfds

        from spade_jax.designer import corpus_builder

        if cfg.paths or not cfg.name:
            paths = list(cfg.paths) or [PACKAGED_CORPUS]
            name, data_dir = corpus_builder.prepare_local_corpus(paths, cfg.data_dir or None)
            text_key, id_key, split = "text", "id", "train"
        else:
            name, data_dir, text_key, id_key, split = cfg.name, cfg.data_dir or None, cfg.text_key, cfg.id_key or None, cfg.split
        try:
            source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
        except Exception as e:  # tfds raises several types; all mean "not usable here"
            raise CorpusError(
                f"TFDS dataset {name!r} split {split!r} is not available under data_dir="
                f"{data_dir or 'TFDS default'} ({type(e).__name__}: {str(e).splitlines()[0]}). "
                "Prepare it there in array_record format first (e.g. `tfds build "
                f"{name} --file_format=array_record --data_dir=...`) or fix name/split/data_dir"
            ) from e
        return cls(source, text_key=text_key, id_key=id_key, id_prefix=f"{name}/{split}",
                   max_words=cfg.max_words, seed=cfg.seed)

    def __len__(self) -> int:
        return self._n

    def document(self, index: int) -> Document:
        """The document at a source index, truncated."""
        record = self._source[index]
        if self.text_key not in record:
            raise CorpusError(f"corpus {self.id_prefix}: records have no feature {self.text_key!r} "
                              f"(available: {sorted(record)}); set text_key")
        text = _as_str(record[self.text_key])
        if self.id_key is None:
            doc_id = f"{self.id_prefix}/{index}" if self.id_prefix else str(index)
        elif self.id_key in record:
            doc_id = _as_str(record[self.id_key])
        else:
            raise CorpusError(f"corpus {self.id_prefix}: records have no feature {self.id_key!r} "
                              f"(available: {sorted(record)}); set id_key")
        body, n_words, truncated = truncate_words(text, self.max_words)
        return Document(doc_id=doc_id, text=body, n_words=n_words, truncated=truncated)

    def next_index(self) -> int:
        """Advances the cursor and returns the source index of the next document."""
        index = self._perm[self._position]
        self._position += 1
        if self._position == self._n:
            self._epoch, self._position = self._epoch + 1, 0
            self._perm = FeistelPermutation(self._n, self.seed, self._epoch)
        return index

    def sample(self, n: int = 1) -> list[Document]:
        """The next ``n`` documents of the sampling order."""
        return [self.document(self.next_index()) for _ in range(n)]

    def state(self) -> dict[str, int]:
        """Cursor state: {"seed", "epoch", "position", "num_documents"} (ints, JSON-ready)."""
        return {"seed": self.seed, "epoch": self._epoch, "position": self._position,
                "num_documents": self._n}

    def restore(self, state: dict[str, int]) -> None:
        """Continues from a saved cursor; the corpus must have the same number of documents."""
        if int(state["num_documents"]) != self._n:
            raise CorpusError(f"corpus cursor was saved for {state['num_documents']} documents but "
                              f"this corpus has {self._n}: the corpus changed since the checkpoint")
        position = int(state["position"])
        if not 0 <= position < self._n:
            raise CorpusError(f"corpus cursor position {position} is out of range [0, {self._n})")
        self.seed, self._epoch, self._position = int(state["seed"]), int(state["epoch"]), position
        self._perm = FeistelPermutation(self._n, self.seed, self._epoch)


def _as_str(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if hasattr(value, "item"):  # numpy scalar / 0-d array from a data source
        return _as_str(value.item())
    return str(value)


__all__ = ["PACKAGED_CORPUS", "Corpus", "CorpusConfig", "CorpusError", "Document",
           "FeistelPermutation", "truncate_words"]
