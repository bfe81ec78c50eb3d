"""PNG plots of a run's main curves over iterations, read from ``metrics.jsonl`` rows.

Uses matplotlib's Agg canvas directly (no pyplot), so it never touches the global
backend of a notebook or needs a display. Null metrics leave gaps; a curve with no
data yet still gets a placeholder image so the gallery's links always resolve.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Sequence

from spade_jax.selfplay.console import PHASES

_PHASE_LABELS = {"adm": "admission", "play": "episodes"}


@dataclasses.dataclass(frozen=True)
class Plot:
    """One PNG: ``series`` are (metric key, legend label); ``stacked`` stacks them as bars."""

    name: str
    title: str
    series: tuple[tuple[str, str], ...]
    ylim: tuple[float, float] | None = None
    stacked: bool = False


PLOTS: tuple[Plot, ...] = (
    Plot("admission_rate", "Admission rate (admitted / proposed)",
         (("designer/admission_rate", "admission rate"),), ylim=(0.0, 1.0)),
    Plot("regret", "Mean regret (hinted - plain reward)",
         (("env/regret_mean", "regret"), ("env/gap_mean", "gap, unclipped"))),
    Plot("designer_reward", "Designer reward", (("designer/reward_mean", "designer reward"),)),
    Plot("win_rate", "Agent win rate",
         (("agent/plain_win_rate", "plain"), ("agent/hinted_win_rate", "hinted")), ylim=(0.0, 1.0)),
    Plot("loss", "Training loss", (("train/loss", "loss"),)),
    Plot("tokens_per_s", "Throughput (tokens/s)",
         (("sampler/tokens_per_s", "sampler"), ("train/tokens_per_s", "trainer"))),
    Plot("time_per_phase", "Time per phase (s)",
         tuple((key, _PHASE_LABELS.get(name, name)) for name, key in PHASES), stacked=True),
    Plot("memory_size", "Environment memory size", (("memory/size", "environments"),)),
)

_MAX_BARS = 150


def _column(rows: Sequence[dict], key: str) -> list[float]:
    out = []
    for row in rows:
        value = row.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        out.append(float(value) if ok else math.nan)
    return out


def _draw(plot: Plot, rows: Sequence[dict], path: pathlib.Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.2, 3.0), dpi=100)
    fig.subplots_adjust(left=0.12, right=0.97, top=0.9, bottom=0.15)  # fixed: layout engines are slow
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(plot.title, fontsize=10)
    ax.set_xlabel("iteration", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)
    x = [row["iteration"] for row in rows]
    columns = [(_column(rows, key), label) for key, label in plot.series]
    has_data = any(not math.isnan(v) for col, _ in columns for v in col)
    if not has_data:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes,
                color="0.5", fontsize=11)
        ax.set_xticks([])
        ax.set_yticks([])
    elif plot.stacked:
        bottom = [0.0] * len(x)
        heights = [[0.0 if math.isnan(v) else v for v in col] for col, _ in columns]
        if len(x) <= _MAX_BARS:
            for h, (_, label) in zip(heights, columns):
                ax.bar(x, h, bottom=bottom, width=0.85, label=label)
                bottom = [b + v for b, v in zip(bottom, h)]
        else:
            ax.stackplot(x, *heights, labels=[label for _, label in columns])
        ax.legend(fontsize=7, loc="upper left", ncols=len(columns))
        ax.margins(y=0.25)
    else:
        marker = "o" if len(x) <= 60 else None
        for col, label in columns:
            ax.plot(x, col, marker=marker, markersize=3, linewidth=1.4, label=label)
        if len(columns) > 1:
            ax.legend(fontsize=7)
    if has_data:
        ax.xaxis.get_major_locator().set_params(integer=True)
        if plot.ylim is not None:  # the natural range, widened to fit the data
            values = [v for col, _ in columns for v in col if not math.isnan(v)]
            low, high = min(plot.ylim[0], *values), max(plot.ylim[1], *values)
            pad = 0.03 * (high - low)
            ax.set_ylim(low - pad, high + pad)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)


def family_plot(rows: Sequence[dict], name: str, title: str, prefix: str, suffix: str = "", **kwargs) -> Plot | None:
    """One series per metric ``<prefix><member><suffix>`` the rows hold (labelled by the member),
    or None when they hold none."""
    keys = sorted({k for row in rows for k in row if k.startswith(prefix) and k.endswith(suffix)
                   and "/" not in k[len(prefix):len(k) - len(suffix)]})
    if not keys:
        return None
    return Plot(name, title, tuple((k, k[len(prefix):len(k) - len(suffix)]) for k in keys), **kwargs)


def family_plots(rows: Sequence[dict]) -> tuple[Plot, ...]:
    """The plots whose series depend on the run: held-out suites, skills, rejection stages."""
    plots = (
        family_plot(rows, "eval_scores", "Held-out evaluation (mean score)", "eval/", "/score", ylim=(0.0, 1.0)),
        family_plot(rows, "rejections", "Designs rejected, by admission stage", "designer/rejected/", stacked=True),
        family_plot(rows, "skill_win_rate", "Plain win rate per skill", "skill/", "/plain_win_rate", ylim=(0.0, 1.0)),
        family_plot(rows, "skill_regret", "Regret per skill", "skill/", "/regret"),
    )
    return tuple(plot for plot in plots if plot is not None)


def write_plots(rows: Sequence[dict], plots_dir: str | os.PathLike) -> list[tuple[Plot, str]]:
    """Draw every plot of ``PLOTS`` and `family_plots` from metric rows; returns (plot, file name) pairs."""
    plots_dir = pathlib.Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for plot in PLOTS + family_plots(rows):
        name = f"{plot.name}.png"
        _draw(plot, rows, plots_dir / name)
        written.append((plot, name))
    return written
