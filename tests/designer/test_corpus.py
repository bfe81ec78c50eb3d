"""Corpus: TFDS array_record build without TensorFlow, caching, errors, cursor, truncation."""
import json
import sys
from collections import Counter

import pytest

from spade_jax.designer import corpus_builder
from spade_jax.designer.corpus import (PACKAGED_CORPUS, Corpus, CorpusConfig, CorpusError,
                                       Document, FeistelPermutation, truncate_words)

SKILLS = ("mathematical reasoning", "logical deduction", "spatial reasoning",
          "pattern recognition", "optimization", "causal inference")


def _write(path, text, mode="w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def test_packaged_corpus_content():
    rows = [json.loads(line) for line in PACKAGED_CORPUS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 36
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert 150 <= len(r["text"].split()) <= 400, r["id"]
    per_skill = Counter(s for r in rows for s in r["skills"])
    assert set(per_skill) == set(SKILLS)
    assert min(per_skill.values()) >= 6


def test_packaged_corpus_through_tfds_without_tensorflow(tmp_path):
    c = Corpus.from_config(CorpusConfig(data_dir=str(tmp_path), max_words=50))
    rows = [json.loads(line) for line in PACKAGED_CORPUS.read_text().splitlines() if line.strip()]
    assert len(c) == len(rows)
    docs = c.sample(len(c))
    assert {d.doc_id for d in docs} == {r["id"] for r in rows}  # one epoch visits each once
    by_id = {r["id"]: r["text"] for r in rows}
    d = docs[0]
    assert d.truncated and d.n_words == len(by_id[d.doc_id].split())
    assert d.text.split() == by_id[d.doc_id].split()[:50]
    assert not [m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.")]


def test_local_jsonl_and_txt_files_ids_and_fields(tmp_path):
    src = tmp_path / "src"
    _write(src / "a.jsonl", '{"id": "first", "text": "one two three"}\n\n'
                            '{"orig_doc": "  from orig doc  "}\n{"id": 7, "text": "seven"}\n')
    _write(src / "notes.txt", "Title\n\nFirst paragraph.\n\nSecond paragraph.\n")
    _write(src / "ignored.md", "not a corpus file")
    name, data_dir = corpus_builder.prepare_local_corpus([src], tmp_path / "tfds")
    assert name.startswith("spade_text_corpus/f")
    c = Corpus.from_config(CorpusConfig(paths=(str(src),), data_dir=str(tmp_path / "tfds")))
    docs = {d.doc_id: d for d in c.sample(4)}
    assert set(docs) == {"first", "a:3", "7", "notes"}
    assert docs["a:3"].text == "from orig doc"
    assert docs["notes"].text == "Title\n\nFirst paragraph.\n\nSecond paragraph."
    raw = [c._source[i] for i in range(len(c))]
    assert sorted(r["source"].decode() for r in raw) == ["a.jsonl:1", "a.jsonl:3", "a.jsonl:4",
                                                          "notes.txt"]


def test_build_is_cached_and_inputs_change_the_dataset(tmp_path, monkeypatch):
    f = _write(tmp_path / "docs.jsonl", '{"text": "alpha beta"}\n')
    name1, data_dir = corpus_builder.prepare_local_corpus(f, tmp_path / "tfds")
    record_files = list((tmp_path / "tfds").rglob("*.array_record*"))
    assert len(record_files) == 1
    stamp = record_files[0].stat().st_mtime_ns

    def no_rebuild(*a, **k):
        raise AssertionError("rebuilt a cached corpus")

    monkeypatch.setattr(corpus_builder, "read_documents", no_rebuild)
    assert corpus_builder.prepare_local_corpus(f, tmp_path / "tfds") == (name1, data_dir)
    assert record_files[0].stat().st_mtime_ns == stamp
    monkeypatch.undo()
    _write(f, '{"text": "alpha beta gamma"}\n')
    name2, _ = corpus_builder.prepare_local_corpus(f, tmp_path / "tfds")
    assert name2 != name1
    c = Corpus.from_config(CorpusConfig(paths=(str(f),), data_dir=str(tmp_path / "tfds")))
    assert c.sample()[0].text == "alpha beta gamma"


@pytest.mark.parametrize("filename,content,message", [
    ("bad.jsonl", '{"text": "ok"}\n{"text": oops}\n', r"bad\.jsonl:2: not valid JSON"),
    ("bad.jsonl", '{"text": "ok"}\n["a list"]\n', r"bad\.jsonl:2: each line must be a JSON object"),
    ("bad.jsonl", '{"title": "no text"}\n', r"bad\.jsonl:1: needs a non-empty string field 'text'"),
    ("bad.jsonl", '{"text": "   "}\n', r"bad\.jsonl:1: needs a non-empty string field"),
    ("bad.jsonl", '{"text": "x", "id": [1]}\n', r"bad\.jsonl:1: 'id' must be"),
    ("bad.jsonl", '{"id": "d", "text": "x"}\n\n{"id": "d", "text": "y"}\n',
     r"bad\.jsonl: document id 'd' at bad\.jsonl:3 duplicates the one at bad\.jsonl:1"),
    ("bad.jsonl", "\n\n", r"bad\.jsonl: contains no documents"),
    ("empty.txt", "  \n", r"empty\.txt: contains no documents"),
    ("bad.jsonl", b'{"text": "ok"}\n{"text": "\xff"}\n', r"bad\.jsonl:2: not valid UTF-8"),
    ("bad.txt", b"fine\nalso fine\n\xfe\n", r"bad\.txt:3: not valid UTF-8"),
])
def test_malformed_inputs_name_file_and_line(tmp_path, filename, content, message):
    f = _write(tmp_path / filename, content, "wb" if isinstance(content, bytes) else "w")
    with pytest.raises(CorpusError, match=message):
        corpus_builder.prepare_local_corpus(f, tmp_path / "tfds")
    assert not list((tmp_path / "tfds").rglob("*.array_record*"))  # nothing half-built


def test_bad_paths(tmp_path):
    with pytest.raises(CorpusError, match="does not exist: .*missing.jsonl"):
        Corpus.from_config(CorpusConfig(paths=(str(tmp_path / "missing.jsonl"),),
                                        data_dir=str(tmp_path)))
    with pytest.raises(CorpusError, match=r"must end in \.jsonl or \.txt"):
        corpus_builder.resolve_paths(_write(tmp_path / "doc.csv", "a,b"))
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(CorpusError, match="has no .jsonl or .txt files"):
        corpus_builder.resolve_paths(tmp_path / "emptydir")
    with pytest.raises(CorpusError, match="no corpus paths"):
        corpus_builder.resolve_paths([])


def test_catalog_style_source_by_name(tmp_path):
    f = _write(tmp_path / "docs.jsonl", "".join(
        json.dumps({"id": f"d{i}", "text": f"document number {i}"}) + "\n" for i in range(5)))
    name, data_dir = corpus_builder.prepare_local_corpus(f, tmp_path / "tfds")
    c = Corpus.from_config(CorpusConfig(name=name, data_dir=data_dir, text_key="text"))
    assert sorted(d.doc_id for d in c.sample(5)) == [f"{name}/train/{i}" for i in range(5)]
    c = Corpus.from_config(CorpusConfig(name=name, data_dir=data_dir, id_key="id"))
    assert sorted(d.doc_id for d in c.sample(5)) == [f"d{i}" for i in range(5)]
    with pytest.raises(CorpusError, match=r"no feature 'body' \(available: \['id', 'source', 'text'\]\)"):
        Corpus.from_config(CorpusConfig(name=name, data_dir=data_dir, text_key="body")).sample()
    with pytest.raises(CorpusError, match="'c4/en' split 'train' is not available under data_dir"):
        Corpus.from_config(CorpusConfig(name="c4/en", data_dir=str(tmp_path / "nothing")))


def _memory_corpus(n=11, seed=3):
    return Corpus([{"text": f"doc {i}", "id": f"id{i}"} for i in range(n)], id_key="id", seed=seed)


def test_epochs_visit_every_document_once_and_reshuffle():
    c = _memory_corpus()
    e0 = [c.next_index() for _ in range(11)]
    e1 = [c.next_index() for _ in range(11)]
    assert sorted(e0) == sorted(e1) == list(range(11))
    assert e0 != e1
    assert c.state() == {"seed": 3, "epoch": 2, "position": 0, "num_documents": 11}
    other = _memory_corpus(seed=4)
    assert [other.next_index() for _ in range(11)] != e0


def test_cursor_restore_continues_the_exact_sequence():
    c = _memory_corpus()
    c.sample(15)
    state = json.loads(json.dumps(c.state()))
    expected = [d.doc_id for d in c.sample(20)]
    fresh = _memory_corpus(seed=0)  # the seed comes from the state
    fresh.restore(state)
    assert [d.doc_id for d in fresh.sample(20)] == expected
    with pytest.raises(CorpusError, match="saved for 11 documents but this corpus has 12"):
        _memory_corpus(n=12).restore(state)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_feistel_permutation_is_a_bijection(n):
    p = FeistelPermutation(n, seed=123, epoch=5)
    assert sorted(p[i] for i in range(n)) == list(range(n))
    with pytest.raises(IndexError):
        p[n]


def test_truncation_keeps_formatting_and_reference_wrapper():
    assert truncate_words("a  b\nc d e", 3) == ("a  b\nc", 5, True)
    assert truncate_words(" a b ", 3) == ("a b", 2, False)
    doc = Document(doc_id="x1", text="a  b\nc", n_words=5, truncated=True)
    assert doc.as_reference() == ('<reference_document id="x1">\na  b\nc\n'
                                  "[... truncated: first 3 of 5 words]\n</reference_document>")
    full = Document(doc_id="x2", text="a b", n_words=2, truncated=False)
    assert full.as_reference() == '<reference_document id="x2">\na b\n</reference_document>'
    with pytest.raises(CorpusError, match="max_words"):
        truncate_words("a", 0)
    with pytest.raises(CorpusError, match="no documents"):
        Corpus([])
