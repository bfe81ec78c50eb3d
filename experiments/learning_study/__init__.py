"""The learning study: arms x seeds of self-play on one preset, resumable, then a report.

Each arm is the preset with a few config overrides; each (arm, seed) run has its own workdir
under ``--study_dir`` and is the main job itself (`spade_jax.main`), so a study interrupted
at any point continues where it stopped: a finished run is skipped, an unfinished one resumes
from its last checkpoint. All runs share one bootstrap cache. The held-out score at
iteration 0 is the preset's initial policy evaluated once (`spade_jax.evals`, same suites
and seed as the runs' periodic evaluation).

Arms (``--arms``, default all):
  spade         the preset as it is
  fixed_pool    no designer: the agent replays ``--fixed_pool_envs`` environments of memory
                per iteration (about the environments SPADE plays: its admitted designs plus
                its replays), the same episodes per environment
  frozen        the designer designs and is scored but not trained
  no_memory     designer prompts without exemplars, novelty against the batch only
  no_corpus     designer prompts without a document
  placebo       hints of the same length that carry no information (the noise floor of regret)
  resample      the hinted play is a second plain play with its own sampling noise (the regret
                estimator's floor, with nothing new for the agent to read)
  calibration   SPADE with solver-relative difficulty calibration (EvoEnv: a level per design, rejected
                when no level's greedy solve rate lies in the band) and mastered environments retired
  procedures    SPADE with the agent's procedure memory (ProPlay: preplay guidance from won plays, also
                in the held-out evaluation)

``--agent_token_budget N`` gives every run the same agent compute: a run ends once its agent
has generated N tokens (`config.agent_token_budget`), ``--iterations`` becoming the most it may
take, so an arm whose plays are short runs more iterations.

The report (``--report``, default ``experiments/learning_study/report.md``, PNGs in the folder of
its name beside it) gives per arm,
mean ± half the min-max spread over seeds: the held-out score at iteration 0 and at the end
(greedy, and sampled where the preset sets ``eval.sampled_temperature``),
admission rate, regret, the unclipped hinted - plain gap and designer reward over the run,
and plots their curves per iteration.

    python -m experiments.learning_study --study_dir /tmp/study                 # tiny, 3 seeds, all 9 arms
    python -m experiments.learning_study --study_dir /tmp/study --arms spade,placebo --seeds 0 --report_only
    for arm in spade calibration; do python -m experiments.learning_study --study_dir /tmp/study --arms $arm --no_report & done
    python -m experiments.learning_study --study_dir /tmp/smoke --preset configs/tiny.py:runlocal --iterations 2 \\
        --seeds 0 --arms spade,frozen --override=--config.eval.every=1     # a minutes-long check of the tool
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from experiments import presets

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PRESET = "configs/tiny.py"
DEFAULT_FIXED_POOL_ENVS = 8
ARMS = {
    "spade": [],
    "fixed_pool": ["--config.designer.enabled=False"],  # plus --config.agent.replay_envs (below)
    "frozen": ["--config.designer.train=False"],
    "no_memory": ["--config.memory.enabled=False"],
    "no_corpus": ["--config.corpus.enabled=False"],
    "placebo": ["--config.hints.mode=placebo"],  # plus the preset's hint mode as placebo_of (below)
    "resample": ["--config.hints.mode=resample"],
    "calibration": ["--config.calibration.enabled=True", "--config.memory.retire_win_rate=0.75"],
    "procedures": ["--config.agent.procedure_memory.enabled=True"],
}
CURVES = (("designer/admission_rate", "admission rate"), ("env/regret_mean", "regret"),
          ("env/gap_mean", "hinted - plain gap"), ("designer/reward_mean", "designer reward"),
          ("agent/plain_win_rate", "plain win rate (training pool)"))


def _arm_flags(arm: str, preset, args) -> list[str]:
    flags = list(ARMS[arm])
    if arm == "fixed_pool":
        flags.append(f"--config.agent.replay_envs={args.fixed_pool_envs}")
    if arm == "placebo":
        base = preset.hints.mode if preset.hints.mode in ("self", "strategy", "solution") else "self"
        flags.append(f"--config.hints.placebo_of={base}")
    return flags


def _rows(workdir: Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    print(f"$ {' '.join(cmd)}\n  (log: {log})", flush=True)
    with open(log, "a") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if code:
        sys.exit(f"failed with status {code}; see {log} (rerun the study to resume)")
    print(f"  done in {time.perf_counter() - started:.0f} s", flush=True)


def common_flags(args) -> list[str]:
    """The config flags every run of the study and its initial evaluation share (--config first)."""
    return [f"--config={args.preset}", f"--config.num_iterations={args.iterations}",
            f"--config.agent_token_budget={args.agent_token_budget}",
            f"--config.bootstrap.cache_dir={args.study_dir / 'bootstrap'}", *args.override]


def run_flags(args, preset, arm: str, seed: int) -> list[str]:
    """The config flags of the run (``arm``, ``seed``)."""
    return [*common_flags(args), f"--config.seed={seed}", *_arm_flags(arm, preset, args)]


def run_study(args, preset) -> None:
    common = common_flags(args)
    initial = args.study_dir / "initial"
    if not list(initial.glob("evals/initial/*.json")) and preset.eval.suites:
        _run([sys.executable, "-m", "spade_jax.evals", *common, f"--workdir={initial}", "--checkpoint=none"],
             initial / "log.txt")
    for arm in args.arms:
        for seed in args.seeds:
            workdir = args.study_dir / arm / f"seed{seed}"
            rows = [row for row in _rows(workdir) if "iteration" in row]
            tokens = sum(row.get("agent/generated_tokens", 0) for row in rows)
            if len(rows) >= args.iterations or (args.agent_token_budget and tokens >= args.agent_token_budget):
                print(f"{arm} seed {seed}: finished ({len(rows)} iterations, {tokens} agent tokens)", flush=True)
                continue
            _run([sys.executable, "-m", "spade_jax.main", *run_flags(args, preset, arm, seed), f"--workdir={workdir}"],
                 workdir / "log.txt")


def _heldout_key(rows: list[dict], sampled: bool = False) -> str | None:
    """The first suite's overall score key: greedy, or its `eval.sampled_temperature` twin."""
    keys = sorted({k for row in rows for k in row if k.startswith("eval/") and k.count("/") == 2
                   and k.endswith("/score") and k.endswith("-sampled/score") == sampled})
    return keys[0] if keys else None


def _initial_heldout(study_dir: Path) -> float | None:
    for path in sorted((study_dir / "initial" / "evals" / "initial").glob("*.json")):
        return json.loads(path.read_text()).get("score")
    return None


def _mean_spread(values: list[float]) -> str:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    digits = 0 if max(abs(v) for v in values) >= 100 else 3  # token counts without decimals
    return f"{np.mean(values):.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f} (n={len(values)})"


def _command(args) -> str:
    """The command that runs this study's arms and seeds as they were run (the report's provenance)."""
    flags = [f"--study_dir {args.study_dir}"]
    if args.preset != DEFAULT_PRESET:
        flags.append(f"--preset {args.preset}")
    flags += [f"--arms {','.join(args.arms)}", f"--seeds {','.join(map(str, args.seeds))}",
              f"--iterations {args.iterations}"]
    if args.agent_token_budget:
        flags.append(f"--agent_token_budget {args.agent_token_budget}")
    if args.fixed_pool_envs != DEFAULT_FIXED_POOL_ENVS:
        flags.append(f"--fixed_pool_envs {args.fixed_pool_envs}")
    flags += [f"--override={o}" for o in args.override]
    return "python -m experiments.learning_study " + " ".join(flags)


def report(args) -> str:
    initial = _initial_heldout(args.study_dir)
    length = f"{args.iterations} iterations"
    if args.agent_token_budget:
        length = f"{args.agent_token_budget} agent tokens, at most {args.iterations} iterations"
    lines = [f"# Learning study ({args.preset}, {length}, seeds {args.seeds})", "",
             f"Written {time.strftime('%Y-%m-%d %H:%M')} from the runs of `{_command(args)}`. "
             "Values: mean over seeds ± half the min-max spread; run means are over the iterations that "
             "report the metric.", "",
             f"Held-out score of the initial policy: {initial if initial is not None else '-'}", "",
             "| arm | held-out at the end | sampled | admission | regret | gap | designer reward | agent tokens "
             "| plain win rate | iterations |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    curves: dict[str, dict[str, list[list[float]]]] = {}
    per_seed: dict[str, dict[int, dict]] = {}
    for arm in args.arms:
        runs = [_rows(args.study_dir / arm / f"seed{seed}") for seed in args.seeds]
        runs = [[row for row in rows if "iteration" in row] for rows in runs]
        if not any(runs):
            lines.append(f"| {arm} | not run | | | | | | | | |")
            continue
        key = next((k for k in map(_heldout_key, runs) if k), None)
        sampled_key = next((k for k in (_heldout_key(rows, sampled=True) for rows in runs) if k), None)

        def at_end(metric):
            return [next((row[metric] for row in reversed(rows) if metric and metric in row), None) for rows in runs]

        end = at_end(key)

        def run_mean(metric, rows_list=runs, reduce=np.nanmean):  # null (NaN) values left out
            return [float(reduce([r[metric] for r in rows if r.get(metric) is not None]))
                    if any(r.get(metric) is not None for r in rows) else None for rows in rows_list]

        def run_total(metric):
            return run_mean(metric, reduce=np.nansum)

        def run_min(metric):
            return run_mean(metric, reduce=np.nanmin)

        lines.append(f"| {arm} | {_mean_spread(end)} | {_mean_spread(at_end(sampled_key))} | "
                     f"{_mean_spread(run_mean('designer/admission_rate'))} | "
                     f"{_mean_spread(run_mean('env/regret_mean'))} | {_mean_spread(run_mean('env/gap_mean'))} | "
                     f"{_mean_spread(run_mean('designer/reward_mean'))} | "
                     f"{_mean_spread(run_total('agent/generated_tokens'))} | "
                     f"{_mean_spread(run_mean('agent/plain_win_rate'))} | {[len(r) for r in runs]} |")
        per_seed[arm] = {seed: {"end": e, "regret": r, "admission_min": a} for seed, e, r, a in zip(
            args.seeds, end, run_mean("env/regret_mean"), run_min("designer/admission_rate")) if e is not None
            or r is not None}
        for metric in [m for m, _ in CURVES] + [k for k in (key, sampled_key) if k]:
            curves.setdefault(metric, {})[arm] = [[row.get(metric, math.nan) for row in rows] for rows in runs]
    lines += _criteria(per_seed, initial)
    _plot(curves, args.report.with_suffix(""))
    lines += ["", "Curves (mean over seeds, shaded min-max): "
              + ", ".join(f"`{args.report.with_suffix('').name}/{_slug(m)}.png`" for m in curves), ""]
    return "\n".join(lines)


def _criteria(per_seed: dict[str, dict[int, dict]], initial: float | None) -> list[str]:
    """Per seed, the SPADE arm against the bar: admission through the run, regret against the
    placebo arm's on the same seed (and the resample arm's, the estimator's own floor), held-out
    score at the end against the initial policy's."""
    spade, placebo, resample = (per_seed.get(arm, {}) for arm in ("spade", "placebo", "resample"))
    if not spade:
        return []

    def fmt(value):
        return "-" if value is None else f"{value:.3f}"

    lines = ["", "SPADE against the bar, per seed (admission ≥ 0.5 at every design; regret above the "
             "placebo arm's; held-out at the end above the initial policy's):", "",
             "| seed | lowest admission | regret | placebo regret | resample regret | held-out at the end | initial |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for seed, row in spade.items():
        lines.append(f"| {seed} | {fmt(row['admission_min'])} | {fmt(row['regret'])} | "
                     f"{fmt(placebo.get(seed, {}).get('regret'))} | {fmt(resample.get(seed, {}).get('regret'))} | "
                     f"{fmt(row['end'])} | {fmt(initial)} |")
    return lines


def _slug(metric: str) -> str:
    return metric.replace("/", "_")


def _plot(curves: dict, out_dir: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out_dir.mkdir(parents=True, exist_ok=True)
    labels = dict(CURVES)
    for metric, arms in curves.items():
        fig = Figure(figsize=(5.5, 3.2), dpi=100)
        fig.subplots_adjust(left=0.12, right=0.97, top=0.9, bottom=0.16)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_title(labels.get(metric, f"held-out score ({metric})"), fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        for arm, runs in arms.items():
            length = max(len(r) for r in runs)
            grid = np.full((len(runs), length), np.nan)
            for i, r in enumerate(runs):
                grid[i, :len(r)] = r
            if np.all(np.isnan(grid)):
                continue
            x = np.arange(length)
            with warnings.catch_warnings():  # all-NaN columns (iterations without the metric)
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, low, high = np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0)
            ok = ~np.isnan(mean)
            ax.plot(x[ok], mean[ok], marker="o", markersize=3, label=arm)
            ax.fill_between(x[ok], low[ok], high[ok], alpha=0.2)
        if ax.lines:
            ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
        fig.savefig(out_dir / f"{_slug(metric)}.png")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.learning_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study_dir", type=Path, required=True)
    parser.add_argument("--preset", default=DEFAULT_PRESET)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=10,
                        help="iterations per run; with --agent_token_budget, the most a run may take")
    parser.add_argument("--agent_token_budget", type=int, default=0,
                        help="> 0: every run ends once its agent generated this many tokens (equal agent compute)")
    parser.add_argument("--fixed_pool_envs", type=int, default=DEFAULT_FIXED_POOL_ENVS)
    parser.add_argument("--override", action="append", default=[], help="extra --config.x=y flags for every run")
    parser.add_argument("--report", type=Path, default=REPO / "experiments" / "learning_study" / "report.md")
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument("--no_report", action="store_true",
                        help="run only, write no report (for arms run in parallel; then --report_only)")
    args = parser.parse_args()
    args.arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.study_dir = args.study_dir.resolve()
    if args.report_only and args.no_report:
        parser.error("--report_only and --no_report exclude each other")
    if not args.report_only:
        run_study(args, presets.load(args.preset))
    if args.no_report:
        return
    text = report(args)
    args.report.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
