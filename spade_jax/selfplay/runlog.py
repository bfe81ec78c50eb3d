"""The run's files: metrics (JSONL and TensorBoard) and the log of designed environments.

Files in the workdir (the gallery in ``gallery.py`` reads the two JSONL logs):

- ``metrics.jsonl``: one line per iteration, ``{"iteration": i, "<metric>": float|null, ...}``
  (non-finite values become null). No wall-clock fields, so a resumed run's file equals
  an uninterrupted run's byte for byte.
- ``tensorboard/``: the same scalars as TensorBoard event files (tag = metric key, with the
  characters TensorBoard refuses in a tag, such as the ``@`` of ``pass@k``, as ``_``).
- ``gallery/envs.jsonl``: one `EnvLogEntry` per designed (or replayed) environment and
  iteration, as a JSON object without its null fields.

Resuming from iteration ``k`` drops every logged line with ``iteration > k``. The loop
should create these writers on the main process only. Pure Python (no jax).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import pathlib
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from spade_jax.jsonable import jsonable

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_TAG_UNSAFE = re.compile(r"[^-/\w.]")  # what TensorBoard would replace itself, logging each time
GALLERY_DIR = "gallery"
ENVS_FILE = "envs.jsonl"

_writer_ids = itertools.count()


class ExistingRunError(RuntimeError):
    """The workdir already holds output of an earlier run that would be overwritten."""


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All complete JSON-object lines of ``path`` ([] if missing).

    A line that does not parse (a write cut short by a kill) is skipped.
    """
    path = pathlib.Path(path)
    if not path.exists():
        return []
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _truncate_jsonl(path: pathlib.Path, iteration: int) -> None:
    """Atomically rewrite ``path`` keeping complete lines with ``iteration <= iteration``."""
    if not path.exists():
        return
    kept = [row for row in read_jsonl(path) if _iteration_of(row) <= iteration]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in kept:
            f.write(_dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _iteration_of(row: dict) -> int:
    it = row.get("iteration")
    return it if isinstance(it, int) and not isinstance(it, bool) else sys.maxsize


def _dumps(row: dict) -> str:
    # ASCII escapes keep lone surrogates from model text writable.
    return json.dumps(row, allow_nan=False, separators=(",", ":"))


def _append_lines(path: pathlib.Path, rows: Iterable[dict]) -> None:
    text = "".join(_dumps(row) + "\n" for row in rows)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


def _metric_value(key: str, value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"metric {key!r} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    return value if math.isfinite(value) else None


class MetricsWriter:
    """Writes each iteration's scalar metrics to ``metrics.jsonl`` and TensorBoard.

    Args:
      workdir: the run directory.
      resume_from_iteration: the iteration of the checkpoint being resumed; logged
        iterations after it are dropped (use -1 to drop them all). None means a fresh
        run, which refuses a workdir whose ``metrics.jsonl`` already has lines.
    """

    def __init__(self, workdir: str | os.PathLike, resume_from_iteration: int | None = None):
        from tensorboardX import SummaryWriter

        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / METRICS_FILE
        if resume_from_iteration is None:
            if read_jsonl(self.path):
                raise ExistingRunError(
                    f"{self.path} already holds metrics of an earlier run; resume that run "
                    "or choose a new --workdir"
                )
            purge_step = None
        else:
            _truncate_jsonl(self.path, resume_from_iteration)
            purge_step = resume_from_iteration + 1
        suffix = f".{os.getpid()}.{next(_writer_ids)}"
        self._tb = SummaryWriter(
            str(self.workdir / TENSORBOARD_DIR), purge_step=purge_step, filename_suffix=suffix
        )

    def write(self, iteration: int, metrics: Mapping[str, Any]) -> None:
        """Log one iteration's metrics (None/NaN values become null and are not plotted)."""
        values = {key: _metric_value(key, value) for key, value in sorted(metrics.items())}
        if "iteration" in values:
            raise ValueError("'iteration' is reserved in metrics.jsonl; rename that metric")
        _append_lines(self.path, [{"iteration": int(iteration), **values}])
        for key, value in values.items():
            if value is not None:
                self._tb.add_scalar(_TAG_UNSAFE.sub("_", key), value, global_step=int(iteration))
        self._tb.flush()

    def close(self) -> None:
        self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
    """The rows of ``metrics.jsonl`` sorted by iteration, the last write of an iteration winning."""
    by_iteration = {}
    for row in read_jsonl(pathlib.Path(workdir) / METRICS_FILE):
        if _iteration_of(row) != sys.maxsize:
            by_iteration[row["iteration"]] = row
    return [by_iteration[it] for it in sorted(by_iteration)]


@dataclasses.dataclass
class EnvLogEntry:
    """One environment in one iteration, as ``gallery/envs.jsonl`` holds it.

    A design of this iteration carries its prompt (slot, attempt, difficulty, doc_excerpt) and
    admission verdict (stage, reason, timings); an environment that was played carries its
    statistics, a sample plain and hinted transcript and its hint. Entries sharing an
    ``env_id`` are one environment played in several iterations (replays, seeds); a
    rejected design has ``env_id`` None. With calibration a design also carries its
    per-level rates (``calibration``) and a played one the ``level`` it was played at; the
    entry of the iteration in which pool rotation retired an environment carries ``retired``.
    """

    iteration: int
    env_id: str | None
    skill: str | None = None
    doc_id: str | None = None
    code: str | None = None
    admitted: bool = False
    is_seed: bool = False
    replay: bool = False
    slot: int | None = None
    attempt: int | None = None  # which attempt of its slot the design was (0: the first)
    difficulty: str | None = None
    doc_excerpt: str | None = None
    stage: str | None = None
    reason: str | None = None
    timings: dict | None = None
    win_rate: float | None = None
    hinted_win_rate: float | None = None
    mean_plain: float | None = None
    mean_hinted: float | None = None
    regret: float | None = None
    designer_reward: float | None = None
    transcript: list | None = None
    hinted_transcript: list | None = None
    hint: str | None = None
    level: str | None = None  # the difficulty level played (`difficulty` is the designer prompt's)
    calibration: dict | None = None  # `CalibrationResult.to_dict()` of a calibrated design
    retired: str | None = None  # why pool rotation retired it in this iteration

    def to_json(self) -> dict:
        """The JSON object of this entry: plain values, null fields left out."""
        return {k: v for k, v in jsonable(dataclasses.asdict(self)).items() if v is not None}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> "EnvLogEntry | None":
        """The entry a logged object describes (unknown keys ignored), or None without an int iteration."""
        if _iteration_of(row) == sys.maxsize:
            return None
        values = {k: row[k] for k in _ENTRY_FIELDS if k in row}
        values.setdefault("env_id", None)
        return cls(**values)


_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(EnvLogEntry))


class EnvLog:
    """Append-only log of designed environments, ``workdir/gallery/envs.jsonl`` (see `EnvLogEntry`)."""

    def __init__(self, workdir: str | os.PathLike):
        self.path = pathlib.Path(workdir) / GALLERY_DIR / ENVS_FILE

    def append(self, entries: Iterable[EnvLogEntry]) -> None:
        rows = []
        for entry in entries:
            if not isinstance(entry.iteration, int) or isinstance(entry.iteration, bool):
                raise ValueError(f"environment log entry needs an int iteration, got {entry.iteration!r}")
            rows.append(entry.to_json())
        if rows:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _append_lines(self.path, rows)

    def truncate_after(self, iteration: int) -> None:
        """Drop entries of iterations after ``iteration`` (on resume from that checkpoint)."""
        _truncate_jsonl(self.path, iteration)

    def read(self) -> list[EnvLogEntry]:
        """Every complete entry of the log, in the order written."""
        return [e for e in map(EnvLogEntry.from_json, read_jsonl(self.path)) if e is not None]
