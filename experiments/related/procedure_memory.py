"""Held-out win rate with and without procedure memory (`agent.procedure_memory`, ProPlay-style preplay).

1. Fill: the preset's training families (the seed programs its bootstrap renders,
   ``BootstrapConfig.envs``) are played plain and sampled (the preset's agent settings) for
   ``--rounds`` rounds of ``--plays`` seeds each, guided by the memory as the loop guides them
   (preplay before a round, counts after it).
2. Score: the preset's held-out suites (``eval.suites``, greedy, ``eval.plays_per_program`` seeds
   per program) and the training families, once without and once with the filled memory's
   guidance; the same items and seeds on both sides.

Prints a markdown table (win rate per program group, overall and per program) and the
preplayed path of each key. Training-free: the policy is not updated.

    python -m experiments.related.procedure_memory --bootstrap_dir /work/study/bootstrap
    python -m experiments.related.procedure_memory --bootstrap_dir DIR/bootstrap-<key> --rounds 1 --plays 2 --limit 8  # a check
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from experiments import presets
from spade_jax.agent import EpisodeRequest, play_episodes
from spade_jax.bootstrap.build import BootstrapError, cache_path, load_bootstrap
from spade_jax.envs import library
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.evals import runner
from spade_jax.related.procedures.memory import ProcedureConfig, ProcedureMemory, abstract
from spade_jax.sandbox import SandboxPool
from spade_jax.seeds import derive_seed
from spade_jax.selfplay import config as config_lib


def _policy(directory: Path, c):
    """The bootstrap in ``directory`` (a finished bootstrap, or the cache holding the preset's)."""
    path = directory if (directory / "DONE").exists() else cache_path(directory, config_lib.bootstrap_config(c))
    try:
        return load_bootstrap(path), path
    except (BootstrapError, FileNotFoundError):
        found = sorted(str(p.parent) for p in directory.glob("*/DONE"))
        raise SystemExit(f"no finished bootstrap for this preset at {path}; pass one directly: {found}") from None


def fill(policy, pool, memory: ProcedureMemory, programs: dict[str, str], agent_cfg, rounds: int, plays: int,
         seed: int) -> list[float]:
    """Plays the training families plain, guided and counted like the loop; plain win rate per round."""
    rates = []
    names = sorted(programs)
    for r in range(rounds):
        requests = [
            EpisodeRequest(i, programs[name], derive_seed(seed, r, i, j) % EPISODE_SEED_SPACE,
                           guidance=memory.guidance(memory.key(programs[name], library.get(name).skill)))
            for i, name in enumerate(names) for j in range(plays)
        ]
        trajectories = play_episodes(policy, pool, requests, agent_cfg, seed=derive_seed(seed, r, "fill"))
        for t in trajectories:
            name = names[t.request.env_key]
            key = memory.key(programs[name], library.get(name).skill)
            if key is not None and t.turns:
                memory.update(key, abstract(t.messages, t.won, t.end_reason), t.won)
        rates.append(sum(t.won for t in trajectories) / len(trajectories))
    return rates


def _rows(label: str, without: runner.SuiteResult, guided: runner.SuiteResult) -> list[str]:
    def cell(result, group=None):
        block = result.summary if group is None else result.summary.get("groups", {}).get(group)
        return "-" if block is None else f"{block['solved']:.3f}"

    lines = [f"| **{label}** | {without.summary['items']} | {cell(without)} | {cell(guided)} | "
             f"{guided.summary.get('guided', 0)} |"]
    for group in sorted(without.summary.get("groups", {})):
        lines.append(f"| {group} | {without.summary['groups'][group]['items']} | {cell(without, group)} | "
                     f"{cell(guided, group)} | |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap_dir", type=Path, required=True,
                        help="the bootstrap cache directory of the preset, or one finished bootstrap directory")
    parser.add_argument("--preset", default="configs/tiny.py")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of filling plays")
    parser.add_argument("--plays", type=int, default=8, help="plain plays per training family and round")
    parser.add_argument("--key", default="skill", choices=("skill", "family"))
    parser.add_argument("--limit", type=int, default=0, help="items per scored suite (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()

    c = presets.load(args.preset)
    policy, path = _policy(args.bootstrap_dir.expanduser(), c)
    agent_cfg = config_lib.agent_config(c)
    eval_cfg = dataclasses.replace(config_lib.eval_config(c), limit=args.limit, seed=args.seed)
    generation = config_lib.eval_generation(c)
    trained = config_lib.bootstrap_config(c).envs
    programs = {name: library.load_source(name) for name in trained}
    memory = ProcedureMemory(ProcedureConfig(enabled=True, key=args.key))

    with SandboxPool(config_lib.sandbox_config(c)) as pool:
        rates = fill(policy, pool, memory, programs, agent_cfg, args.rounds, args.plays, args.seed)
        specs = [("held-out", eval_cfg.suites),
                 ("training families", "envs:" + ",".join(str(library.source_path(n)) for n in trained))]
        lines = []
        for label, suites in specs:
            evaluator = runner.Evaluator(dataclasses.replace(eval_cfg, suites=suites, sampled_temperature=0.0),
                                         generation)
            guide = lambda program: memory.guidance(memory.key(program))  # noqa: E731
            for without, guided in zip(evaluator.run(policy, pool, agent_cfg, None, progress=False),
                                       evaluator.run(policy, pool, agent_cfg, None, progress=False, guidance=guide)):
                if without.summary is None:
                    lines.append(f"| **{label}** | skipped: {without.unavailable} | | | |")
                else:
                    lines += _rows(label, without, guided)

    command = "python -m experiments.related.procedure_memory " + " ".join(sys.argv[1:])
    print(f"\n`{command}`\n\npolicy {path}; preset {args.preset}; key {args.key}; fill {args.rounds} rounds x "
          f"{args.plays} plays x {len(programs)} families (plain win rate per round: "
          f"{', '.join(f'{r:.3f}' for r in rates)}); scored greedy, {eval_cfg.plays_per_program} seeds per program "
          f"({'all' if not args.limit else f'at most {args.limit}'} per suite); "
          f"{time.perf_counter() - started:.0f} s\n")
    print("| programs | episodes | win rate without | win rate with procedure memory | guided episodes |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(lines))
    print("\npreplay per key:\n")
    if not memory.keys():
        print("- none: no filling play was won")
    for key, graph in memory.summary().items():
        preplay = graph["preplay"]
        print(f"- {key}: {len(graph['transitions'])} transitions; "
              f"{preplay['text'] if preplay else 'no won path'}")


if __name__ == "__main__":
    main()
