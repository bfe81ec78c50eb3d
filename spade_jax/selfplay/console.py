"""What the terminal shows of a run: the per-iteration summary line and the phase progress bars."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TextIO

from spade_jax.progress import progress_bar


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

    e.g. ``it 3 | envs 7/8 in 13 | regret 0.12 | dR 0.31 adv 4/7 | win plain 0.40 hint 0.65 |
    tok/s sample 1.2k train 8.0k | design 40s adm 3.0s hints 1.0s play 60s update 20s = 2m04s | mem 13``:
    slots admitted of slots designed, in how many attempts; the mean designer reward of the
    designs trained now and how many of them have a non-zero advantage.
    """
    m = metrics
    envs = f"envs {_num(m.get('designer/admitted'), '{:.0f}')}/{_num(m.get('designer/proposed'), '{:.0f}')}"
    if m.get("designer/attempts") is not None:
        envs += f" in {_num(m.get('designer/attempts'), '{:.0f}')}"
    reward = f"dR {_num(m.get('designer/reward_mean'))}"
    if m.get("designer/trained"):
        reward += f" adv {_num(m.get('designer/nonzero_advantage'), '{:.0f}')}/{_num(m.get('designer/trained'), '{:.0f}')}"
    parts = [
        f"it {iteration}",
        envs,
        f"regret {_num(m.get('env/regret_mean'))}",
        reward,
        f"win plain {_num(m.get('agent/plain_win_rate'))} hint {_num(m.get('agent/hinted_win_rate'))}",
        f"tok/s sample {_rate(m.get('sampler/tokens_per_s'))} train {_rate(m.get('train/tokens_per_s'))}",
        " ".join(f"{name} {format_duration(m.get(key))}" for name, key in PHASES)
        + f" = {format_duration(m.get('time/iteration_s'))}",
        f"mem {_num(m.get('memory/size'), '{:.0f}')}",
    ]
    return " | ".join(parts)


def phase_bar(phase: str, total: int, *, enabled: bool = True, file: TextIO | None = None):
    """The progress of one phase of an iteration (designing and admission, episodes, update).

    On a terminal a bar that disappears when done (the summary line stays); in a log,
    periodic plain lines (`progress.progress_bar`). Pass ``enabled=False`` on non-main
    processes. Use as a context manager and call ``.update(n)``.
    """
    return progress_bar(
        total,
        phase,
        enabled=enabled,
        file=file,
        leave=False,
        bar_format="{desc:>9} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]",
    )
