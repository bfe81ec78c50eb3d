"""Runs suites with the policy: chat items through `complete_chats`, episode items through the
agent's own multi-turn engine and sandbox; scores, per-item JSONL and summaries.

Per suite, under ``out_dir``: ``<name>.jsonl`` (one line per item and sample: reply or
transcript, score, details), ``<name>.json`` and ``<name>.md`` (the summary: items, mean
score, solved rate, pass@k for every k up to the samples drawn, per group, the generation
settings, the seed, the wall time). Every random choice derives from ``EvalConfig.seed``, so
the same seed and parameters give the same items and scores.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from typing import Any, Callable, Sequence

import numpy as np

from spade_jax.admission import AdmissionConfig
from spade_jax.agent import AgentConfig, EpisodeRequest, play_episodes
from spade_jax.agent.actions import parse_action
from spade_jax.evals.bounded import BudgetRecord, reply_budgets
from spade_jax.evals.registry import make_suite, registered
from spade_jax.evals.suite import Context, GenerationSettings, Item, Score, Suite, SuiteUnavailable
from spade_jax.progress import progress_bar
from spade_jax.sampling.chat import complete_chats
from spade_jax.seeds import derive_seed
from spade_jax.jsonable import jsonable


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Which suites, how many items, and the run-wide knobs of evaluation.

    suites: comma-separated specs (``prefix[:argument]``, see `registry`); every: the main job evaluates
    after every N-th iteration (0: never); limit: items per suite (0: all); seed: items,
    shuffles and sampling (unset in a run's config: the run's `seed`); plays_per_program: plays
    per program of an environment or game suite; default_turns: turns of an episode item that
    does not set its own; batch_size: chats per sampler call; acebench_dir: the ACEBench data directory when the spec gives none;
    admission: the run's admission (its sandbox and limits), with which environment suites
    admit their programs (None: the defaults); sampled_temperature: when > 0, every suite
    whose settings are greedy is also scored sampled at this temperature, on the same items
    and seeds, under the name ``<suite>-sampled`` (greedy scores the policy's mode, sampled
    the distribution training draws from); user_endpoint: the base URL (``http://host:port/v1``) of
    an OpenAI-compatible server whose model plays the suites' simulated users (ACEBench
    multi_turn; "": the evaluated policy).
    """

    suites: str = ""
    every: int = 0
    limit: int = 0
    seed: int = 0
    plays_per_program: int = 4
    default_turns: int = 8
    batch_size: int = 32
    acebench_dir: str = ""
    admission: AdmissionConfig | None = None
    sampled_temperature: float = 0.0
    user_endpoint: str = ""

    def __post_init__(self):
        if (self.every < 0 or self.limit < 0 or self.plays_per_program < 1 or self.default_turns < 1 or self.batch_size < 1
                or self.sampled_temperature < 0):
            raise ValueError(f"eval config out of range: {self}")

    @property
    def specs(self) -> tuple[str, ...]:
        """The suite specs: ``suites`` split at commas, except that a piece which does not start
        with a registered prefix continues the argument before it (``gymnax:Catch-bsuite,DeepSea-bsuite``)."""
        known = registered()
        specs: list[str] = []
        for piece in (p.strip() for p in self.suites.split(",")):
            if piece and specs and ":" in specs[-1] and piece.partition(":")[0] not in known:
                specs[-1] += "," + piece
            elif piece:
                specs.append(piece)
        return tuple(specs)


@dataclasses.dataclass
class SuiteResult:
    """One suite's outcome: its summary, or None with the reason: ``unavailable`` (it could not
    be built: a package or data missing) or ``error`` (it raised while it ran)."""

    spec: str
    name: str
    summary: dict | None
    unavailable: str | None = None
    error: str | None = None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(items: Sequence[Item], scores: Sequence[Sequence[Score]], settings: GenerationSettings) -> dict:
    """Mean score and solved rate over all samples, pass@k per item, the same per group."""

    def block(indices):
        values = [s.value for i in indices for s in scores[i]]
        solved = [s.solved for i in indices for s in scores[i]]
        out = {"items": len(indices), "score": _mean(values), "solved": _mean(solved)}
        for k in range(1, settings.samples + 1):
            out[f"pass@{k}"] = _mean([pass_at_k(len(scores[i]), sum(s.solved for s in scores[i]), k)
                                      for i in indices])
        rewards = [s.details["reward"] for i in indices for s in scores[i] if "reward" in s.details]
        if rewards:
            out["mean_reward"] = _mean(rewards)
        return out

    groups: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        groups.setdefault(item.group, []).append(index)
    summary = block(range(len(items)))
    if len(groups) > 1 or "" not in groups:
        summary["groups"] = {group: block(indices) for group, indices in sorted(groups.items())}
    return summary


def run_suite(policy, pool, suite: Suite, cfg: EvalConfig, agent_cfg: AgentConfig, out_dir: str | os.PathLike | None,
              *, progress: bool = True, spec: str | None = None, items: Sequence[Item] | None = None,
              guidance: Callable[[str], str | None] | None = None) -> SuiteResult:
    """Plays and scores every item of ``suite`` (``settings.samples`` times each); writes its files
    under ``out_dir`` (None: none, e.g. on the non-main processes of a multi-process run).
    ``items``: the suite's items when the caller has listed them already. ``guidance(program)``
    (procedure memory's preplay; the loop passes its seed library's graphs only, so held-out
    evaluation sees nothing a designed program wrote) goes into the first observation of the episodes of a suite
    that takes it (``suite.guided``: the environment suites; benchmarks stay as published);
    the summary's ``guided`` counts the episodes that got some.

    Reply budgets are fitted to the model (`bounded.reply_budgets`): a chat's reply gets at most
    the room its prompt leaves in ``max_position_embeddings`` (a prompt that leaves none is not
    sampled and scores 0 with the reason); an episode's context budget is at most the model's,
    and its per-turn budget less than that. The summary's ``reply_budget`` records the
    requested budget, the smallest used, and how many replies were clamped or had no room (an
    episode that ended for its context before its first reply); a clamped chat reply's details
    carry its ``max_new_tokens``."""
    started = time.perf_counter()
    settings = suite.settings
    # a policy that declares no context (a stand-in sampler) has its budgets as requested
    max_positions = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
    budget = BudgetRecord(settings.max_new_tokens, max_positions)
    items = list(suite.items(cfg.limit or None, cfg.seed) if items is None else items)
    context = Context(pool=pool, policy=policy, seed=cfg.seed)
    scores: list[list[Score]] = [[] for _ in items]
    outputs: list[list[Any]] = [[] for _ in items]
    chat = [i for i, item in enumerate(items) if item.messages is not None]
    guide = guidance if getattr(suite, "guided", False) else None
    guided = 0
    episodes = [i for i, item in enumerate(items) if item.program is not None]
    with progress_bar(len(items) * settings.samples, suite.name, unit="samples", enabled=progress) as bar:
        for sample in range(settings.samples):
            for start in range(0, len(chat), cfg.batch_size):
                batch = chat[start:start + cfg.batch_size]
                lengths = [len(policy.tokenizer.apply_chat_template(list(items[i].messages), add_generation_prompt=True))
                           for i in batch] if max_positions else [0] * len(batch)
                budgets = dict(zip(batch, reply_budgets(lengths, settings.max_new_tokens,
                                                        max_positions or settings.max_new_tokens)))
                budget.add(budgets.values())
                fits = [i for i in batch if budgets[i] > 0]
                completions = complete_chats(
                    policy, [items[i].messages for i in fits], max_new_tokens=settings.max_new_tokens,
                    temperature=settings.temperature, top_p=settings.top_p,
                    seed=derive_seed(cfg.seed, suite.name, sample, start), limits=[budgets[i] for i in fits],
                ) if fits else []
                replies = [completion.text for completion in completions]
                if hasattr(suite, "score_batch"):
                    batch_scores = suite.score_batch([items[i] for i in fits], replies, context) if fits else []
                else:
                    batch_scores = [suite.score(items[i], reply, context) for i, reply in zip(fits, replies)]
                for i, reply, score in zip(fits, replies, batch_scores):
                    if budgets[i] < settings.max_new_tokens:
                        score = dataclasses.replace(score, details=dict(score.details, max_new_tokens=budgets[i]))
                    scores[i].append(score)
                    outputs[i].append(reply)
                for i, length in zip(batch, lengths):
                    if budgets[i] < 1:
                        scores[i].append(Score(0.0, False, {"error": f"no room to reply: the prompt's {length} tokens "
                                                                     f"fill the model's {max_positions} positions"}))
                        outputs[i].append("")
                bar.update(len(batch))
            for turns in sorted({items[i].max_turns or cfg.default_turns for i in episodes}):
                group = [i for i in episodes if (items[i].max_turns or cfg.default_turns) == turns]
                context_budget = min(agent_cfg.context_budget, max_positions or agent_cfg.context_budget)
                per_turn = min(settings.max_new_tokens, context_budget - 1)
                episode_cfg = dataclasses.replace(agent_cfg, max_turns=turns, max_new_tokens=per_turn,
                                                  context_budget=context_budget,
                                                  temperature=settings.temperature, top_p=settings.top_p,
                                                  system_prompt=getattr(suite, "system_prompt", agent_cfg.system_prompt),
                                                  user_template=("{observation}" if hasattr(suite, "system_prompt")
                                                                 else agent_cfg.user_template),
                                                  every_play_counts=True)  # a benchmark drops nothing
                requests = [EpisodeRequest(env_key=i, program=items[i].program, seed=items[i].seed,
                                           guidance=guide(items[i].program) if guide else None) for i in group]
                guided += sum(r.guidance is not None for r in requests)
                episode_pool = suite.episode_pool(context) if hasattr(suite, "episode_pool") else pool
                trajectories = play_episodes(policy, episode_pool, requests, episode_cfg,
                                             seed=derive_seed(cfg.seed, suite.name, sample, turns), progress=bar.update,
                                             read_action=getattr(suite, "read_action", parse_action))
                budget.add(per_turn if not (t.end_reason == "context" and t.turns == 0) else 0 for t in trajectories)
                for i, trajectory in zip(group, trajectories):
                    scores[i].append(suite.score(items[i], trajectory, context))
                    outputs[i].append(trajectory.messages)
    summary = summarize(items, scores, settings)
    summary.update(suite=suite.name, spec=spec or suite.name, seed=cfg.seed, limit=cfg.limit,
                   notes=list(getattr(suite, "notes", ())),
                   settings=dataclasses.asdict(settings), reply_budget=budget.summary(),
                   wall_s=round(time.perf_counter() - started, 2))
    if guide:
        summary["guided"] = guided
    if out_dir is not None:
        _write(out_dir, suite.name, items, scores, outputs, summary)
    return SuiteResult(spec or suite.name, suite.name, summary)


class Evaluator:
    """The suites of ``cfg``, built and their items listed once, then played on demand: the main
    job evaluates many times, and listing items can cost (admitting an environment directory,
    generating a benchmark's items). A suite that cannot run says why once, in one line; the
    others still run."""

    def __init__(self, cfg: EvalConfig, generation: dict[str, GenerationSettings] | None = None):
        self.cfg = cfg
        self._suites: list[tuple[str, Suite | None, list[Item] | str]] = []
        for spec in cfg.specs:
            started = time.perf_counter()
            try:
                suite = make_suite(spec, (generation or {}).get(spec.partition(":")[0]), cfg)
                items = list(suite.items(cfg.limit or None, cfg.seed))
                self._suites.append((spec, suite, items))
                print(f"eval {spec}: {len(items)} items ({time.perf_counter() - started:.1f} s to list)", flush=True)
                if cfg.sampled_temperature > 0 and suite.settings.temperature == 0:
                    sampled = dataclasses.replace(
                        suite, name=f"{suite.name}-sampled",
                        settings=dataclasses.replace(suite.settings, temperature=cfg.sampled_temperature))
                    self._suites.append((f"{spec} (sampled)", sampled, items))
            except SuiteUnavailable as err:
                print(f"eval {spec}: skipped: {err}", flush=True)
                self._suites.append((spec, None, str(err)))

    def run(self, policy, pool, agent_cfg: AgentConfig, out_dir: str | os.PathLike | None, *,
            progress: bool = True, guidance: Callable[[str], str | None] | None = None) -> list[SuiteResult]:
        """Every suite in turn; one that raises while it runs is reported in one line (its
        ``SuiteResult.error``) and the others still run."""
        results = []
        for spec, suite, items in self._suites:
            if suite is None:
                results.append(SuiteResult(spec, _file_name(spec), None, unavailable=items))
                continue
            try:
                results.append(run_suite(policy, pool, suite, self.cfg, agent_cfg, out_dir, progress=progress,
                                         spec=spec, items=items, guidance=guidance))
            except Exception as err:  # noqa: BLE001 - one suite's failure must not stop the others
                reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                print(f"eval {spec}: failed: {reason}", flush=True)
                results.append(SuiteResult(spec, suite.name, None, error=reason))
        return results


def run_suites(policy, pool, cfg: EvalConfig, agent_cfg: AgentConfig, out_dir: str | os.PathLike | None,
               generation: dict[str, GenerationSettings] | None = None, *, progress: bool = True) -> list[SuiteResult]:
    """Every suite of ``cfg.suites`` once (`Evaluator` keeps them for evaluating again)."""
    return Evaluator(cfg, generation).run(policy, pool, agent_cfg, out_dir, progress=progress)


def table(results: Sequence[SuiteResult]) -> str:
    """One markdown table across suites; a suite whose reply budgets were cut to fit the model
    says so after its wall time."""
    lines = ["| suite | items | score | solved | pass@k | wall |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        if r.summary is None:
            why = f"failed: {r.error}" if r.error else f"skipped: {r.unavailable}"
            lines.append(f"| {r.spec} | - | - | - | - | {why} |")
            continue
        shown = r.spec if len(r.spec) <= 80 else r.name
        s = r.summary
        k = s["settings"]["samples"]
        lines.append(f"| {shown} | {s['items']} | {_fmt(s['score'])} | {_fmt(s['solved'])} | "
                     f"pass@{k} {_fmt(s[f'pass@{k}'])} | {s['wall_s']:.0f}s{_budget_note(s.get('reply_budget'))} |")
    return "\n".join(lines)


def metrics(results: Sequence[SuiteResult]) -> dict[str, float]:
    """Scalars for metrics.jsonl / TensorBoard: ``eval/<suite>/<score|solved|pass@k|group/...>``."""
    out = {}
    for r in results:
        if r.summary is None:
            continue
        for key, value in r.summary.items():
            if key in ("score", "solved", "mean_reward") or key.startswith("pass@"):
                out[f"eval/{r.name}/{key}"] = value
        for group, block in r.summary.get("groups", {}).items():
            out[f"eval/{r.name}/{group}/score"] = block["score"]
    return out


def _write(out_dir, name: str, items, scores, outputs, summary: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path + ".jsonl", "w", encoding="utf-8") as f:
        for item, item_scores, item_outputs in zip(items, scores, outputs):
            for sample, (score, output) in enumerate(zip(item_scores, item_outputs)):
                row = {"item_id": item.item_id, "group": item.group, "sample": sample, "score": score.value,
                       "solved": score.solved, "details": score.details, "output": output}
                f.write(json.dumps(jsonable(row, default=str)) + "\n")
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(jsonable(summary, default=str), f, indent=1)
    with open(path + ".md", "w", encoding="utf-8") as f:
        f.write(_markdown(summary))


def _markdown(summary: dict) -> str:
    lines = [f"# {summary['suite']}", "", f"spec `{summary['spec']}`, seed {summary['seed']}, settings "
             f"{summary['settings']}, {summary['wall_s']} s", "", "| group | items | score | solved |",
             "| --- | --- | --- | --- |", f"| all | {summary['items']} | {_fmt(summary['score'])} | {_fmt(summary['solved'])} |"]
    for group, block in summary.get("groups", {}).items():
        lines.append(f"| {group or '-'} | {block['items']} | {_fmt(block['score'])} | {_fmt(block['solved'])} |")
    return "\n".join(lines) + "\n"


def _budget_note(budget: dict | None) -> str:
    if not budget or not (budget["clamped"] or budget["no_room"]):
        return ""
    parts = []
    if budget["clamped"]:
        parts.append(f"{budget['clamped']} replies clamped to as few as {budget['used_min']} of {budget['requested']} tokens")
    if budget["no_room"]:
        parts.append(f"{budget['no_room']} without room")
    return f"; {', '.join(parts)} (model: {budget['max_positions']} positions)"


def _file_name(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", spec).strip("-")


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else math.nan


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"
