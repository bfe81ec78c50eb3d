"""How many of the agent's actions an environment suite accepted, per family, from evaluation records.

An environment evaluation (``spade_jax.evals`` with an ``envs:`` suite) writes one JSONL row per
episode with its chat. A zero score can mean the agent reasoned wrongly or that it never said a
move the game understands; this separates the two. An action counts as judged when the
environment answered it, or when it ended the episode (a final answer); it is accepted unless
the answer rejects it as procedure memory reads observations (`procedures.observation_stage`:
"Invalid ...", "Error ..." and the like). The last action of a truncated episode has no answer
and is not judged.

    python -m experiments.bootstrap.action_validity WORKDIR/evals/initial/envs-11-programs.jsonl WORKDIR/evals/10/envs-11-programs.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from spade_jax.related.procedures.memory import observation_stage


def family_counts(rows: list[dict]) -> dict[str, tuple[int, int, int, int]]:
    """Per family: (judged actions, accepted actions, episodes, solved episodes)."""
    counts = collections.defaultdict(lambda: [0, 0, 0, 0])
    for row in rows:
        chat, family = row["output"], counts[row["group"]]
        for index, message in enumerate(chat):
            if message["role"] != "assistant":
                continue
            if index + 1 < len(chat):
                accepted = observation_stage(chat[index + 1]["content"]) != "error"
            elif row["details"].get("end") == "terminated":
                accepted = True
            else:
                continue
            family[0] += 1
            family[1] += accepted
        family[2] += 1
        family[3] += bool(row["solved"])
    return {name: tuple(value) for name, value in sorted(counts.items())}


def report(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    counts = family_counts(rows)
    judged, accepted, episodes, solved = (sum(c[k] for c in counts.values()) for k in range(4))
    lines = [f"{path}: accepted {accepted}/{judged} actions ({accepted / max(judged, 1):.3f}), "
             f"solved {solved}/{episodes} episodes",
             "  " + ", ".join(f"{name} {c[1]}/{c[0]}" for name, c in counts.items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", type=Path, help="evaluation JSONL files (WORKDIR/evals/STEP/envs-*.jsonl)")
    for path in parser.parse_args().records:
        print(report(path))


if __name__ == "__main__":
    main()
