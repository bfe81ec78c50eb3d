"""What a person sees of a run: metrics files, the per-iteration summary line, phase
progress bars and the log of designed environments.

Files in the workdir (the gallery in ``gallery.py`` reads the two JSONL logs):

- ``metrics.jsonl``: one line per iteration, ``{"iteration": i, "<metric>": float|null, ...}``
  (non-finite values become null). No wall-clock fields, so a resumed run's file equals
  an uninterrupted run's byte for byte.
- ``tensorboard/``: the same scalars as TensorBoard event files (tag = metric key).
- ``gallery/envs.jsonl``: one JSON object per designed (or replayed) environment.

Resuming from iteration ``k`` drops every logged line with ``iteration > k``. The loop
should create these writers on the main process only. Pure Python (no jax).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pathlib
import sys
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
GALLERY_DIR = "gallery"
ENVS_FILE = "envs.jsonl"

_writer_ids = itertools.count()


class ExistingRunError(RuntimeError):
    """The workdir already holds output of an earlier run that would be overwritten."""


def jsonable(value: Any) -> Any:
    """``value`` with numpy/jax scalars and arrays made plain and non-finite floats as None.

    JSON has no NaN/Infinity; logging them as null keeps every line valid JSON.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy / jax scalars and arrays
        return jsonable(value.tolist())
    raise TypeError(f"cannot log {type(value).__name__} value {value!r} as JSON")


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
                self._tb.add_scalar(key, value, global_step=int(iteration))
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


class EnvLog:
    """Append-only log of designed environments, ``workdir/gallery/envs.jsonl``.

    Each record is one environment in one iteration (fields listed in ``gallery.py``);
    replayed environments get a new record with the same ``env_id``.
    """

    def __init__(self, workdir: str | os.PathLike):
        self.path = pathlib.Path(workdir) / GALLERY_DIR / ENVS_FILE

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        rows = []
        for record in records:
            it = record.get("iteration")
            if not isinstance(it, int) or isinstance(it, bool):
                raise ValueError(f"environment record needs an int 'iteration', got {it!r}")
            rows.append(jsonable(record))
        if rows:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _append_lines(self.path, rows)

    def truncate_after(self, iteration: int) -> None:
        """Drop records of iterations after ``iteration`` (on resume from that checkpoint)."""
        _truncate_jsonl(self.path, iteration)

    def read(self) -> list[dict]:
        return read_jsonl(self.path)


def write_gallery(workdir: str | os.PathLike) -> pathlib.Path:
    """Rebuild the HTML environment gallery of ``workdir``; see ``gallery.write_gallery``.

    Imported on call so that logging metrics never loads matplotlib.
    """
    from spade_jax.selfplay import gallery

    return gallery.write_gallery(workdir)


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    if value is None or isinstance(value, bool):
        return "-"
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "-"
    return fmt.format(value) if math.isfinite(value) else "-"


def _rate(value: Any) -> str:
    """Throughput with a k/M suffix: 1234 -> '1.2k'."""
    text = _num(value, "{:.0f}")
    if text == "-":
        return text
    value = float(value)
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{suffix}"
    return text


def format_duration(value: Any) -> str:
    """Seconds as '40ms', '2.4s', '12s', '3m05s' or '1h02m'."""
    if _num(value) == "-":
        return "-"
    s = float(value)
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 10:
        return f"{s:.1f}s"
    if s < 100:
        return f"{s:.0f}s"
    s = round(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


PHASES: tuple[tuple[str, str], ...] = (
    ("design", "time/design_s"),
    ("adm", "time/admission_s"),
    ("hints", "time/hints_s"),
    ("play", "time/episodes_s"),
    ("update", "time/update_s"),
)


def summary_line(iteration: int, metrics: Mapping[str, Any]) -> str:
    """One compact line for the console; missing or NaN metrics show as '-'.

    e.g. ``it 3 | envs 5/8 | regret 0.12 | dR 0.31 | win plain 0.40 hint 0.65 |
    tok/s sample 1.2k train 8.0k | design 40s adm 3.0s hints 1.0s play 60s update 20s = 2m04s | mem 13``
    """
    m = metrics
    parts = [
        f"it {iteration}",
        f"envs {_num(m.get('designer/admitted'), '{:.0f}')}/{_num(m.get('designer/proposed'), '{:.0f}')}",
        f"regret {_num(m.get('env/regret_mean'))}",
        f"dR {_num(m.get('designer/reward_mean'))}",
        f"win plain {_num(m.get('agent/plain_win_rate'))} hint {_num(m.get('agent/hinted_win_rate'))}",
        f"tok/s sample {_rate(m.get('sampler/tokens_per_s'))} train {_rate(m.get('train/tokens_per_s'))}",
        " ".join(f"{name} {format_duration(m.get(key))}" for name, key in PHASES)
        + f" = {format_duration(m.get('time/iteration_s'))}",
        f"mem {_num(m.get('memory/size'), '{:.0f}')}",
    ]
    return " | ".join(parts)


def phase_bar(phase: str, total: int, *, enabled: bool = True, file: TextIO | None = None):
    """A tqdm progress bar for one phase of an iteration (designing, admission, episodes, update).

    The bar disappears when done (the summary line stays); pass ``enabled=False`` on
    non-main processes. Use as a context manager and call ``.update(n)``.
    """
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=f"{phase:>9}",
        leave=False,
        dynamic_ncols=True,
        disable=not enabled,
        file=file,
        bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]",
    )
