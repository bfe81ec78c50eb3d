"""The learning ladder's rungs 2 and 3: the designer's learning and the whole loop's, each against controls.

    python -m experiments.ladder.loop --rung 2 --study_dir DIR [--seeds 0,1,2] [--iterations 10] [--prompts 32]
    python -m experiments.ladder.loop --rung 3 --study_dir DIR [--seeds 0,1,2] --iterations 60 \\
        --agent_token_budget 15000 [--eval_plays 32]   # tiny: ~1800 agent tokens per spade iteration, ~300 fixed_pool

Both run their arms with `experiments.learning_study` (each run the main job, resumable: a finished
run is skipped, an unfinished one resumes from its checkpoint), then score checkpoints; every
score is cached in ``DIR/ladder/`` by run and checkpoint step, so a rerun only does what is missing.

- **rung 2, designer RL with a frozen agent**: the preset with the agent's loss weight 0 (its plays
  are not packed, so the designer's "auto" reward scale is x1), a design round every iteration
  scored one iteration later by the blend reward, ``--slots`` designs over ``--slots / --per_skill``
  skills (so per-skill centring has groups of ``--per_skill``), every rejected design trained on
  the failure penalty; arm ``spade`` trains the designer, arm ``frozen``
  (`designer.train=False`) has the same prompts' seeds and trains nothing. Measured on ``--prompts``
  fresh designer prompts (slots, documents and exemplars drawn from seeds no training iteration
  uses, the initial memory): the initial and each arm's final checkpoint write one design per
  prompt, admitted by the run's admission, played by the *initial* policy (the designer and agent
  share weights, so agent weight 0 does not freeze the agent's play inside a run: fixing the
  player isolates the designer) as the loop plays a new design, scored by the loop's designer
  reward (`scoring.designer_scores`; a rejected design scores the failure penalty). Paired by
  prompt, exact two-sided sign test (ties dropped). Bar: on every seed the trained designer's
  final reward is above the control's final reward with p < 0.05, and >= 50% of its fresh
  designs are admitted.
- **rung 3, the whole loop**: arms spade, fixed_pool, frozen, resample, placebo of the study at equal
  agent tokens; each final checkpoint plays ``--eval_plays`` fresh seeds of every trained family
  (`BootstrapConfig().envs`) at each level it declares, as does the initial policy, on the same
  seeds and sampling streams (sampled at the agent's temperature). Paired by (family, level, seed),
  exact McNemar. The held-out score is what the runs record (`eval.suites`, greedy) at their end
  and the initial policy's. Bar: on every seed spade's final policy beats the initial one and
  every control arm's final policy on the trained families with p < 0.05. The held-out score is
  reported, not part of the bar (its items are not paired here).

Writes ``OUT/rung<N>.json`` (every paired item), ``OUT/rung<N>.md`` (tables, the bar's verdict) and
``OUT/rung<N>.png``; ``--out`` defaults to ``DIR``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np

from experiments import learning_study as study
from experiments import presets
from experiments.stats import group_means, mcnemar_p, sign_test_p
from spade_jax.envs.contract import EPISODE_SEED_SPACE
from spade_jax.progress import progress_bar
from spade_jax.seeds import derive_seed

RUNG2_ARMS = ("spade", "frozen")  # trained designer, its control (learning_study.ARMS)
RUNG3_ARMS = ("spade", "fixed_pool", "frozen", "resample", "placebo")
PLATEAU = (0.4, 0.6)


# ---- pairing --------------------------------------------------------------------------------


def paired(before: dict, after: dict, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The values under ``key`` of two scored sets, matched item by item; refuses sets whose items
    (``before["items"]``: prompt or episode seed ids) differ."""
    if before["items"] != after["items"]:
        raise ValueError("the two sets were not scored on the same items")
    return np.asarray(before[key]), np.asarray(after[key])


# ---- runs and their configs ----------------------------------------------------------------


def rung2_overrides(args) -> list[str]:
    """The preset made into rung 2: frozen agent loss, a design round per iteration scored one
    iteration later by the blend, groups of ``per_skill`` designs per skill, rejected designs trained on the penalty."""
    if args.slots % args.per_skill or args.per_skill < 2:
        raise SystemExit(f"--slots ({args.slots}) must be a multiple of --per_skill ({args.per_skill}) >= 2")
    return ["--config.rl.agent_weight=0", "--config.designer.regeneration_period=1",
            "--config.designer.reward_delay=1", f"--config.designer.num_slots={args.slots}",
            f"--config.designer.skills_per_regeneration={args.slots // args.per_skill}",
            "--config.designer.reward.kind=blend", "--config.designer.reward.rejected=penalty", "--config.eval.every=0"]


def rung2b_overrides(args) -> list[str]:
    """The preset made into rung 2b: the scripted player (`agent/scripted.py`) with ``--budget`` /
    ``--hinted_budget`` / ``--width`` plays the designs (hinted plays are its larger budget: no
    hint text, mode "resample"), a design round every iteration trained one iteration later on
    its plays by the default reward (the blend) under the reference's rules (retries, rejected
    designs dropped), the preset's slots and skills; no replays, no held-out evaluation."""
    return ["--config.agent.player=scripted", f"--config.agent.scripted.budget={args.budget}",
            f"--config.agent.scripted.hinted_budget={args.hinted_budget}", f"--config.agent.scripted.width={args.width}",
            "--config.hints.mode=resample", "--config.designer.regeneration_period=1",
            "--config.designer.reward_delay=1", "--config.agent.replay_envs=0", "--config.eval.every=0"]


def study_args(args, arms) -> argparse.Namespace:
    """learning_study's arguments for this rung's runs (its report goes beside ours)."""
    shared_cache = [f"--config.compile_cache_dir={args.study_dir / 'xla_cache'}"]  # runs compile the same programs
    rung_overrides = {"2": rung2_overrides, "2b": rung2b_overrides}.get(args.rung, lambda args: [])
    override = shared_cache + rung_overrides(args) + list(args.override)
    return argparse.Namespace(study_dir=args.study_dir, preset=args.preset, arms=list(arms), seeds=args.seeds,
                              iterations=args.iterations, agent_token_budget=args.agent_token_budget,
                              fixed_pool_envs=study.DEFAULT_FIXED_POOL_ENVS, override=override,
                              report=args.out / f"rung{args.rung}_study.md")


def run_arms(args, arms) -> argparse.Namespace:
    """Runs (or resumes, or skips finished) every arm and seed, then writes learning_study's report
    of their curves. The initial policy's held-out score is evaluated only when the runs evaluate
    theirs (`eval.every` > 0: rung 2 and the runlocal preset do not)."""
    sargs = study_args(args, arms)
    preset = presets.load(args.preset)
    if not run_config(sargs, arms[0], args.seeds[0]).eval.every:
        preset.eval.suites = ""
    study.run_study(sargs, preset)
    sargs.report.write_text(study.report(sargs) + "\n")
    return sargs


def run_flags(sargs, arm: str, seed: int) -> list[str]:
    """The config flags learning_study gave run (``arm``, ``seed``), the preset's path absolute."""
    path, arg = presets.split(sargs.preset)
    flags = study.run_flags(sargs, presets.load(sargs.preset), arm, seed)
    return [f"--config={path}" + (f":{arg}" if arg else ""), *flags[1:]]


def run_config(sargs, arm: str, seed: int):
    """The config run (``arm``, ``seed``) was made with, parsed as the main job parses it; stops
    when it differs from the one the run saved (`config.json`) beyond the fields a resume may change."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["experiments.ladder.loop", *run_flags(sargs, arm, seed)]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "preset", flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    saved = sargs.study_dir / arm / f"seed{seed}" / "config.json"
    if saved.exists():
        resumable = ("num_iterations", "agent_token_budget", "log", "checkpoint", "compile_cache_dir")
        now, then = json.loads(values.config.to_json()), json.loads(saved.read_text())
        changed = sorted(k for k in set(now) | set(then) if k not in resumable and now.get(k) != then.get(k))
        if changed:
            raise SystemExit(f"{saved}: the run was made with other config sections ({changed}) than these flags give")
    return values.config


def load_policy(config, workdir: Path, checkpoint: str):
    """The run's policy at ``checkpoint`` (a step, or "none": the initial weights)."""
    from spade_jax import cli

    return cli.policy_from(config, str(workdir), checkpoint)[0]


def cached(path: Path, compute) -> dict:
    """``compute()``'s JSON, kept at ``path``: a rerun reads it instead of scoring again."""
    if path.exists():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return value


def latest_step(workdir: Path) -> int:
    from spade_jax.selfplay.checkpoint import Checkpointer

    checkpointer = Checkpointer(str(workdir / "checkpoints"), async_save=False)
    try:
        step = checkpointer.latest_step()
    finally:
        checkpointer.close()
    if step is None:
        raise SystemExit(f"{workdir} has no checkpoint: the run did not finish")
    return step


# ---- rung 2: designs for fresh prompts -------------------------------------------------------


def initial_memory(config):
    """The memory a run starts with: the seed library less the held-out programs."""
    from spade_jax.envs import library
    from spade_jax.selfplay import config as config_lib

    memory = config_lib.memory(config)
    if config.memory.seed_library:
        for env in (e for e in library.SEED_ENVS if e.name not in config.memory.heldout):
            memory.add_seed(library.load_source(env.name), env.skill, name=env.name)
    return memory


def fresh_designs(designer, config, seed: int, n: int, pool):
    """One design per fresh prompt (slots, documents, exemplars from seeds training never uses),
    designed and admitted as the loop does, a failed slot again up to `designer.max_attempts`;
    every attempt, in order. The same (config, seed, n) gives the same prompts."""
    from spade_jax.designer.corpus import Corpus
    from spade_jax.designer.rollout import admit_samples, assign_slots, design_with_retries, propose
    from spade_jax.selfplay import config as config_lib

    memory = initial_memory(config) if config.memory.enabled else None
    corpus = None
    if config.corpus.enabled:
        corpus_cfg = dataclasses.replace(config_lib.corpus_config(config), seed=derive_seed(seed, "ladder-corpus"))
        corpus = Corpus.from_config(corpus_cfg)
    cfg = dataclasses.replace(config_lib.designer_config(config), num_slots=n)
    admission = config_lib.admission_config(config)

    def attempt(slots, k, earlier):
        batch = propose(designer, memory, corpus, cfg, slots=slots, attempt=k, seed=derive_seed(seed, "ladder-prompts", k))
        return admit_samples(batch, pool, memory, admission, seed=derive_seed(seed, "ladder-admission", k),
                             earlier=earlier)

    slots = dict(enumerate(assign_slots(cfg, np.random.default_rng(derive_seed(seed, "ladder-slots")))))
    return design_with_retries(slots, cfg.max_attempts, attempt)


def final_designs(designs) -> list:
    """Each slot's admitted attempt, or its last one when none was admitted, in slot order."""
    final = {}
    for d in designs:
        if d.slot not in final or not final[d.slot].admitted:
            final[d.slot] = d
    return [final[slot] for slot in sorted(final)]


def play_designs(player, config, designs, seed: int, pool):
    """The admitted designs as the loop's new pool: `agent.episodes_per_env` plain and
    `agent.hinted_episodes_per_env` hinted plays each (hints and seeds by the loop's rules), played
    by ``player`` or, under ``agent.player="scripted"``, by the scripted player; recorded into
    `PoolEnv`s."""
    from spade_jax.agent import matched_requests, play_episodes, write_hints
    from spade_jax.agent.scripted import play_scripted
    from spade_jax.selfplay import config as config_lib
    from spade_jax.selfplay.state import PoolEnv

    hint_cfg = config_lib.hint_config(config)
    envs = [PoolEnv(f"fresh{d.slot:03d}", d.report.code, d.skill, d.doc_id, design_iteration=0)
            for d in designs if d.admitted]
    hints = write_hints(player, [e.code for e in envs], hint_cfg, seed=derive_seed(seed, "ladder-hints"))
    for env, hint in zip(envs, hints):
        env.hint = hint
    k, k_hinted, requests = config.agent.episodes_per_env, config.agent.hinted_episodes_per_env, []
    for e, env in enumerate(envs):
        seeds = [derive_seed(seed, "ladder-plays", e, j) % EPISODE_SEED_SPACE for j in range(k)]
        hinted = [derive_seed(seed, "ladder-plays", e, "hinted", j) % EPISODE_SEED_SPACE for j in range(k_hinted)]
        requests += matched_requests(e, env.code, seeds, hint_cfg.mode, env.hint, hint_cfg.placebo_of, hinted)
    agent_cfg, stream = config_lib.agent_config(config), derive_seed(seed, "ladder-episodes")
    if config.agent.player == "scripted":
        trajectories = play_scripted(pool, requests, agent_cfg, config_lib.scripted_config(config), seed=stream)
    else:
        trajectories = play_episodes(player, pool, requests, agent_cfg, seed=stream)
    for t in trajectories:
        env = envs[t.request.env_key]
        if t.dropped:
            env.step_timeouts += 1
        else:
            (env.hinted if t.hinted else env.plain).append((t.request.seed, t.reward, 0))
    return envs


def prompt_id(design) -> str:
    """A design's slot and a digest of its prompt's tokens: the item two designers are paired on."""
    digest = hashlib.sha1(np.asarray(design.prompt_tokens, np.int64).tobytes()).hexdigest()[:10]
    return f"{design.slot}:{digest}"


def score_designs(designs, envs, config, *, unadmitted: str = "penalty") -> dict:
    """The loop's designer reward of every slot's final design (`scoring.designer_scores`, in
    prompt order), with its admission and plain win rate. A slot without an admitted design
    scores the failure penalty (``unadmitted="penalty"``, rung 2's rule) or 0 (``"zero"``: under
    the reference's rule it earns nothing)."""
    from spade_jax.selfplay import config as config_lib
    from spade_jax.selfplay import scoring
    from spade_jax.selfplay.state import PendingDesign

    first = {d.slot: d for d in designs if d.attempt == 0}  # a slot is paired by its first prompt
    designs = final_designs(designs)
    rejected = "penalty" if unadmitted == "penalty" else "drop"
    reward_cfg = dataclasses.replace(config_lib.reward_config(config), rejected=rejected)
    stats = scoring.env_statistics(envs)
    by_id = {e.env_id: s for e, s in zip(envs, stats) if s is not None}
    env_ids = [f"fresh{d.slot:03d}" if d.admitted else None for d in designs]
    due = [PendingDesign(0, 0, d.slot, d.skill, d.difficulty, d.doc_id, env_id, d.report.stage, d.report.reason,
                         [int(x) for x in d.prompt_tokens], [int(x) for x in d.tokens], [float(x) for x in d.logprobs])
           for d, env_id in zip(designs, env_ids)]
    scores = scoring.designer_scores(due, by_id, reward_cfg, weight=1.0, delayed=config.designer.reward_delay > 0,
                                     timed_out=frozenset(e.env_id for e in envs if e.step_timeouts))
    rewards = list(scores.rewards) if rejected == "penalty" else [scores.by_env_id.get(i, 0.0) for i in env_ids]
    return {"items": [prompt_id(first[d.slot]) for d in designs], "reward": [float(r) for r in rewards],
            "admitted": [bool(d.admitted) for d in designs], "skill": [d.skill for d in designs],
            "stage": [d.report.stage for d in designs], "attempts": [d.attempt + 1 for d in designs],
            "win_rate": [by_id[i].win_rate if i in by_id else None for i in env_ids],
            "code": [d.report.code if d.admitted else None for d in designs]}


def measure_designer(designer, player, config, seed: int, n: int, pool) -> dict:
    designs = fresh_designs(designer, config, seed, n, pool)
    return score_designs(designs, play_designs(player, config, designs, seed, pool), config)


def rung2(args) -> dict:
    """Runs rung 2's arms, then scores the initial and final designers per seed on fresh prompts."""
    from spade_jax.sandbox import SandboxPool
    from spade_jax.selfplay import config as config_lib

    sargs = run_arms(args, RUNG2_ARMS)
    records = {}
    with progress_bar(len(args.seeds) * (1 + len(RUNG2_ARMS)), "rung 2: fresh prompts", unit="designers") as bar:
        for seed in args.seeds:
            config = run_config(sargs, "frozen", seed)
            with SandboxPool(config_lib.sandbox_config(config)) as pool:
                player = load_policy(config, args.study_dir / "frozen" / f"seed{seed}", "none")
                path = args.study_dir / "ladder" / f"rung2-initial-seed{seed}-n{args.prompts}.json"
                record = {"initial": cached(path, lambda: measure_designer(player, player, config, seed, args.prompts,
                                                                           pool))}
                bar.update()
                for arm in RUNG2_ARMS:
                    workdir = args.study_dir / arm / f"seed{seed}"
                    step = latest_step(workdir)
                    path = args.study_dir / "ladder" / f"rung2-{arm}-seed{seed}-step{step}-n{args.prompts}.json"
                    arm_config = run_config(sargs, arm, seed)
                    record[arm] = cached(path, lambda: measure_designer(
                        load_policy(arm_config, workdir, str(step)), player, arm_config, seed, args.prompts, pool))
                    record[arm]["step"] = step
                    record[arm]["run_admission"] = run_mean(workdir, "designer/admission_rate")
                    bar.update()
            records[seed] = record
    return records


def run_mean(workdir: Path, metric: str) -> float | None:
    values = [row[metric] for row in study._rows(workdir) if metric in row]
    return float(np.mean(values)) if values else None


def _against(control: dict, after: dict) -> tuple[float, bool, str]:
    """The trained designer's fresh-prompt rewards against the control's on the same prompts: the
    sign test's p, whether its mean is higher, and the report's cell."""
    c, t = paired(control, after, "reward")
    p = sign_test_p(c, t)
    return p, bool(t.mean() > c.mean()), f"{p:.3g} ({c.mean():.3f} → {t.mean():.3f})"


def rung2_report(records: dict) -> tuple[list[str], bool]:
    """Markdown lines (per seed: each arm's fresh-prompt reward before -> after with the sign test,
    trained against control, admission, win rates; sample programs) and whether the bar is met."""
    lines = ["| seed | arm | reward before → after | p (sign, vs before) | p (sign, vs control after) | "
             "fresh admission before → after | run admission | admitted win rates (after) | "
             "in [0.4, 0.6] before → after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    met = bool(records)
    for seed, record in records.items():
        before = record["initial"]
        control = record["frozen"]
        for arm in RUNG2_ARMS:
            after = record[arm]
            b, a = paired(before, after, "reward")
            vs_control = "–"
            if arm == "spade":
                p_control, beats, vs_control = _against(control, after)
                met &= p_control < 0.05 and beats and np.mean(after["admitted"]) >= 0.5
            rates = [w for w in after["win_rate"] if w is not None]
            lines.append(f"| {seed} | {arm} | {b.mean():.3f} → {a.mean():.3f} | {sign_test_p(b, a):.3g} | "
                         f"{vs_control} | "
                         f"{np.mean(before['admitted']):.2f} → {np.mean(after['admitted']):.2f} | "
                         f"{_fmt(after.get('run_admission'))} | {_quantiles(rates)} | "
                         f"{_in_band(before['win_rate'])} → {_in_band(after['win_rate'])} |")
    unchanged = [seed for seed, record in records.items() if record["frozen"]["reward"] == record["initial"]["reward"]]
    if unchanged:
        lines += ["", f"The control trains nothing: on seed(s) {', '.join(map(str, unchanged))} its final designs "
                  "score exactly as the initial policy's, so there \"vs control after\" is \"vs before\"."]
    lines += ["", "Sample of admitted programs the trained designer wrote at the end (first 3 admitted, "
              "first 15 lines):", ""]
    for seed, record in records.items():
        after = record["spade"]
        shown = [(s, c, w) for s, c, w in zip(after["skill"], after["code"], after["win_rate"]) if c][:3]
        for skill, code, win in shown:
            lines += [f"seed {seed}, skill {skill}, win rate {_fmt(win)}:", "", "```python",
                      *code.splitlines()[:15], "```", ""]
        if not shown:
            lines += [f"seed {seed}: no admitted program.", ""]
    return lines, met


def _fmt(value) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _quantiles(values) -> str:
    if not values:
        return "none admitted"
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0])
    return f"n={len(values)}: " + " / ".join(f"{v:.2f}" for v in q) + " (min/q1/med/q3/max)"


def _in_band(win_rates) -> str:
    """The share of admitted designs (win rate not None) whose win rate lies in the plateau band."""
    values = [w for w in win_rates if w is not None]
    if not values:
        return "-"
    return f"{np.mean([PLATEAU[0] <= v <= PLATEAU[1] for v in values]):.2f}"


def rung2_plot(records: dict, path: Path) -> None:
    """Per seed, mean fresh-prompt reward initial / control / trained, and the admitted programs'
    win rates before and after training."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.5), dpi=110)
    FigureCanvasAgg(fig)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    width = 0.25
    seeds = list(records)
    for i, key in enumerate(("initial",) + RUNG2_ARMS):
        left.bar(np.arange(len(seeds)) + (i - 1) * width, [np.mean(records[s][key]["reward"]) for s in seeds],
                 width, label=key if key == "initial" else f"{key} final")
    left.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
    left.set_ylabel("designer reward, fresh prompts")
    left.legend(fontsize=7)
    for key in ("initial", "spade"):
        rates = [w for s in seeds for w in records[s][key]["win_rate"] if w is not None]
        right.hist(rates, bins=np.linspace(0, 1, 11), alpha=0.5, label=key if key == "initial" else f"{key} final")
    right.axvspan(*PLATEAU, color="grey", alpha=0.15)
    right.set_xlabel("admitted programs' plain win rate (plateau band shaded)")
    right.set_ylabel("admitted designs")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


# ---- rung 2b: the designer against the scripted player --------------------------------------


def expected_reward(length: int, config) -> float:
    """The default reward (blend) a design of solution ``length`` earns in expectation against the
    scripted player, its finish probabilities standing in for win rates: where its frontier is."""
    from spade_jax.rl import rewards as rew_lib
    from spade_jax.selfplay import config as config_lib

    scripted, cfg = config_lib.scripted_config(config), config_lib.reward_config(config)
    p, p_hint = scripted.finish_probability(length, False), scripted.finish_probability(length, True)
    return float(cfg.regret_weight * np.clip((p_hint - p) / cfg.regret_scale, 0, 1)
                 + cfg.plateau_weight * rew_lib.plateau(p, cfg.plateau_low, cfg.plateau_high, cfg.plateau_ramp))


def frontier(config, lengths=range(1, 9)) -> list[int]:
    """The solution lengths of the largest expected reward (`expected_reward`)."""
    values = {n: round(expected_reward(n, config), 9) for n in lengths}
    return [n for n, v in values.items() if v == max(values.values())]


def with_lengths(record: dict, config, seed: int, pool) -> dict:
    """``record`` with each admitted design's solution length (`scripted.solution_lengths`)."""
    from spade_jax.agent.scripted import solution_lengths

    codes = [c for c in record["code"] if c]
    lengths = iter(solution_lengths(pool, codes, derive_seed(seed, "ladder-length") % EPISODE_SEED_SPACE,
                                    config.agent.max_turns))
    return {**record, "length": [next(lengths) if c else None for c in record["code"]]}


def run_lengths(workdir: Path, config, pool) -> dict:
    """The solution length of every design a run admitted, by iteration (from its environment log)."""
    from spade_jax.agent.scripted import solution_lengths
    from spade_jax.selfplay.runlog import EnvLogEntry

    path = workdir / "gallery" / "envs.jsonl"
    rows = [EnvLogEntry.from_json(json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []
    designed = [e for e in rows if e is not None and e.admitted and e.slot is not None and not e.is_seed]
    lengths = solution_lengths(pool, [e.code for e in designed], 0, config.agent.max_turns) if designed else []
    return {"iteration": [e.iteration for e in designed], "length": lengths}


def rung2b(args) -> dict:
    """Runs rung 2b's arms, then scores the initial and final designers per seed on fresh prompts
    against the scripted player, with each admitted design's solution length, and the lengths
    each run's designs had over its iterations."""
    from spade_jax.sandbox import SandboxPool
    from spade_jax.selfplay import config as config_lib

    sargs = run_arms(args, [a for a in RUNG2_ARMS if a in args.arms])
    if args.run_only:
        return {}
    sargs = study_args(args, RUNG2_ARMS)
    records = {}
    with progress_bar(len(args.seeds) * (1 + len(RUNG2_ARMS)), "rung 2b: fresh prompts", unit="designers") as bar:
        for seed in args.seeds:
            config = run_config(sargs, "frozen", seed)
            with SandboxPool(config_lib.sandbox_config(config)) as pool:
                def measure(designer, arm_config):
                    designs = fresh_designs(designer, arm_config, seed, args.prompts, pool)
                    envs = play_designs(designer, arm_config, designs, seed, pool)
                    return with_lengths(score_designs(designs, envs, arm_config, unadmitted="zero"), arm_config,
                                        seed, pool)

                initial = load_policy(config, args.study_dir / "frozen" / f"seed{seed}", "none")
                path = args.study_dir / "ladder" / f"rung2b-initial-seed{seed}-n{args.prompts}.json"
                record = {"initial": cached(path, lambda: measure(initial, config)), "frontier": frontier(config)}
                bar.update()
                for arm in RUNG2_ARMS:
                    workdir = args.study_dir / arm / f"seed{seed}"
                    step = latest_step(workdir)
                    path = args.study_dir / "ladder" / f"rung2b-{arm}-seed{seed}-step{step}-n{args.prompts}.json"
                    arm_config = run_config(sargs, arm, seed)
                    record[arm] = cached(path, lambda: measure(load_policy(arm_config, workdir, str(step)), arm_config))
                    record[arm]["step"] = step
                    record[arm]["run"] = cached(args.study_dir / "ladder" / f"rung2b-{arm}-seed{seed}-step{step}-run.json",
                                                lambda: run_lengths(workdir, arm_config, pool))
                    bar.update()
            records[seed] = record
    return records


def _distance(lengths, target: list[int]) -> float:
    """Mean distance of the known lengths to the nearest frontier length."""
    known = [n for n in lengths if n is not None]
    return float(np.mean([min(abs(n - t) for t in target) for n in known])) if known else math.nan


def rung2b_report(records: dict) -> tuple[list[str], bool]:
    """Markdown lines (per seed: fresh-prompt reward initial -> trained and frozen with sign tests,
    admission, the admitted designs' solution lengths and distance to the frontier; samples) and
    whether the bar is met: on every seed the trained designer's reward beats the frozen one's
    with p < 0.05 and its designs are nearer the frontier."""
    lines = ["| seed | arm | reward before → after | p (sign, vs before) | p (sign, vs frozen after) | "
             "admitted per slot before → after | mean attempts after | solution length, median before → after | "
             "distance to frontier before → after |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    met = bool(records)
    for seed, record in records.items():
        before, control, target = record["initial"], record["frozen"], record["frontier"]
        for arm in RUNG2_ARMS:
            after = record[arm]
            b, a = paired(before, after, "reward")
            vs_control = "–"
            if arm == "spade":
                p_control, beats, vs_control = _against(control, after)
                met &= (p_control < 0.05 and beats
                        and _distance(after["length"], target) < _distance(control["length"], target))
            median = lambda r: _fmt(float(np.median([n for n in r["length"] if n is not None] or [math.nan])))
            lines.append(f"| {seed} | {arm} | {b.mean():.3f} → {a.mean():.3f} | {sign_test_p(b, a):.3g} | {vs_control} | "
                         f"{np.mean(before['admitted']):.2f} → {np.mean(after['admitted']):.2f} | "
                         f"{np.mean(after['attempts']):.2f} | {median(before)} → {median(after)} | "
                         f"{_distance(before['length'], target):.2f} → {_distance(after['length'], target):.2f} |")
    if records:
        first = next(iter(records.values()))
        lines += ["", f"Frontier (the solution lengths of the largest expected reward): {first['frontier']}."]
    lines += ["", "Sample of admitted programs the trained designer wrote at the end (first 3 admitted, "
              "first 15 lines):", ""]
    for seed, record in records.items():
        after = record["spade"]
        shown = [(s, c, n) for s, c, n in zip(after["skill"], after["code"], after["length"]) if c][:3]
        for skill, code, length in shown:
            lines += [f"seed {seed}, skill {skill}, solution length {length}:", "", "```python",
                      *code.splitlines()[:15], "```", ""]
    return lines, met


def rung2b_plot(records: dict, path: Path) -> None:
    """Per seed: each run's admitted designs' solution length over its iterations (mean per
    iteration; the frontier shaded), and the fresh designs' lengths initial against trained."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    seeds = list(records)
    fig = Figure(figsize=(9, 3.2 * len(seeds)), dpi=110)
    FigureCanvasAgg(fig)
    for row, seed in enumerate(seeds):
        record = records[seed]
        left, right = fig.add_subplot(len(seeds), 2, 2 * row + 1), fig.add_subplot(len(seeds), 2, 2 * row + 2)
        low, high = min(record["frontier"]), max(record["frontier"])
        for ax in (left, right):
            ax.axhspan(low - 0.5, high + 0.5, color="grey", alpha=0.15) if ax is left else ax.axvspan(
                low - 0.5, high + 0.5, color="grey", alpha=0.15)
        for arm in RUNG2_ARMS:
            run = record[arm]["run"]
            by_it = {}
            for it, n in zip(run["iteration"], run["length"]):
                if n is not None:
                    by_it.setdefault(it, []).append(n)
            its = sorted(by_it)
            left.plot(its, [np.mean(by_it[i]) for i in its], marker=".", label=arm)
        left.set_title(f"seed {seed}: designs in training (frontier shaded)", fontsize=8)
        left.set_xlabel("iteration")
        left.set_ylabel("solution length (actions)")
        left.legend(fontsize=7)
        bins = np.arange(0.5, 9.5)
        for key in ("initial", "spade"):
            right.hist([n for n in record[key]["length"] if n is not None], bins=bins, alpha=0.5,
                       label=key if key == "initial" else "trained")
        right.set_title(f"seed {seed}: fresh prompts", fontsize=8)
        right.set_xlabel("solution length (actions)")
        right.set_ylabel("admitted designs")
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


# ---- rung 3: trained families on fresh seeds --------------------------------------------------


def family_seeds(seed: int, plays: int) -> dict[str, list[int]]:
    """``plays`` fresh episode seeds per trained family (the bootstrap's), fixed by the run seed."""
    from spade_jax.bootstrap import BootstrapConfig

    return {name: [derive_seed(seed, "ladder-families", name, j) % EPISODE_SEED_SPACE for j in range(plays)]
            for name in BootstrapConfig().envs}


def family_levels(name: str) -> tuple:
    """The difficulty levels seed program ``name`` declares, easiest first; (None,) (its default
    constants) when it declares none."""
    from spade_jax.envs import library
    from spade_jax.sandbox.policy import difficulty_levels

    return difficulty_levels(library.load_source(name)) or (None,)


def play_families(policy, config, seeds: dict[str, list[int]], stream: int, pool) -> dict:
    """Plain plays of each family at each of its declared levels on its seeds (one sampling
    stream); wins by item ``family/level/seed``."""
    from spade_jax.agent.rollout import EpisodeRequest, play_episodes
    from spade_jax.envs import library
    from spade_jax.selfplay import config as config_lib

    items = [(name, level, s) for name, family in seeds.items() for level in family_levels(name) for s in family]
    names = list(seeds)
    requests = [EpisodeRequest(names.index(n), library.load_source(n), int(s),
                               env_kwargs={} if level is None else {"difficulty": level}) for n, level, s in items]
    trajectories = play_episodes(policy, pool, requests, config_lib.agent_config(config), seed=stream)
    return {"items": [f"{n}/{level}/{s}" for n, level, s in items], "won": [bool(t.won) for t in trajectories]}


def level_rates(record: dict) -> str:
    """A scored set's win rate per level (items ``family/level/seed``), levels in first-seen order."""
    rates = group_means([item.split("/")[1] for item in record["items"]], record["won"])
    return " / ".join(f"{rate:.2f}" for rate in rates.values())


def rung3(args) -> dict:
    """Runs rung 3's arms, then plays the trained families with the initial and each final policy."""
    from spade_jax.sandbox import SandboxPool
    from spade_jax.selfplay import config as config_lib

    sargs = run_arms(args, args.arms)
    records = {}
    with progress_bar(len(args.seeds) * (1 + len(args.arms)), "rung 3: trained families", unit="policies") as bar:
        for seed in args.seeds:
            seeds, stream = family_seeds(seed, args.eval_plays), derive_seed(seed, "ladder-families-stream")
            config = run_config(sargs, args.arms[0], seed)  # the arms' agent settings are the same
            with SandboxPool(config_lib.sandbox_config(config)) as pool:
                initial = load_policy(config, args.study_dir / args.arms[0] / f"seed{seed}", "none")
                record = {"initial": cached(
                    args.study_dir / "ladder" / f"rung3-initial-seed{seed}-n{args.eval_plays}-levels.json",
                    lambda: play_families(initial, config, seeds, stream, pool))}
                bar.update()
                for arm in args.arms:
                    workdir = args.study_dir / arm / f"seed{seed}"
                    step = latest_step(workdir)
                    arm_config = run_config(sargs, arm, seed)
                    name = f"rung3-{arm}-seed{seed}-step{step}-n{args.eval_plays}-levels.json"
                    path = args.study_dir / "ladder" / name
                    record[arm] = cached(path, lambda: play_families(
                        load_policy(arm_config, workdir, str(step)), arm_config, seeds, stream, pool))
                    record[arm].update(step=step, **run_summary(workdir))
                    bar.update()
            records[seed] = record
    return {"records": records, "initial_heldout": study._initial_heldout(args.study_dir),
            "agent_token_budget": args.agent_token_budget}


def run_summary(workdir: Path) -> dict:
    """A run's iterations, agent tokens and held-out score at its end (None: never evaluated)."""
    rows = [row for row in study._rows(workdir) if "iteration" in row]
    key = study._heldout_key(rows)
    return {"iterations": len(rows), "agent_tokens": int(sum(r.get("agent/generated_tokens", 0) for r in rows)),
            "heldout": next((r[key] for r in reversed(rows) if key in r), None) if key else None}


def rung3_report(result: dict, arms) -> tuple[list[str], bool]:
    """One table per arm: per seed the trained families' win rate initial -> final (McNemar, over
    every level), per level, final against spade's final (McNemar), held-out score initial -> end;
    and whether the bar is met."""
    records, initial_heldout, budget = result["records"], result["initial_heldout"], result["agent_token_budget"]
    met = bool(records) and "spade" in arms
    lines = []
    for arm in arms:
        lines += ["", f"**{arm}**", "", "| seed | trained families initial → final | p (McNemar, vs initial) | "
                  "by level, initial → final | p (McNemar, vs spade final) | held-out initial → end | "
                  "agent tokens | iterations |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for seed, record in records.items():
            b, a = paired(record["initial"], record[arm], "won")
            p_initial = mcnemar_p(b.astype(bool), a.astype(bool))
            vs_spade = "–"
            if arm == "spade":
                met &= p_initial < 0.05 and a.mean() > b.mean()
            elif "spade" in record:
                c, s = paired(record[arm], record["spade"], "won")
                p_spade = mcnemar_p(c.astype(bool), s.astype(bool))
                vs_spade = f"{p_spade:.3g} ({a.mean():.3f} vs {s.mean():.3f})"
                met &= p_spade < 0.05 and s.mean() > c.mean()
            levels = f"{level_rates(record['initial'])} → {level_rates(record[arm])}"
            lines.append(f"| {seed} | {b.mean():.3f} → {a.mean():.3f} | {p_initial:.3g} | {levels} | {vs_spade} | "
                         f"{_fmt(initial_heldout)} → {_fmt(record[arm]['heldout'])} | "
                         f"{_tokens(record[arm]['agent_tokens'], budget)} | {record[arm]['iterations']} |")
    return lines, met


def _tokens(tokens: int, budget: int) -> str:
    """A run's agent tokens, marked when it stopped at its iteration cap before spending the budget."""
    return f"{tokens}" if tokens >= budget else f"{tokens} (budget {budget} not reached: raise --iterations)"


def rung3_plot(result: dict, arms, path: Path) -> None:
    """Trained families' win rate per arm (initial first), one bar group per seed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = result["records"]
    fig = Figure(figsize=(7, 3.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    keys = ["initial", *arms]
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ax.bar(np.arange(len(records)) + i * width, [np.mean(r[key]["won"]) for r in records.values()], width,
               label=key)
    ax.set_xticks(np.arange(len(records)) + 0.4 - width / 2, [f"seed {s}" for s in records])
    ax.set_ylabel("win rate, trained families, fresh seeds")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


# ---- the command line -----------------------------------------------------------------------


def command(args) -> str:
    flags = [f"--rung {args.rung}", f"--study_dir {args.study_dir}", f"--preset {args.preset}",
             f"--seeds {','.join(map(str, args.seeds))}", f"--iterations {args.iterations}"]
    if args.rung == "2":
        flags += [f"--prompts {args.prompts}", f"--slots {args.slots}", f"--per_skill {args.per_skill}"]
    elif args.rung == "2b":
        flags += [f"--prompts {args.prompts}", f"--budget {args.budget}", f"--hinted_budget {args.hinted_budget}",
                  f"--width {args.width}"]
    else:
        flags += [f"--arms {','.join(args.arms)}", f"--eval_plays {args.eval_plays}"]
    if args.agent_token_budget:
        flags.append(f"--agent_token_budget {args.agent_token_budget}")
    flags += [f"--override={o}" for o in args.override]
    return "python -m experiments.ladder.loop " + " ".join(flags)


def write_report(args, result, lines: list[str], met: bool, seconds: float) -> str:
    title = {"2": "designer RL with a frozen agent", "2b": "the designer against a scripted player whose frontier is "
             "known"}.get(args.rung, "the whole loop")
    text = "\n".join([f"# Rung {args.rung}: {title}", "", f"`{command(args)}` ({seconds:.0f} s this invocation, "
                      f"{time.strftime('%Y-%m-%d %H:%M')}; the runs' curves: `rung{args.rung}_study.md`)", "", *lines,
                      "", f"**Bar {'met' if met else 'not met'}.**"]) + "\n"
    (args.out / f"rung{args.rung}.md").write_text(text)
    (args.out / f"rung{args.rung}.json").write_text(json.dumps({"command": command(args), "bar_met": met,
                                                                "result": result}))
    return text


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m experiments.ladder.loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rung", choices=("2", "2b", "3"), required=True)
    parser.add_argument("--study_dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=None, help="where the report goes (default: --study_dir)")
    parser.add_argument("--preset", default=study.DEFAULT_PRESET)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=10,
                        help="iterations per run; with --agent_token_budget, the most a run may take")
    parser.add_argument("--agent_token_budget", type=int, default=0,
                        help="every run ends once its agent generated this many tokens (required by rung 3)")
    parser.add_argument("--prompts", type=int, default=32, help="rung 2: fresh designer prompts per seed")
    parser.add_argument("--slots", type=int, default=8, help="rung 2: designs per iteration")
    parser.add_argument("--per_skill", type=int, default=2, help="rung 2: designs per skill per iteration")
    parser.add_argument("--budget", type=float, default=2.5, help="rung 2b: the scripted player's plain budget")
    parser.add_argument("--hinted_budget", type=float, default=4.5, help="rung 2b: its hinted budget")
    parser.add_argument("--width", type=float, default=0.5, help="rung 2b: the width of its fall-off")
    parser.add_argument("--arms", default=None, help="the arms to run (rung 2 and 2b: spade,frozen; rung 3: "
                        "learning_study arms); rung 2b measures both")
    parser.add_argument("--run_only", action="store_true",
                        help="rung 2b: run (or resume) the arms and stop, e.g. one process per arm; a later call "
                             "without it measures")
    parser.add_argument("--eval_plays", type=int, default=32, help="rung 3: fresh seeds per trained family")
    parser.add_argument("--override", action="append", default=[], help="extra --config.x=y flags for every run")
    args = parser.parse_args(argv)
    if args.rung == "3" and not args.agent_token_budget:
        parser.error("rung 3 compares its arms at equal agent compute: give --agent_token_budget")
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.arms = [a for a in (args.arms or ",".join(RUNG3_ARMS if args.rung == "3" else RUNG2_ARMS)).split(",") if a]
    unknown = [a for a in args.arms if a not in study.ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(study.ARMS)}")
    args.study_dir = args.study_dir.resolve()
    args.out = (args.out or args.study_dir).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    started = time.perf_counter()
    if args.rung == "2":
        result = rung2(args)
        lines, met = rung2_report(result)
        rung2_plot(result, args.out / "rung2.png")
    elif args.rung == "2b":
        result = rung2b(args)
        if args.run_only:
            return ""
        lines, met = rung2b_report(result)
        rung2b_plot(result, args.out / "rung2b.png")
    else:
        result = rung3(args)
        lines, met = rung3_report(result, args.arms)
        rung3_plot(result, args.arms, args.out / "rung3.png")
    text = write_report(args, result, lines, met, time.perf_counter() - started)
    print(text)
    return text


if __name__ == "__main__":
    main()
