"""Does the policy use a `solution` hint? Teacher-forced likelihood of winning plays under four hints.

Regret measured by sampling sits inside its own noise at the tiny preset's sizes (4 plays a
side). This measures the hint's effect without sampling: each seed-library program is
played by its own `solution()` on seeds no bootstrap transcript used, and the policy scores
the actions of that won play (mean negative log-likelihood per action token, and of the
final action alone, which carries the answer) with the first observation followed by

  none      no hint (a plain play);
  plan      the `solution` hint of this instance (the whole plan, `rollout.solution_hint`);
  placebo   neutral text of the plan hint's length (`rollout.placebo_hint`);
  wrong     the plan of another seed of the same program (a hint that misleads).

A policy that uses the hint scores `plan` far below `none`, and `wrong` above it; one that
ignores it scores the four alike. Programs are split into those whose family the tiny
bootstrap trains on and the held-out rest. ``--drills N`` adds a row of N hint drills per
play of the trained families (`bootstrap.data.hint_drill`: values relabelled at random, so
only the plan predicts them; `wrong` is the next drill's plan): the purest test of copying.

    python -m experiments.hints.hint_use --load /work/study/bootstrap/bootstrap-<key> [--drills 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import random

import numpy as np

from spade_jax.agent.rollout import placebo_hint, solution_hint
from spade_jax.bootstrap import build as bootstrap
from spade_jax.bootstrap import data
from spade_jax.envs import library
from spade_jax.rl.batch import pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer
from spade_jax.sandbox import SandboxConfig, SandboxPool

CONDITIONS = ("none", "plan", "placebo", "wrong")


def _hint(condition: str, transcript: data.Transcript, other: data.Transcript) -> str | None:
    plan = solution_hint("\n".join(transcript.actions))
    return {"none": None, "plan": plan, "placebo": placebo_hint(len(plan)),
            "wrong": solution_hint("\n".join(other.actions))}[condition]


def _last_action_only(sequence):
    """The sequence with only its final action's tokens (and end-of-turn token) scored."""
    mask = sequence.loss_mask.copy()
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(np.int8), 0]))
    mask[: edges[-2]] = False
    return dataclasses.replace(sequence, loss_mask=mask)


def _mean_nll(trainer: Trainer, sequences, row_length: int) -> float:
    batch = pack(sequences, row_length)
    logprobs_RT = trainer.logprobs(batch)
    return float(-(logprobs_RT * batch.target_mask_RT).sum() / batch.target_mask_RT.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", required=True, help="a finished bootstrap directory")
    parser.add_argument("--seeds", default="100,101,102,103", help="instances to play (none a bootstrap seed)")
    parser.add_argument("--max_turns", type=int, default=8)
    parser.add_argument("--drills", type=int, default=0, help="hint drills per play of the trained families")
    parser.add_argument("--drill_seed", type=int, default=0)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    if len(seeds) < 2:
        parser.error("--seeds needs two seeds at least (the wrong hint is another seed's plan)")

    policy = bootstrap.load_bootstrap(args.load)
    trainer = Trainer(policy, OptimConfig(), LossConfig(objective="nll"))
    trained = set(bootstrap.BootstrapConfig().envs)
    groups = {"trained families": [e.name for e in library.SEED_ENVS if e.name in trained],
              "held-out programs": [e.name for e in library.SEED_ENVS if e.name not in trained]}
    print(f"policy {args.load}; seeds {seeds}; mean NLL per action token (final action alone)\n")
    print("| programs | plays | " + " | ".join(CONDITIONS) + " |")
    print("| --- | --- |" + " --- |" * len(CONDITIONS))
    with SandboxPool(SandboxConfig(num_workers=2)) as pool:
        for group, names in groups.items():
            sources = [library.load_source(name) for name in names]
            plays = data.play_solutions(pool, sources, seeds, [], args.max_turns)
            by_program: dict[str, list[data.Transcript]] = {}
            for play in plays:
                by_program.setdefault(play.program, []).append(play)
            pairs = [(t, runs[(i + 1) % len(runs)]) for runs in by_program.values() if len(runs) > 1
                     for i, t in enumerate(runs)]
            print(f"| {group} ({len(by_program)}) | {len(pairs)} | {_cells(trainer, policy, pairs)} |", flush=True)
            if args.drills and group == "trained families":
                rng = random.Random(args.drill_seed)
                words = data.action_words(plays)
                drills = [data.hint_drill(dataclasses.replace(t, hint=_hint("plan", t, t)), words, rng)
                          for t in plays for _ in range(args.drills)]
                pairs = list(zip(drills, drills[1:] + drills[:1]))
                print(f"| hint drills of those | {len(pairs)} | {_cells(trainer, policy, pairs)} |", flush=True)


def _cells(trainer: Trainer, policy, pairs) -> str:
    """The table cells of each condition for (transcript, other instance) ``pairs``."""
    cells = []
    for condition in CONDITIONS:
        sequences = [data.agent_sequence(policy.tokenizer, dataclasses.replace(t, hint=_hint(condition, t, o)))
                     for t, o in pairs]
        row_length = max(len(s.tokens) for s in sequences)
        every = _mean_nll(trainer, sequences, row_length)
        last = _mean_nll(trainer, [_last_action_only(s) for s in sequences], row_length)
        cells.append(f"{every:.3f} ({last:.3f})")
    return " | ".join(cells)


if __name__ == "__main__":
    main()
