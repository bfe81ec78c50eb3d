"""How much does a hint move the policy? Hinted minus plain reward on matched plays, by hint mode.

Each program is played K times plain and K times hinted on the same seeds
(`agent.hints.matched_requests`, as self-play measures regret) under each mode:

  strategy  the strategy hint of the program's seed family (`agent.strategy`): SPADE-style,
            never the instance's answer; the mode the tiny preset trains and measures with;
  resample  the estimator's floor: the hinted play is a second plain play;
  placebo   neutral text of the strategy hint's length (`placebo_of` "strategy");
  solution  the whole plan of `solution()`: a diagnostic upper bound, not SPADE's regret.

A gap is the mean over matched pairs of hinted minus plain reward; its 95% interval is a
paired bootstrap that resamples programs (the pairs of one program share its hint and its
difficulty) with replacement, `--resamples` times. Output: a markdown table on stdout.

    python -m experiments.hints.hint_gap --load workdirs/tiny/bootstrap/bootstrap-<key>   # the tiny bootstrap
    python -m experiments.hints.hint_gap --quick                                          # a smoke run, random policy

Without ``--load`` the policy is a tiny random model with a SentencePiece tokenizer trained on
the seed library (it wins almost nothing: the run only shows the bench works). ``--quick``
plays 4 programs, 1 level, 2 seeds, 2 turns.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

from experiments.stats import paired_gap
from spade_jax.agent import AgentConfig, play_episodes
from spade_jax.agent.hints import HintConfig, matched_requests, write_hints
from spade_jax.agent.rollout import AGENT_SYSTEM_PROMPT
from spade_jax.envs import library
from spade_jax.progress import progress_bar
from spade_jax.sandbox import SandboxConfig, SandboxPool

MODES = ("strategy", "resample", "placebo", "solution")


def _random_policy():
    from spade_jax.models import ModelConfig, SentencePieceTokenizer, random_policy

    texts = [library.load_source(env.name) for env in library.SEED_ENVS]
    tokenizer = SentencePieceTokenizer.train(texts, vocab_size=512, model_prefix=Path(tempfile.mkdtemp()) / "sp")
    config = ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_layers=1,
                         num_heads=2, num_kv_heads=2, head_dim=32)
    return random_policy(config, tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", help="a finished bootstrap directory (default: a tiny random policy)")
    parser.add_argument("--programs", default=",".join(env.name for env in library.SEED_ENVS))
    parser.add_argument("--levels", default="easy,medium,hard")
    parser.add_argument("--seeds", type=int, default=4, help="matched pairs per program and level")
    parser.add_argument("--first_seed", type=int, default=1000, help="instances start here (no bootstrap seed)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--max_turns", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="4 programs, 1 level, 2 seeds, 2 turns")
    args = parser.parse_args()
    if args.quick:
        args.programs, args.levels, args.seeds, args.max_turns = "arithmetic,tallest,knapsack,number_guess", \
            "easy", 2, 2
    programs = [(name, level) for name in args.programs.split(",") for level in args.levels.split(",")]
    modes = args.modes.split(",")

    if args.load:
        from spade_jax.bootstrap import build as bootstrap

        policy = bootstrap.load_bootstrap(args.load)
    else:
        policy = _random_policy()
    agent = AgentConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        context_budget=max(1024, policy.config.max_position_embeddings // 2),
                        system_prompt=AGENT_SYSTEM_PROMPT, user_template="{observation}")  # as tiny plays
    codes = [library.load_source(name) for name, _ in programs]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    rng = np.random.default_rng(0)
    rows = []
    started = time.perf_counter()
    with SandboxPool(SandboxConfig(num_workers=args.workers)) as pool, \
            progress_bar(len(modes) * len(programs) * len(seeds) * 2, "plays", unit="play") as bar:
        for mode in modes:
            cfg = HintConfig(mode=mode, placebo_of="strategy")
            hints = write_hints(policy, codes, cfg)
            requests = []
            for key, ((_, level), code, hint) in enumerate(zip(programs, codes, hints)):
                requests += [dataclasses.replace(r, env_kwargs={"difficulty": level})
                             for r in matched_requests(key, code, seeds, mode, hint, "strategy")]
            bar.update(len(programs) * len(seeds) * 2 - len(requests))  # programs without a hint: no hinted plays
            plays = play_episodes(policy, pool, requests, agent, seed=17, progress=bar.update)
            plain = {(t.request.env_key, t.request.seed): t.reward for t in plays
                     if not t.hinted and not getattr(t, "dropped", False)}
            pairs = [[] for _ in programs]
            hinted_wins = []
            for t in plays:
                key = (t.request.env_key, t.request.seed)
                if t.hinted and key in plain and not getattr(t, "dropped", False):
                    pairs[t.request.env_key].append(t.reward - plain[key])
                    hinted_wins.append(t.won)
            plain_wins = [t.won for t in plays if not t.hinted]
            gap, (low, high) = paired_gap(pairs, args.resamples, rng)
            rows.append((mode, sum(map(bool, pairs)), sum(map(len, pairs)), np.mean(plain_wins),
                         np.mean(hinted_wins) if hinted_wins else float("nan"), gap, low, high))

    print(f"\npolicy {args.load or 'random (tiny)'}; {len(programs)} program-levels x {len(seeds)} seeds; "
          f"max_turns {args.max_turns}; {time.perf_counter() - started:.0f}s\n")
    print("| mode | programs hinted | pairs | plain win | hinted win | gap (hinted - plain) | 95% CI |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode, envs, n, plain_win, hinted_win, gap, low, high in rows:
        print(f"| {mode} | {envs} | {n} | {plain_win:.3f} | {hinted_win:.3f} | {gap:+.3f} | [{low:+.3f}, {high:+.3f}] |")


if __name__ == "__main__":
    main()
