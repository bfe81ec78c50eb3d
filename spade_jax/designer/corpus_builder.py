"""Local text/JSONL files -> a TFDS array_record dataset (no TensorFlow needed).

`prepare_local_corpus(paths, data_dir)` parses and validates the files, and builds them
with `SpadeTextCorpus`, a `tfds.core.GeneratorBasedBuilder` writing ``array_record``
files, so the result is read with random access by ``tfds.data_source`` exactly like a
catalog dataset prepared under a ``data_dir``. tensorflow-datasets 4.9.10 generates
and reads this format with numpy, array_record and its own protobuf serialisation;
TensorFlow is never imported (tests check ``sys.modules``).

Input formats:
  * ``.jsonl``: one JSON object per line with a non-empty string ``text`` (or, failing
    that, ``orig_doc``) field and an optional ``id`` (string or integer); blank lines
    are skipped. Default id: ``<file stem>:<line number>``.
  * ``.txt``: the whole file is ONE document (documents naturally contain blank-line
    separated paragraphs, so blank lines are not document boundaries); id = file stem.
  * a directory: its ``*.jsonl`` and ``*.txt`` files, sorted by name (not recursive).
Every problem (missing path, unknown extension, empty file, invalid JSON, missing or
empty text, bad id, duplicate id, invalid UTF-8) raises `CorpusError` naming the file
and, where there is one, the line.

Caching: the dataset's builder config is named after a SHA-256 fingerprint of the
inputs (file names and contents, plus the parser version), so identical inputs reuse
the prepared dataset and any edit builds a new one next to it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import tensorflow_datasets as tfds

BUILDER_NAME = "spade_text_corpus"
PARSER_VERSION = "1"
SUFFIXES = (".jsonl", ".txt")


class CorpusError(ValueError):
    """A corpus input or configuration the user has to fix (message names the file/line)."""


@dataclasses.dataclass(frozen=True)
class RawDocument:
    doc_id: str
    text: str
    source: str  # "file:line" or "file"


def resolve_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Expands directories and checks every input exists and has a known extension."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise CorpusError("no corpus paths given")
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise CorpusError(f"corpus path does not exist: {p}")
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.suffix in SUFFIXES)
            if not found:
                raise CorpusError(f"corpus directory {p} has no .jsonl or .txt files")
            files.extend(found)
        elif p.suffix in SUFFIXES:
            files.append(p)
        else:
            raise CorpusError(f"corpus file {p} must end in .jsonl or .txt")
    return files


def fingerprint(files: Sequence[Path]) -> str:
    """SHA-256 over the parser version and each file's name and bytes (streamed)."""
    h = hashlib.sha256(f"{BUILDER_NAME}/{PARSER_VERSION}".encode())
    for f in files:
        h.update(b"\0file\0" + f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _decode(path: Path, data: bytes, line: int | None = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        where = line if line is not None else data.count(b"\n", 0, e.start) + 1
        raise CorpusError(f"{path}:{where}: not valid UTF-8") from e


def _jsonl_documents(path: Path) -> Iterator[RawDocument]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = _decode(path, raw, lineno).strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(obj, dict):
                raise CorpusError(f"{path}:{lineno}: each line must be a JSON object, got "
                                  f"{type(obj).__name__}")
            text = obj["text"] if "text" in obj else obj.get("orig_doc")
            if not isinstance(text, str) or not text.strip():
                raise CorpusError(f"{path}:{lineno}: needs a non-empty string field 'text' "
                                  "(or 'orig_doc')")
            doc_id = obj.get("id", f"{path.stem}:{lineno}")
            if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or not str(doc_id):
                raise CorpusError(f"{path}:{lineno}: 'id' must be a non-empty string or an integer")
            yield RawDocument(str(doc_id), text.strip(), f"{path.name}:{lineno}")


def read_documents(files: Sequence[Path]) -> Iterator[RawDocument]:
    """Parses and validates the files, yielding documents in file order."""
    seen: dict[str, str] = {}
    for path in files:
        if path.suffix == ".txt":
            text = _decode(path, path.read_bytes()).strip()
            docs = [RawDocument(path.stem, text, path.name)] if text else []
        else:
            docs = _jsonl_documents(path)
        count = 0
        for doc in docs:
            if doc.doc_id in seen:
                raise CorpusError(f"{path}: document id {doc.doc_id!r} at {doc.source} "
                                  f"duplicates the one at {seen[doc.doc_id]}")
            seen[doc.doc_id] = doc.source
            count += 1
            yield doc
        if count == 0:
            raise CorpusError(f"{path}: contains no documents (empty file)")


class SpadeTextCorpus(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """TFDS builder over local files; features: id, text, source. One split: train.

    Not registered in the TFDS catalog: it is constructed with its input files, and the
    prepared dataset is read back by name from ``data_dir`` like any prepared dataset.
    """

    VERSION = tfds.core.Version("1.0.0")
    # No source directory to search for checksums/metadata files. Also avoids TFDS
    # 4.9.10's lookup of it importing `importlib_resources`, which it only declares as a
    # dependency for Python < 3.9 (ModuleNotFoundError on 3.11 for packaged builders).
    code_path = None

    def __init__(self, *, files: Sequence[Path], **kwargs):
        self._files = [Path(f) for f in files]
        config = tfds.core.BuilderConfig(
            name=f"f{fingerprint(self._files)[:20]}",
            description="local files: " + ", ".join(f.name for f in self._files))
        super().__init__(config=config, file_format="array_record", **kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="Documents for SPADE's environment designer, from local files.",
            features=tfds.features.FeaturesDict({
                "id": tfds.features.Text(),
                "text": tfds.features.Text(),
                "source": tfds.features.Text(),
            }),
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for doc in read_documents(self._files):
            yield doc.doc_id, {"id": doc.doc_id, "text": doc.text, "source": doc.source}


def prepare_local_corpus(paths, data_dir: str | os.PathLike | None = None) -> tuple[str, str]:
    """Builds (or reuses) the dataset for local files; returns (tfds name, data_dir).

    ``data_dir`` None means TFDS's default (``$TFDS_DATA_DIR`` or ~/tensorflow_datasets).
    Read the result with ``tfds.data_source(name, split="train", data_dir=data_dir)``.
    """
    files = resolve_paths(paths)
    builder = SpadeTextCorpus(files=files, data_dir=None if data_dir is None else os.fspath(data_dir))
    if not builder.is_prepared():
        builder.download_and_prepare()
    return f"{BUILDER_NAME}/{builder.builder_config.name}", os.fspath(builder.data_dir_root)


__all__ = ["BUILDER_NAME", "CorpusError", "RawDocument", "SpadeTextCorpus", "fingerprint",
           "prepare_local_corpus", "read_documents", "resolve_paths"]
