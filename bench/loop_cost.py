"""What a self-play run's training cost: a markdown table from each workdir's metrics.jsonl.

    python bench/loop_cost.py WORKDIR [WORKDIR ...] [--from_iteration N]

Per run: iterations, wall seconds, episodes played and trained (sequences in the updates,
the designer's included), episodes and updates per minute, seconds per trained episode, the
share of packed tokens that are trained, and how the run got its programs from XLA (seconds,
compiled, loaded from the persistent cache: `spade_jax.compile_cache`). Columns a run's
metrics lack (runs from before a metric existed) print as "–".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _rows(workdir: Path, first: int) -> list[dict]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["iteration"] >= first]


def _sum(rows: list[dict], key: str) -> float | None:
    values = [m[key] for m in rows if m.get(key) is not None]
    return sum(values) if values else None


def summarize(workdir: Path, first: int = 0) -> dict:
    """One run's totals and rates over its iterations from `first` on."""
    rows = _rows(workdir, first)
    config = json.loads((workdir / "config.json").read_text())
    wall = _sum(rows, "time/iteration_s") or 0.0
    trained = _sum(rows, "train/sequences") or 0
    updates = sum(config["rl"]["updates_per_iteration"] for m in rows if m.get("train/sequences"))
    packed = _sum(rows, "train/packed_tokens")
    trained_tokens = _sum([{"t": m["train/trained_share"] * m["train/packed_tokens"]} for m in rows
                           if m.get("train/packed_tokens")], "t")
    minutes = wall / 60 if wall else None
    return {
        "run": str(workdir), "iterations": len(rows), "wall_s": wall,
        "episodes": _sum(rows, "agent/episodes"), "trained": trained,
        "episodes_per_min": trained / minutes if minutes else None,
        "updates_per_min": updates / minutes if minutes else None,
        "s_per_trained": wall / trained if trained else None,
        "trained_share": trained_tokens / packed if packed else None,
        "compile_s": _sum(rows, "time/compile_s"),
        "compiled": _sum(rows, "time/programs_compiled"), "cached": _sum(rows, "time/programs_cached"),
    }


_COLUMNS = (("run", "run", "{}"), ("iterations", "iterations", "{}"), ("wall_s", "wall s", "{:.0f}"),
            ("episodes", "episodes played", "{:.0f}"), ("trained", "sequences trained", "{:.0f}"),
            ("episodes_per_min", "trained / min", "{:.1f}"), ("updates_per_min", "updates / min", "{:.2f}"),
            ("s_per_trained", "s / trained", "{:.2f}"), ("trained_share", "trained token share", "{:.3f}"),
            ("compile_s", "compile s", "{:.0f}"), ("compiled", "programs compiled", "{:.0f}"),
            ("cached", "programs cached", "{:.0f}"))


def table(summaries: list[dict]) -> str:
    head = "| " + " | ".join(title for _, title, _ in _COLUMNS) + " |"
    rule = "|" + " --- |" * len(_COLUMNS)
    body = ["| " + " | ".join("–" if s[key] is None else fmt.format(s[key]) for key, _, fmt in _COLUMNS) + " |"
            for s in summaries]
    return "\n".join([head, rule, *body])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", type=Path)
    parser.add_argument("--from_iteration", type=int, default=0, help="leave out the iterations before this one")
    args = parser.parse_args()
    print(table([summarize(w, args.from_iteration) for w in args.workdirs]))


if __name__ == "__main__":
    main()
