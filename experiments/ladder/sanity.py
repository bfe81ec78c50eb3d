"""The learning ladder's first rungs on a trained policy, each with its control (issue: show that it learns).

    python -m experiments.ladder.sanity --rung 0 --load BOOTSTRAP_DIR --out DIR [--seeds 0,1,2] [--updates 15]
    python -m experiments.ladder.sanity --rung 1 --load BOOTSTRAP_DIR --out DIR [--seeds 0,1,2] [--updates 40]
    python -m experiments.ladder.sanity --preset testbed --rung 1 --load CACHE_DIR --out DIR [--knobs uniform|levels]

Both train the agent alone on the preset's bootstrap's trained families (`--preset`, `tiny` by
default; its `bootstrap.envs`: no designer, no hints) with the preset's agent settings and update
(`configs/<preset>.py`): per round
of plays, `rl.updates_per_iteration` optimizer steps anchored on the plays' log-probs, as the
loop's `_update` does; advantages centred over each program's plays as in self-play
(`scoring.agent_sequences`); a control arm at learning rate 0 on the same seeds.

- **rung 0, machinery**: one fixed instance per program (its seed drawn once per run seed);
  `--plays` plays of it per update; after every update `--eval_plays` sampled plays of each
  instance on fixed sampling streams, every `--eval_every` updates. Bar: every instance with initial wins > 0 reaches a win
  rate >= 0.8 within the updates, and the control's curve does not move.
- **rung 1, fresh seeds**: every update plays fresh seeds; before and after, `--eval_plays`
  fixed fresh seeds per program are played sampled (temperature 1) and greedy, paired seed
  by seed. Bar: on every run seed the final policy beats the initial one by >= +0.10 sampled
  win rate with McNemar p < 0.05, and every control arm's change has p >= 0.05.
  The training win rate's block means (blocks of `--block` updates) with standard errors show
  the curve.

On the `testbed` preset (`spade_jax/envs/library/testbed/`) every play is of a family at one
value of its knob: the training plays draw it per group of `--group` plays (a group's plays are
one program, its advantages centred over them) uniformly over the family's trained values
(`--knobs uniform`) or by level (`--knobs levels`: easy, medium or hard uniformly, at the value the
program's `LEVELS` gives it, which is what `difficulty=<level>` sets); the evaluation's seeds of a
family cycle through its trained values (`--eval_knobs trained`) or all its values, the two beyond
the trained range too (`--eval_knobs all`), and the report adds the win rate per knob value.
`--updates 0 --no_control --eval_knobs all` measures the initial policy alone. `--load` is a
finished bootstrap directory, or a cache directory where the preset's bootstrap is built first.

`--partial_credit` makes the training plays' programs grade a wrong final answer (the library's
`partial_credit=True`: `PARTIAL_CREDIT_SCALE` times its closeness, never a win), so a group
without wins still has reward differences to centre; the evaluations stay on wins, unchanged.

Writes `DIR/rung<N>.json` (every curve and evaluation, after each arm), `DIR/rung<N>.md` (the
tables, rung 1's per-family win rates, the bar's verdict) and `DIR/rung<N>.png`. Seconds per update
and episodes per minute are recorded. A run is resumable: rerun it with the same arguments and
the arms its json holds are kept (a json of other options stops it). `--report_only` writes the
report of the arms a stopped run finished, from its json, without playing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from experiments import presets
from experiments.stats import block_means, group_means, mcnemar_p
from spade_jax.agent.rollout import EpisodeRequest, play_episodes
from spade_jax.bootstrap import bootstrap_policy, cache_path, load_bootstrap
from spade_jax.envs import library
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.envs.library import testbed
from spade_jax.progress import progress_bar
from spade_jax.rl.batch import pack
from spade_jax.rl.train import Trainer
from spade_jax.sandbox import SandboxConfig, SandboxPool
from spade_jax.seeds import derive_seed
from spade_jax.selfplay.config import agent_config, bootstrap_config, loss_config, optim_config
from spade_jax.selfplay.scoring import agent_sequences


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


KNOB_SAMPLING = ("uniform", "levels")


@dataclasses.dataclass
class Setup:
    """What every arm shares: the preset's settings, its families, the sandbox pool, the bootstrap.

    ``testbed`` families are played at a knob value (`program`); the seed library's as written."""

    config: object
    families: list[str]
    pool: SandboxPool
    load: str
    testbed: bool = False
    sources: dict = dataclasses.field(default_factory=dict)

    def program(self, family: str, knob: int | None) -> str:
        """The program text of ``family`` at knob value ``knob`` (None: as written)."""
        key = (family, knob)
        if key not in self.sources:
            self.sources[key] = (testbed.render(family, knob) if self.testbed and knob is not None
                                 else library.load_source(family))
        return self.sources[key]


@dataclasses.dataclass(frozen=True)
class Item:
    """One play: a family, its knob value (None: the program as written) and the episode seed."""

    family: str
    knob: int | None
    seed: int


def family_rates(evaluation: dict, kind: str = "sampled") -> dict[str, float]:
    """Win rate per program of one evaluation (``{kind: [won], "programs": [name]}``), in the order
    the programs first appear."""
    return group_means(evaluation["programs"], evaluation[kind])


def knob_rates(evaluation: dict, family: str, kind: str = "sampled") -> dict[int, float]:
    """Win rate per knob value of ``family`` in one evaluation (``"knobs"``: each play's value), ascending."""
    plays = [(k, w) for n, k, w in zip(evaluation["programs"], evaluation["knobs"], evaluation[kind]) if n == family]
    rates = group_means([k for k, _ in plays], [w for _, w in plays])
    return dict(sorted(rates.items()))


def knob_values(family: str, which: str) -> tuple[int, ...]:
    """A testbed family's knob values: its ``trained`` ones or ``all`` (the trained and those beyond)."""
    env = testbed.get(family)
    return env.trained if which == "trained" else env.allowed


def draw_knob(family: str, sampling: str, rng: np.random.Generator) -> int:
    """A training group's knob value: uniform over the trained values, or at a uniformly drawn level."""
    if sampling == "uniform":
        values = testbed.get(family).trained
        return int(values[rng.integers(len(values))])
    if sampling == "levels":
        levels = testbed.level_values(family)
        return levels[list(levels)[rng.integers(len(levels))]]
    raise ValueError(f"unknown knob sampling {sampling!r}: one of {KNOB_SAMPLING}")


def training_items(setup: Setup, counts: dict[str, int], seed_of, sampling: str, group: int,
                   rng: np.random.Generator) -> list[Item]:
    """Each family's ``counts[family]`` plays (seeds ``seed_of(family, j)``); testbed plays come in
    groups of ``group`` at one knob value each (`draw_knob`), the last group of a family possibly smaller."""
    items = []
    for family, count in counts.items():
        knob = None
        for j in range(count):
            if setup.testbed and j % group == 0:
                knob = draw_knob(family, sampling, rng)
            items.append(Item(family, knob, seed_of(family, j)))
    return items


def evaluation_items(setup: Setup, seed: int, plays: int, eval_knobs: str) -> list[Item]:
    """``plays`` fresh seeds per family; a testbed family's cycle through its `knob_values`."""
    items = []
    for family in setup.families:
        values = knob_values(family, eval_knobs) if setup.testbed else (None,)
        items += [Item(family, values[j % len(values)], derive_seed(seed, "eval", family, j) % EPISODE_SEED_SPACE)
                  for j in range(plays)]
    return items


def _setup(args, pool) -> Setup:
    config = presets.load(args.preset)
    boot = bootstrap_config(config)
    load = Path(args.load) if args.load else None
    if load is not None and not (load / "DONE").exists():  # a cache directory: build or load the preset's there
        bootstrap_policy(load, boot, progress=True)
        load = cache_path(load, boot)
    return Setup(config, list(boot.envs), pool, str(load) if load else "", testbed=boot.families == "testbed")


def _play(policy, setup: Setup, items: list[Item], stream: int, *, temperature: float | None = None,
          env_kwargs: dict | None = None):
    """Plain plays of ``items`` (each program given ``env_kwargs``), the plays of one (family, knob) one
    group; returns the trajectories."""
    cfg = agent_config(setup.config)
    if temperature is not None:
        cfg = dataclasses.replace(cfg, temperature=temperature)
    groups: dict[tuple, int] = {}
    requests = [EpisodeRequest(groups.setdefault((i.family, i.knob), len(groups)), setup.program(i.family, i.knob),
                               int(i.seed), env_kwargs=dict(env_kwargs or {})) for i in items]
    return play_episodes(policy, setup.pool, requests, cfg, seed=stream)


def _wins(trajectories) -> np.ndarray:
    return np.asarray([t.won for t in trajectories], bool)


def _update(trainer: Trainer, setup: Setup, trajectories) -> dict:
    groups = 1 + max((t.request.env_key for t in trajectories), default=0)
    sequences = agent_sequences(trajectories, [None] * groups, train_hinted=False,
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


def _evaluation(items: list[Item], won: np.ndarray) -> dict:
    return {"sampled": won.tolist(), "programs": [i.family for i in items], "knobs": [i.knob for i in items]}


def _arm(setup: Setup, seed: int, lr: float, args) -> dict:
    """One arm (a run seed at one learning rate) of the chosen rung."""
    policy = load_bootstrap(setup.load)
    optim = dataclasses.replace(optim_config(setup.config), lr=lr)
    trainer = Trainer(policy, optim, loss_config(setup.config))
    names = setup.families
    fixed_rng = np.random.default_rng(derive_seed(seed, "rung0-knob"))
    fixed = {n: Item(n, draw_knob(n, args.knobs, fixed_rng) if setup.testbed else None,
                     derive_seed(seed, "rung0", n) % EPISODE_SEED_SPACE) for n in names}
    eval_items = ([fixed[n] for n in names for _ in range(args.eval_plays)] if args.rung == 0
                  else evaluation_items(setup, seed, args.eval_plays, args.eval_knobs))

    def evaluate(temperature=None):
        return _wins(_play(policy, setup, eval_items, stream=derive_seed(seed, "eval-stream"), temperature=temperature))

    record = {"seed": seed, "lr": lr, "updates": [], "curve": [], "curve_updates": [0]}
    record["before"] = _evaluation(eval_items, evaluate())
    if args.rung == 1 and args.greedy:
        record["before"]["greedy"] = evaluate(0.0).tolist()
    record["curve"].append(family_rates(record["before"]))
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
                items = [fixed[n] for n in names for _ in range(counts[n])]
            else:
                items = training_items(
                    setup, counts, lambda n, j: derive_seed(seed, "train", u, n, j) % EPISODE_SEED_SPACE,
                    args.knobs, args.group, np.random.default_rng(derive_seed(seed, "train-knobs", u)))
            trajectories = _play(policy, setup, items, stream=derive_seed(seed, "train-stream", u),
                                 env_kwargs={"partial_credit": True} if args.partial_credit else None)
            history.append(({n: 0 for n in names}, {n: 0 for n in names}))
            for item, w in zip(items, _wins(trajectories)):
                history[-1][0][item.family] += int(w)
                history[-1][1][item.family] += 1
            info = _update(trainer, setup, trajectories)
            info["train_win_rate"] = float(_wins(trajectories).mean())
            info["train_reward_mean"] = float(np.mean([t.reward for t in trajectories]))
            info["plays"] = counts
            record["updates"].append(info)
            if args.rung == 0 and ((u + 1) % args.eval_every == 0 or u + 1 == args.updates):
                record["curve"].append(family_rates(_evaluation(eval_items, evaluate())))
                record["curve_updates"].append(u + 1)
            bar.update()
    record["seconds"] = time.perf_counter() - start
    record["episodes"] = args.updates * args.plays * len(names)
    if not args.updates:  # the initial policy alone: nothing changed to evaluate again
        record["after"] = record["before"]
        return record
    record["after"] = _evaluation(eval_items, evaluate())
    if args.rung == 1:
        if args.greedy:
            record["after"]["greedy"] = evaluate(0.0).tolist()
        record["curve"].append(family_rates(record["after"]))
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
                if kind not in r["before"]:
                    cells += ["–", "–"]
                    continue
                b, a = np.asarray(r["before"][kind], bool), np.asarray(r["after"][kind], bool)
                p = mcnemar_p(b, a)
                cells += [f"{b.mean():.3f} → {a.mean():.3f}", f"{p:.3g}"]
                if kind == "sampled" and r["lr"] > 0:
                    gains.append(a.mean() - b.mean())
                    met &= p < 0.05 and a.mean() - b.mean() >= 0.10
                elif kind == "sampled":
                    met &= p >= 0.05
            lines.append(f"| {r['seed']} | {r['lr']:g} | " + " | ".join(cells) + " |")
        met &= bool(gains)
        names = list(family_rates(records[0]["before"]))
        lines += ["", "Sampled win rate per family, before → after:", "",
                  "| seed | lr | " + " | ".join(names) + " |", "| --- | --- |" + " --- |" * len(names)]
        for r in records:
            before, after = family_rates(r["before"]), family_rates(r["after"])
            lines.append(f"| {r['seed']} | {r['lr']:g} | "
                         + " | ".join(f"{before[n]:.2f} → {after[n]:.2f}" for n in names) + " |")
        lines += knob_table(records, names, initial_only=not any(r["updates"] for r in records))
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


def knob_table(records: list[dict], names: list[str], initial_only: bool = False) -> list[str]:
    """Markdown: each testbed family's sampled win rate per knob value, before → after (before alone
    with ``initial_only``), a row per arm; nothing for plays without a knob value."""
    if not all(any(k is not None for k in r["before"].get("knobs", ())) for r in records):
        return []
    lines = ["", "Sampled win rate per knob value" + (" (initial policy; plays per value in brackets):"
                                                     if initial_only else ", before → after:")]
    for name in names:
        values = list(knob_rates(records[0]["before"], name))
        lines += ["", f"{name} ({testbed.get(name).knob}):", "",
                  "| seed | lr | " + " | ".join(map(str, values)) + " |", "| --- | --- |" + " --- |" * len(values)]
        for r in ([records[0]] if initial_only else records):
            before, after = knob_rates(r["before"], name), knob_rates(r["after"], name)
            if initial_only:
                counts = [sum(1 for n, k in zip(r["before"]["programs"], r["before"]["knobs"]) if n == name and k == v)
                          for v in values]
                cells = [f"{before[v]:.2f} ({c})" for v, c in zip(values, counts)]
            else:
                cells = [f"{before[v]:.2f} → {after[v]:.2f}" for v in values]
            lines.append(f"| {r['seed']} | {r['lr']:g} | " + " | ".join(cells) + " |")
    return lines


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


_RUN_OPTIONS = ("rung", "preset", "updates", "plays", "allocate", "min_plays", "window", "eval_plays", "knobs",
                "group", "eval_knobs", "greedy", "partial_credit")


def run_options(args, lr: float, load: str) -> dict:
    """What an arm's results depend on besides its seed: a resumed run must match them."""
    return {"load": load, "lr": lr, **{name: getattr(args, name) for name in _RUN_OPTIONS}}


def resumed(saved: Path, options: dict) -> list[dict]:
    """The finished arms in ``saved`` (a run stopped part-way), to be kept; an arm run with other
    options stops the run (write to another --out)."""
    if not saved.exists():
        return []
    records = [r for r in json.loads(saved.read_text()) if "after" in r]
    for r in records:
        differ = {k: (r.get("options", {}).get(k), v) for k, v in options.items() if r.get("options", {}).get(k) != v}
        if differ:
            raise SystemExit(f"{saved} holds arms run with other options {differ} (saved, now); use another --out")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rung", type=int, choices=(0, 1), required=True)
    parser.add_argument("--preset", choices=("tiny", "testbed"), default="tiny", help="the preset (configs/<preset>.py)")
    parser.add_argument("--load", default="", help="a finished bootstrap directory (bootstrap-<key>), or a cache "
                                                   "directory where the preset's bootstrap is built or loaded")
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
    parser.add_argument("--knobs", choices=KNOB_SAMPLING, default="uniform",
                        help="testbed: a training group's knob value, uniform over the trained values or by level")
    parser.add_argument("--group", type=int, default=4, help="testbed: training plays per knob value drawn")
    parser.add_argument("--eval_knobs", choices=("trained", "all"), default="trained",
                        help="testbed: the knob values the evaluation cycles through (all: and two beyond)")
    parser.add_argument("--no_greedy", dest="greedy", action="store_false", help="rung 1: no greedy evaluation")
    parser.add_argument("--report_only", action="store_true",
                        help="write the report of the arms already in OUT/rung<N>.json (a stopped run) and play nothing")
    args = parser.parse_args()
    args.updates = (15 if args.rung == 0 else 40) if args.updates is None else args.updates
    if args.group < 1:
        raise SystemExit(f"--group must be >= 1, got {args.group}")
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
            raise SystemExit("--load is required (a finished bootstrap directory or a cache directory)")
        with SandboxPool(SandboxConfig(num_workers=2)) as pool:
            setup = _setup(args, pool)
            lr = args.lr if args.lr is not None else float(setup.config.rl.lr)
            options = run_options(args, lr, setup.load)
            records = resumed(saved, options)
            for seed in (int(s) for s in args.seeds.split(",")):
                for arm_lr in (lr,) if args.no_control else (lr, 0.0):
                    if any(r["seed"] == seed and r["lr"] == arm_lr for r in records):
                        continue
                    records.append({**_arm(setup, seed, arm_lr, args), "options": options})
                    saved.write_text(json.dumps(records))
    lines, met = _verdict(records, args)
    testbed_flags = (f" --preset {args.preset} --knobs {args.knobs} --group {args.group} --eval_knobs {args.eval_knobs}"
                     if args.preset != "tiny" else "")
    report = [f"# Rung {args.rung}", "", f"`python -m experiments.ladder.sanity --rung {args.rung} --load {args.load} "
              f"--seeds {args.seeds} --updates {args.updates} --plays {args.plays} --eval_plays {args.eval_plays} "
              f"--lr {lr:g} --allocate {args.allocate} --min_plays {args.min_plays} --window {args.window}"
              f"{testbed_flags}{'' if args.greedy else ' --no_greedy'}"
              f"{' --partial_credit' if args.partial_credit else ''}{' --report_only' if args.report_only else ''}`",
              "", *lines, "", f"**Bar {'met' if met else 'not met'}.**"]
    (args.out / f"rung{args.rung}.md").write_text("\n".join(report) + "\n")
    _plot(records, args, args.out / f"rung{args.rung}.png")
    print("\n".join(report))


if __name__ == "__main__":
    main()
