"""Helpers shared by the suites that read a benchmark from a local file (aime, gpqa, lcb).

Registers no suite. Standard library only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

from spade_jax.evals.suite import SuiteUnavailable


def data_path(prefix: str, argument: str, what: str, where: str, suffixes: tuple[str, ...]) -> Path:
    """The file (or directory of such files) ``argument`` names; SuiteUnavailable in one line
    (what the suite needs and where to get it) when it is not given or not there."""
    hint = f"{prefix} needs {what}: --suites={prefix}:PATH ({where})"
    if not argument:
        raise SuiteUnavailable(hint)
    path = Path(argument).expanduser()
    if path.is_dir():
        if not any(p.suffix in suffixes for p in path.iterdir() if p.is_file()):
            raise SuiteUnavailable(f"{path} holds no {'/'.join('*' + s for s in suffixes)} file; {hint}")
        return path
    if not path.is_file():
        raise SuiteUnavailable(f"{path} does not exist; {hint}")
    return path


def files_of(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """``path`` itself, or the files with one of ``suffixes`` in directory ``path``, sorted by name."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in suffixes)
    return [path]


def json_records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a JSONL file, or (index, record) of a ``.json`` file holding a
    list of records (or ``{"data"|"rows"|"test": [...]}``). Raises SuiteUnavailable on bad JSON."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # a JSONL file named .json
        if data is not None:
            if isinstance(data, dict):
                data = next((data[k] for k in ("data", "rows", "test") if isinstance(data.get(k), list)), [data])
            for index, record in enumerate(data):
                if isinstance(record, dict):
                    yield index, record
            return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise SuiteUnavailable(f"{path}:{number} is not JSON ({err.msg}); "
                                   "expected one JSON object per line") from None
        if isinstance(record, dict):
            yield number, record


def first_key(record: dict, keys: tuple[str, ...]):
    """The value of the first of ``keys`` that ``record`` holds with a non-empty value, else None."""
    for key in keys:
        value = record.get(key)
        if value is not None and value != "":
            return value
    return None


def suite_name(prefix: str, path: Path) -> str:
    """How results are filed: the file's stem when it already names the benchmark, else prefix-stem."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem if path.is_file() else path.name).strip("-") or prefix
    return stem if stem.lower().startswith(prefix) else f"{prefix}-{stem}"
