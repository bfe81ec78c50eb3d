"""Synthesized tool-use trajectories on `tiny`: how many are kept, and does SFT on them move held-out wins?

From the seed library's tool-use programs the tiny bootstrap trains on, trajectories are
synthesized with the bootstrapped policy (query writer and greedy calibrating agent; see
`spade_jax.related.trajectories`), one table row per environment (chains, queries, spelled out,
kept, acceptance, verified by agent / reference). The policy is then trained for ``--steps``
supervised steps (objective "nll" on the assistant turns, the rollout's conversation format:
query + tool list, one tool call per turn, tool results as observations) on the kept
trajectories, and the `envs` suite on the tiny preset's held-out programs (greedy, as
configs/tiny.py sets ``eval.suites``) is scored before and after.

    python -m experiments.related.trajectories_sft --bootstrap_dir /work/study/bootstrap/bootstrap-<key>
    python -m experiments.related.trajectories_sft --bootstrap_dir DIR --num 4 --steps 4 --episodes 2   # a quick check
    python -m experiments.related.trajectories_sft --bootstrap_dir DIR --writer smollm2   # SmolLM2 writes the queries

``--writer smollm2`` has the pip-packaged SmolLM2-135M-Instruct write the user queries (a
pretrained writer synthesizing data for a weaker policy, as EnvFactory uses a strong model);
the calibrating agent and the policy trained are the tiny one either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import numpy as np

from configs import smollm2_135m, tiny
from spade_jax.agent import play_episodes
from spade_jax.bootstrap import BootstrapConfig, build as bootstrap
from spade_jax.bootstrap import data
from spade_jax.envs import library
from spade_jax.evals import runner
from spade_jax.related.trajectories import ChainConfig, SynthConfig, summary_table, synthesize
from spade_jax.related.trajectories.queries import agent_observation
from spade_jax.rl.batch import pack
from spade_jax.rl.train import LossConfig, OptimConfig, Trainer
from spade_jax.sampling.chat import complete_chats
from spade_jax.sandbox import SandboxPool
from spade_jax.selfplay import config as config_lib
from spade_jax.selfplay.initial_policy import build_policy, mesh_from_config


def sft_sequences(tokenizer, examples):
    """Each kept example as the conversation the rollout builds, the assistant turns trained on."""
    sequences = []
    for e in examples:
        actions = [c.action() for c in e.chain.calls] + [f"<answer>{e.chain.end_state.answer}</answer>"]
        observations = (agent_observation(e.query, e.schemas), *e.chain.results)
        sequences.append(data.agent_sequence(tokenizer, data.Transcript(e.source, e.chain.seed, observations,
                                                                         tuple(actions), None)))
    return sequences


def heldout_win_rate(policy, pool, config, episodes: int) -> float:
    cfg = dataclasses.replace(config_lib.eval_config(config), plays_per_program=episodes)
    (result,) = runner.run_suites(policy, pool, cfg, config_lib.agent_config(config), None,
                                  config_lib.eval_generation(config), progress=False)
    return float(result.summary["score"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap_dir", required=True, help="a finished tiny bootstrap directory")
    parser.add_argument("--num", type=int, default=16, help="chains per environment")
    parser.add_argument("--max_calls", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="SFT steps")
    parser.add_argument("--rows", type=int, default=4, help="packed rows per SFT step")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--episodes", type=int, default=4, help="held-out plays per program (each of before/after)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--writer", choices=("policy", "smollm2"), default="policy",
                        help="who writes the queries: the tiny policy, or the packaged SmolLM2")
    args = parser.parse_args()

    config = tiny.get_config()
    trained = [e.name for e in library.SEED_ENVS if e.kind == "tool_use" and e.name in BootstrapConfig().envs]
    programs = [(name, library.load_source(name)) for name in trained]
    policy = bootstrap.load_bootstrap(args.bootstrap_dir)
    agent = config_lib.agent_config(config)
    agent = dataclasses.replace(agent, temperature=0.0, max_turns=max(agent.max_turns, args.max_calls + 2))
    cfg = SynthConfig(chains_per_env=args.num, seed=args.seed, chain=ChainConfig(max_calls=args.max_calls))

    writer = policy
    if args.writer == "smollm2":
        writer_config = smollm2_135m.get_config()
        writer = build_policy(writer_config, "", mesh_from_config(writer_config))

    def complete(chats):
        return [c.text for c in complete_chats(writer, chats, max_new_tokens=cfg.query.max_new_tokens,
                                               temperature=cfg.query.temperature, seed=args.seed)]

    started = time.perf_counter()
    with SandboxPool(config_lib.sandbox_config(config)) as pool:
        play = functools.partial(play_episodes, policy, pool, cfg=agent, seed=args.seed)
        examples, reports = synthesize(pool, programs, complete, play, cfg, progress=False)
        synth_s = time.perf_counter() - started
        print(f"synthesis on {', '.join(trained)} ({synth_s:.0f}s):\n\n{summary_table(reports)}\n", flush=True)
        before = heldout_win_rate(policy, pool, config, args.episodes)
        losses = []
        if examples:
            sequences = sft_sequences(policy.tokenizer, examples)
            row_length = config.rl.row_length
            trainer = Trainer(policy, OptimConfig(lr=args.lr, weight_decay=0.0),
                              LossConfig(objective="nll"))
            rng = np.random.default_rng(args.seed)
            per_step = max(1, args.rows * row_length // max(1, int(np.mean([len(s.tokens) for s in sequences]))))
            for _ in range(args.steps):
                chosen = rng.choice(len(sequences), min(per_step, len(sequences)), replace=False)
                losses.append(trainer.update(pack([sequences[i] for i in chosen], row_length))["loss"])
        after = heldout_win_rate(policy, pool, config, args.episodes)
    held = config.eval.suites.split(":", 1)[1].count(",") + 1
    print("| kept trajectories | SFT steps | loss first -> last | held-out win rate before | after | wall |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    loss = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "-"
    print(f"| {len(examples)} | {len(losses)} | {loss} | {before:.3f} | {after:.3f} | "
          f"{time.perf_counter() - started:.0f}s |")
    print(f"\nheld-out: {held} programs x {args.episodes} greedy plays each; command: "
          "python -m experiments.related.trajectories_sft "
          f"--bootstrap_dir {args.bootstrap_dir} --num {args.num} --steps {args.steps} --episodes {args.episodes} "
          f"--writer {args.writer}",
          flush=True)


if __name__ == "__main__":
    main()
