"""Progress bars that read well on a terminal and in a log file.

``progress_bar`` gives a tqdm bar when its stream is a terminal. When the stream is a file
or a pipe (a TPU worker's nohup log, CI, ``2>&1 | tee``) a tqdm bar would write a
carriage-return frame per refresh, which a log keeps as one line per step; there it writes
plain lines instead: one at most every ``interval_s`` seconds while it runs (none for a
phase shorter than that) and one when it closes, e.g.

    bootstrap: 150/600 steps (25%) 1m12s loss=0.42 tok_s=2400
    bootstrap: done 600/600 steps (100%) in 4m48s loss=0.31 tok_s=2410

Time, not a share of the total, spaces the lines: a log then shows the job is alive at
least every ``interval_s`` seconds however slow each step is, and holds at most one line
per ``interval_s`` of the run however many steps it has. Pure Python apart from tqdm.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

INTERVAL_S = 30.0


def progress_bar(total: int | None, desc: str, *, unit: str = "it", enabled: bool = True,
                 file: TextIO | None = None, leave: bool = True, interval_s: float = INTERVAL_S,
                 **tqdm_kwargs: Any):
    """A progress bar for ``total`` steps named ``desc``; use as a context manager.

    The object has ``.update(n=1)``, ``.set_postfix(**kv)``, ``.set_postfix_str(s)`` and
    ``.close()``. ``file`` defaults to ``sys.stderr``. On a terminal it is a plain tqdm bar
    (``tqdm_kwargs``, e.g. ``bar_format``, go to tqdm; ``leave=False`` clears it when done).
    Elsewhere it writes plain lines (see the module docstring); ``leave=False`` there drops
    the closing line, for callers that log their own summary. ``enabled=False`` gives an
    object that does nothing (non-main processes).
    """
    if not enabled:
        return _NullBar(total)
    stream = sys.stderr if file is None else file
    if _isatty(stream):
        from tqdm import tqdm

        tqdm_kwargs.setdefault("dynamic_ncols", True)
        return tqdm(total=total, desc=desc, unit=unit, file=stream, leave=leave, **tqdm_kwargs)
    return _LineBar(total, desc, unit=unit, stream=stream, leave=leave, interval_s=interval_s)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


class _NullBar:
    """The disabled bar: counts, writes nothing."""

    def __init__(self, total: int | None):
        self.total = total
        self.n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kv: Any) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _LineBar(_NullBar):
    """Plain newline-terminated progress lines, for streams that are not terminals."""

    def __init__(self, total: int | None, desc: str, *, unit: str, stream: TextIO, leave: bool,
                 interval_s: float):
        super().__init__(total)
        self.desc, self.unit, self.stream = desc.strip(), unit, stream
        self.leave, self.interval_s = leave, interval_s
        self.postfix = ""
        self.start = self.last = time.monotonic()
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval_s and not self.closed:
            self.last = now
            self._write(f"{self._count()} {format_elapsed(now - self.start)}")

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kv: Any) -> None:
        items = {**(ordered_dict or {}), **kv}
        self.postfix = " ".join(f"{k}={_fmt(v)}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.leave:
            return
        elapsed = format_elapsed(time.monotonic() - self.start)
        finished = self.total is None or self.n >= self.total
        self._write(f"done {self._count()} in {elapsed}" if finished
                    else f"stopped at {self._count()} after {elapsed}")

    def _count(self) -> str:
        if not self.total:
            return f"{self.n} {self.unit}"
        return f"{self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%)"

    def _write(self, text: str) -> None:
        line = f"{self.desc}: {text}" + (f" {self.postfix}" if self.postfix else "")
        try:
            self.stream.write(line.replace("\r", " ").replace("\n", " ") + "\n")
            self.stream.flush()
        except (ValueError, OSError):  # a closed or broken log must not stop the run
            pass


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_elapsed(seconds: float) -> str:
    """Seconds as '7s', '1m12s' or '1h02m'."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
