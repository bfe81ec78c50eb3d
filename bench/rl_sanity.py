"""The learning ladder's first rungs on a trained policy, each with its control (issue: show that it learns).

    python bench/rl_sanity.py --rung 0 --load BOOTSTRAP_DIR --out DIR [--seeds 0,1,2] [--updates 15]
    python bench/rl_sanity.py --rung 1 --load BOOTSTRAP_DIR --out DIR [--seeds 0,1,2] [--updates 40]

Both train the agent alone on the `tiny` bootstrap's trained families (`BootstrapConfig.envs`:
no designer, no hints) with the preset's agent settings and update (`configs/tiny.py`): per round
of plays, `rl.updates_per_iteration` optimizer steps anchored on the plays' log-probs, as the
loop's `_update` does; advantages centred over each program's plays as in self-play
(`scoring.agent_sequences`); a control arm at learning rate 0 on the same seeds.

- **rung 0, machinery**: one fixed instance per program (its seed drawn once per run seed);
  `--plays` plays of it per update; after every update `--eval_plays` sampled plays of each
  instance on fixed sampling streams, every `--eval_every` updates. Bar: every instance with initial wins > 0 reaches a win
  rate >= 0.8 within the updates, and the control's curve does not move.
- **rung 1, fresh seeds**: every update plays fresh seeds; before and after, `--eval_plays`
  fixed fresh seeds per program are played sampled (temperature 1) and greedy, paired seed
  by seed. Bar: the final policy beats the initial one with McNemar p < 0.05 on every run
  seed and by >= +0.10 sampled win rate on the mean; the control stays within noise.
  The training win rate's block means (blocks of `--block` updates) with standard errors show
  the curve.

`--partial_credit` makes the training plays' programs grade a wrong final answer (the library's
`partial_credit=True`: `PARTIAL_CREDIT_SCALE` times its closeness, never a win), so a group
without wins still has reward differences to centre; the evaluations stay on wins, unchanged.

Writes `DIR/rung<N>.json` (every curve and evaluation, after each arm), `DIR/rung<N>.md` (the
tables, rung 1's per-family win rates, the bar's verdict) and `DIR/rung<N>.png`. Seconds per update
and episodes per minute are recorded. `--report_only` writes the report of the arms a stopped run
finished, from its json, without playing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spade_jax.agent.rollout import EpisodeRequest, play_episodes  # noqa: E402
from spade_jax.bootstrap import BootstrapConfig, load_bootstrap  # noqa: E402
from spade_jax.envs import library  # noqa: E402
from spade_jax.envs.contract import EPISODE_SEED_SPACE  # noqa: E402
from spade_jax.progress import progress_bar  # noqa: E402
from spade_jax.rl.batch import pack  # noqa: E402
from spade_jax.rl.train import Trainer  # noqa: E402
from spade_jax.sandbox import SandboxConfig, SandboxPool  # noqa: E402
from spade_jax.seeds import derive_seed  # noqa: E402
from spade_jax.selfplay.config import agent_config, loss_config, optim_config  # noqa: E402
from spade_jax.selfplay.scoring import agent_sequences  # noqa: E402


def mcnemar_p(before: np.ndarray, after: np.ndarray) -> float:
    """Exact two-sided McNemar p-value of paired 0/1 outcomes (binomial test on the discordant pairs)."""
    b = int(np.sum(before & ~after))
    c = int(np.sum(~before & after))
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def allocate_plays(wins: dict[str, int], plays: dict[str, int], budget: int, minimum: int,
                   rule: str = "variance") -> dict[str, int]:
    """Splits `budget` plays over programs by a weight of p, the posterior mean win rate
    (wins + 1) / (plays + 2) of each program's training plays so far, each program getting at
    least `minimum` (largest remainders round).

    variance, weight p(1 - p): group-centred advantages are zero where a group's rewards are all
    equal, so plays go where a group is likely to hold both wins and losses.
    headroom, weight 1 - p: plays go to what is not yet solved, so a rarely won program keeps
    enough plays for its groups to hold a win (p(1 - p) starves it as much as a solved one)."""
    names = list(wins)
    if budget < minimum * len(names):
        raise ValueError(f"budget {budget} is below {minimum} plays for each of {len(names)} programs")
    p = np.array([(wins[n] + 1) / (plays[n] + 2) for n in names])
    weights = {"variance": p * (1 - p), "headroom": 1 - p}
    if rule not in weights:
        raise ValueError(f"unknown allocation rule {rule!r}: one of {sorted(weights)}")
    weight = weights[rule]
    share = minimum + (budget - minimum * len(names)) * weight / weight.sum()
    counts = np.floor(share).astype(int)
    for i in np.argsort(-(share - counts), kind="stable")[: budget - counts.sum()]:
        counts[i] += 1
    return dict(zip(names, counts.tolist()))


def block_means(values: list[float], block: int) -> list[tuple[float, float]]:
    """(mean, standard error) of consecutive blocks of `block` values (the last may be shorter)."""
    out = []
    for i in range(0, len(values), block):
        chunk = np.asarray(values[i:i + block], float)
        se = float(chunk.std(ddof=1) / math.sqrt(len(chunk))) if len(chunk) > 1 else 0.0
        out.append((float(chunk.mean()), se))
    return out


@dataclasses.dataclass
class Setup:
    """What every arm shares: the preset's settings, the programs, the sandbox pool."""

    config: object
    programs: dict[str, str]
    pool: SandboxPool
    load: str


def family_rates(evaluation: dict, kind: str = "sampled") -> dict[str, float]:
    """Win rate per program of one evaluation (``{kind: [won], "programs": [name]}``), in the order
    the programs first appear."""
    return _by_program(evaluation["programs"], evaluation[kind])


def _setup(args, pool) -> Setup:
    from configs import tiny

    config = tiny.get_config()
    names = BootstrapConfig().envs
    return Setup(config, {name: library.load_source(name) for name in names}, pool, args.load)


def _play(policy, setup: Setup, seeds_by_program: dict[str, list[int]], stream: int, *,
          temperature: float | None = None, env_kwargs: dict | None = None):
    """Plain plays of each program on its seeds (its constructor given ``env_kwargs``); returns
    (program name per play, trajectories)."""
    cfg = agent_config(setup.config)
    if temperature is not None:
        cfg = dataclasses.replace(cfg, temperature=temperature)
    names, requests = [], []
    for k, (name, seeds) in enumerate(seeds_by_program.items()):
        for s in seeds:
            names.append(name)
            requests.append(EpisodeRequest(k, setup.programs[name], int(s), env_kwargs=dict(env_kwargs or {})))
    return names, play_episodes(policy, setup.pool, requests, cfg, seed=stream)


def _wins(trajectories) -> np.ndarray:
    return np.asarray([t.won for t in trajectories], bool)


def _by_program(names, values) -> dict[str, float]:
    out: dict[str, list] = {}
    for n, v in zip(names, values):
        out.setdefault(n, []).append(float(v))
    return {n: float(np.mean(v)) for n, v in out.items()}


def _update(trainer: Trainer, setup: Setup, trajectories) -> dict:
    sequences = agent_sequences(trajectories, [None] * len(setup.programs), train_hinted=False,
                                regret_weighting=False, regret_temperature=1.0, weight=1.0)
    if not sequences:
        return {"trained": 0}
    rl = setup.config.rl
    batch = pack(sequences, rl.row_length, row_multiple=max(rl.micro_batch_rows, 1))
    old = trainer.logprobs(batch) if rl.updates_per_iteration > 1 else None
    for _ in range(rl.updates_per_iteration):
        metrics = trainer.update(batch, old)
    return {"trained": len(sequences), "nonzero": sum(abs(s.advantage) > 1e-12 for s in sequences),
            "loss": metrics["loss"]}


def _arm(setup: Setup, seed: int, lr: float, args) -> dict:
    """One arm (a run seed at one learning rate) of the chosen rung."""
    policy = load_bootstrap(setup.load)
    optim = dataclasses.replace(optim_config(setup.config), lr=lr)
    trainer = Trainer(policy, optim, loss_config(setup.config))
    names = list(setup.programs)
    fixed = {n: derive_seed(seed, "rung0", n) % EPISODE_SEED_SPACE for n in names}
    eval_seeds = {n: [derive_seed(seed, "eval", n, j) % EPISODE_SEED_SPACE for j in range(args.eval_plays)]
                  for n in names}

    def evaluate(temperature=None):
        seeds = {n: [fixed[n]] * args.eval_plays for n in names} if args.rung == 0 else eval_seeds
        played, trajectories = _play(policy, setup, seeds, stream=derive_seed(seed, "eval-stream"),
                                     temperature=temperature)
        return played, _wins(trajectories)

    record = {"seed": seed, "lr": lr, "updates": [], "curve": [], "curve_updates": [0]}
    played, wins = evaluate()
    record["before"] = {"sampled": wins.tolist(), "programs": played}
    if args.rung == 1:
        record["before"]["greedy"] = evaluate(0.0)[1].tolist()
    record["curve"].append(_by_program(played, wins))
    start = time.perf_counter()
    history: list[tuple[dict, dict]] = []  # (wins, plays) per program, one entry per update
    with progress_bar(args.updates, f"rung {args.rung} seed {seed} lr {lr:g}", unit="updates") as bar:
        for u in range(args.updates):
            recent = history[-args.window:] if args.window else history
            won = {n: sum(w[n] for w, _ in recent) for n in names}
            tried = {n: sum(t[n] for _, t in recent) for n in names}
            counts = ({n: args.plays for n in names} if args.allocate == "uniform"
                      else allocate_plays(won, tried, args.plays * len(names), args.min_plays, args.allocate))
            if args.rung == 0:
                seeds = {n: [fixed[n]] * counts[n] for n in names}
            else:
                seeds = {n: [derive_seed(seed, "train", u, n, j) % EPISODE_SEED_SPACE for j in range(counts[n])]
                         for n in names}
            played_u, trajectories = _play(policy, setup, seeds, stream=derive_seed(seed, "train-stream", u),
                                           env_kwargs={"partial_credit": True} if args.partial_credit else None)
            history.append(({n: 0 for n in names}, {n: 0 for n in names}))
            for n, w in zip(played_u, _wins(trajectories)):
                history[-1][0][n] += int(w)
                history[-1][1][n] += 1
            info = _update(trainer, setup, trajectories)
            info["train_win_rate"] = float(_wins(trajectories).mean())
            info["train_reward_mean"] = float(np.mean([t.reward for t in trajectories]))
            info["plays"] = counts
            record["updates"].append(info)
            if args.rung == 0 and ((u + 1) % args.eval_every == 0 or u + 1 == args.updates):
                record["curve"].append(_by_program(*evaluate()))
                record["curve_updates"].append(u + 1)
            bar.update()
    record["seconds"] = time.perf_counter() - start
    record["episodes"] = args.updates * args.plays * len(names)
    played, wins = evaluate()
    record["after"] = {"sampled": wins.tolist(), "programs": played}
    if args.rung == 1:
        record["after"]["greedy"] = evaluate(0.0)[1].tolist()
        record["curve"].append(_by_program(played, wins))
    return record


def _verdict(records: list[dict], args) -> tuple[list[str], bool]:
    """Markdown lines for the rung's tables and whether its bar is met."""
    lines, met = [], True
    trained = [r for r in records if r["lr"] > 0]
    controls = [r for r in records if r["lr"] == 0]
    if args.rung == 0:
        lines += ["| seed | lr | program | initial | best | first update >= 0.8 |", "| --- | --- | --- | --- | --- | --- |"]
        for r in records:
            for name in r["curve"][0]:
                series = [c[name] for c in r["curve"]]
                reach = next((u for u, v in zip(r["curve_updates"], series) if v >= 0.8), None)
                lines.append(f"| {r['seed']} | {r['lr']:g} | {name} | {series[0]:.2f} | {max(series):.2f} | "
                             f"{'–' if reach is None else reach} |")
                if r["lr"] > 0 and series[0] > 0 and reach is None:
                    met = False
        for r in controls:
            if any(c != r["curve"][0] for c in r["curve"]):
                met = False
    else:
        lines += ["| seed | lr | sampled before → after | p (McNemar) | greedy before → after | p (McNemar) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        gains = []
        for r in records:
            cells = []
            for kind in ("sampled", "greedy"):
                b, a = np.asarray(r["before"][kind], bool), np.asarray(r["after"][kind], bool)
                p = mcnemar_p(b, a)
                cells += [f"{b.mean():.3f} → {a.mean():.3f}", f"{p:.3g}"]
                if kind == "sampled" and r["lr"] > 0:
                    gains.append(a.mean() - b.mean())
                    met &= p < 0.05 and a.mean() > b.mean()
            lines.append(f"| {r['seed']} | {r['lr']:g} | " + " | ".join(cells) + " |")
        met &= bool(gains) and float(np.mean(gains)) >= 0.10
        names = list(family_rates(records[0]["before"]))
        lines += ["", "Sampled win rate per family, before → after:", "",
                  "| seed | lr | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
        for r in records:
            before, after = family_rates(r["before"]), family_rates(r["after"])
            lines.append(f"| {r['seed']} | {r['lr']:g} | "
                         + " | ".join(f"{before[n]:.2f} → {after[n]:.2f}" for n in names) + " |")
        lines += ["", "Training win rate, block means ± s.e. (blocks of "
                  f"{args.block} updates):", ""]
        for r in trained + controls:
            blocks = block_means([u["train_win_rate"] for u in r["updates"]], args.block)
            lines.append(f"- seed {r['seed']}, lr {r['lr']:g}: " + ", ".join(f"{m:.3f}±{s:.3f}" for m, s in blocks))
    met &= bool(trained)  # a run of controls alone shows nothing about learning
    cost = [f"- seed {r['seed']}, lr {r['lr']:g}: {r['seconds']:.0f} s, "
            f"{r['episodes'] / max(r['seconds'], 1e-9) * 60:.0f} episodes/min, "
            f"{r['seconds'] / max(len(r['updates']), 1):.1f} s/update" for r in records]
    return lines + ["", "Cost:", ""] + cost, met


def _plot(records: list[dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in records:
        if args.rung == 0:
            values = [np.mean(list(c.values())) for c in r["curve"]]
            ax.plot(r["curve_updates"], values, label=f"seed {r['seed']} lr {r['lr']:g}", linestyle="-" if r["lr"] else ":")
        else:
            blocks = block_means([u["train_win_rate"] for u in r["updates"]], args.block)
            means, ses = np.array([m for m, _ in blocks]), np.array([s for _, s in blocks])
            x = np.arange(len(blocks)) * args.block
            ax.errorbar(x, means, yerr=ses, label=f"seed {r['seed']} lr {r['lr']:g}", capsize=3,
                        linestyle="-" if r["lr"] else ":")
    ax.set_xlabel("update")
    ax.set_ylabel("win rate (fixed instances)" if args.rung == 0 else "training win rate (block mean)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rung", type=int, choices=(0, 1), required=True)
    parser.add_argument("--load", default="", help="a finished tiny bootstrap directory (bootstrap-<key>)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--updates", type=int, default=None, help="default: 15 (rung 0), 40 (rung 1)")
    parser.add_argument("--plays", type=int, default=16, help="plays per program per update (on average)")
    parser.add_argument("--allocate", choices=("uniform", "variance", "headroom"), default="uniform",
                        help="uniform: --plays per program; variance, headroom: the same total split by "
                             "allocate_plays with that rule")
    parser.add_argument("--min_plays", type=int, default=4, help="fewest plays of a program per update (variance, headroom)")
    parser.add_argument("--window", type=int, default=0,
                        help="variance, headroom: the win rates come from the last N updates' plays (0: all so far)")
    parser.add_argument("--eval_plays", type=int, default=32, help="evaluation plays per program")
    parser.add_argument("--lr", type=float, default=None, help="default: the preset's rl.lr")
    parser.add_argument("--block", type=int, default=10, help="updates per block mean (rung 1)")
    parser.add_argument("--eval_every", type=int, default=3, help="updates between evaluations (rung 0)")
    parser.add_argument("--no_control", action="store_true", help="skip the learning-rate-0 arms")
    parser.add_argument("--partial_credit", action="store_true",
                        help="training plays score a wrong answer's closeness (the library's partial_credit=True)")
    parser.add_argument("--report_only", action="store_true",
                        help="write the report of the arms already in OUT/rung<N>.json (a stopped run) and play nothing")
    args = parser.parse_args()
    args.updates = args.updates or (15 if args.rung == 0 else 40)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / f"rung{args.rung}.json"
    if args.report_only:
        if not saved.exists():
            raise SystemExit(f"--report_only: {saved} does not exist")
        records = [r for r in json.loads(saved.read_text()) if "after" in r]
        if not records:
            raise SystemExit(f"--report_only: {saved} has no finished arm")
        lr = max(r["lr"] for r in records)
    else:
        if not args.load:
            raise SystemExit("--load is required (a finished tiny bootstrap directory)")
        records = []
        with SandboxPool(SandboxConfig(num_workers=2)) as pool:
            setup = _setup(args, pool)
            lr = args.lr if args.lr is not None else float(setup.config.rl.lr)
            for seed in (int(s) for s in args.seeds.split(",")):
                for arm_lr in (lr,) if args.no_control else (lr, 0.0):
                    records.append(_arm(setup, seed, arm_lr, args))
                    saved.write_text(json.dumps(records))
    lines, met = _verdict(records, args)
    report = [f"# Rung {args.rung}", "", f"`python bench/rl_sanity.py --rung {args.rung} --load {args.load} "
              f"--seeds {args.seeds} --updates {args.updates} --plays {args.plays} --eval_plays {args.eval_plays} "
              f"--lr {lr:g} --allocate {args.allocate} --min_plays {args.min_plays} --window {args.window}"
              f"{' --partial_credit' if args.partial_credit else ''}{' --report_only' if args.report_only else ''}`",
              "", *lines, "", f"**Bar {'met' if met else 'not met'}.**"]
    (args.out / f"rung{args.rung}.md").write_text("\n".join(report) + "\n")
    _plot(records, args, args.out / f"rung{args.rung}.png")
    print("\n".join(report))


if __name__ == "__main__":
    main()
