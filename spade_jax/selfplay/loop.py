"""The self-play iteration: the only module that knows the whole order of the flow.

    design (every `regeneration_period` iterations) -> admission -> hints
    -> K plain + K hinted episodes per pool environment (matched seeds)
    -> episode rewards, regret, designer rewards (when due), advantages
    -> one or more compiled updates over designer + agent tokens
    -> memory, environment log, held-out evaluation (every `eval.every` iterations),
       metrics, gallery, checkpoint

Every random choice is drawn from a seed derived from `(config.seed, iteration, phase)`,
so a resumed run repeats an uninterrupted one exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import time
from typing import Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from spade_jax.agent import matched_requests, play_episodes, write_hints
from spade_jax.agent.procedures import PROCEDURES_FILE, SEED, ProcedureMemory, abstract, provenance
from spade_jax.agent.rollout import RolloutStats
from spade_jax.designer.calibration import STAGE as CALIBRATION_STAGE
from spade_jax.designer.calibration import calibrate
from spade_jax.designer.corpus import Corpus
from spade_jax.designer.memory import EnvironmentMemory
from spade_jax.designer.review import rejection_reason, review
from spade_jax.designer.rollout import DesignSample, admit_samples, propose
from spade_jax.envs import library
from spade_jax.envs.contract import EPISODE_SEED_SPACE, is_success
from spade_jax.evals import runner as eval_runner
from spade_jax.rl.batch import TrainSequence, pack
from spade_jax.rl.train import Trainer
from spade_jax.sampling.chat import complete_chats
from spade_jax.sandbox import SandboxPool
from spade_jax.sandbox.admission import STAGES
from spade_jax.seeds import derive_seed
from spade_jax.selfplay import config as config_lib
from spade_jax.selfplay import scoring
from spade_jax.selfplay.checkpoint import Checkpointer
from spade_jax.selfplay.console import phase_bar, summary_line
from spade_jax.selfplay.distributed import ShardedPool, is_main_process
from spade_jax.selfplay.gallery import write_gallery
from spade_jax.selfplay.initial_policy import build_policy, mesh_from_config
from spade_jax.selfplay.runlog import EnvLog, EnvLogEntry, MetricsWriter
from spade_jax.selfplay.state import LoopState, PendingDesign, PoolEnv, design_env_id
from spade_jax.trajectories.export import rl_task, sft_record, write_jsonl
from spade_jax.trajectories.queries import escape_chats
from spade_jax.trajectories.schemas import NotToolUse, ProgramRejected
from spade_jax.trajectories.synth import EnvReport, read_program, summary_table, synthesize

_PHASES = {"design": 1, "hints": 2, "episodes": 3, "review": 4, "replay": 5, "admission": 6, "calibration": 7,
           "trajectories": 8}


class Preempted(Exception):
    """Raised between phases after SIGTERM; the run saves and exits cleanly."""


class SelfPlay:
    """One run: the policy, its trainer, the sandbox pool, memory, corpus and loop state."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, policy=None):
        self.config = config
        self.workdir = os.path.abspath(workdir)
        self.main = is_main_process()
        self.policy = policy or build_policy(config, self.workdir, mesh_from_config(config))
        if self.policy.tokenizer is None:
            raise ValueError("self-play needs a policy with a tokenizer")
        self.trainer = Trainer(self.policy, config_lib.optim_config(config), config_lib.loss_config(config))
        self.designer_cfg = config_lib.designer_config(config)
        self.admission_cfg = config_lib.admission_config(config)
        self.agent_cfg = config_lib.agent_config(config)
        self.hint_cfg = config_lib.hint_config(config)
        self.review_cfg = config_lib.review_config(config)
        self.reward_cfg = config_lib.reward_config(config)
        self.eval_cfg = config_lib.eval_config(config)
        self.eval_generation = config_lib.eval_generation(config)
        self.calibration_cfg = config_lib.calibration_config(config)
        self.synth_cfg = config_lib.synth_config(config)
        self.procedure_cfg = config_lib.procedure_config(config)
        self.procedures = ProcedureMemory(self.procedure_cfg) if self.procedure_cfg.enabled else None
        self.evaluator: eval_runner.Evaluator | None = None  # built at the first evaluation
        self.pool = ShardedPool(SandboxPool(config_lib.sandbox_config(config)))
        logging.info("sandbox isolation: %s", self.pool.isolation.to_dict())
        self.memory = config_lib.memory(config)
        if config.memory.seed_library:
            for seed_env in (e for e in library.SEED_ENVS if e.name not in config.memory.heldout):
                self.memory.add_seed(library.load_source(seed_env.name), seed_env.skill, name=seed_env.name)
        self.corpus = Corpus.from_config(config_lib.corpus_config(config)) if config.corpus.enabled else None
        self.state = LoopState()
        self.checkpointer = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), keep=config.checkpoint.keep, async_save=config.checkpoint.async_save
        )
        self._preempted = False
        self._saved_step: int | None = None

    # ---- run, resume, save ------------------------------------------------------------------

    def run(self, num_iterations: int | None = None) -> list[dict]:
        """Runs (or resumes) until `num_iterations`, or until the agent has generated
        `agent_token_budget` tokens when that is set; returns the metric history."""
        total = self.config.num_iterations if num_iterations is None else num_iterations
        resumed = self.restore()
        metrics_writer = None
        if self.main:
            metrics_writer = MetricsWriter(self.workdir, resume_from_iteration=self.state.iteration - 1 if resumed else None)
        env_log = EnvLog(self.workdir) if self.main else None
        if env_log and self.state.iteration:
            env_log.truncate_after(self.state.iteration - 1)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if _in_main_thread() else None
        try:
            while self.state.iteration < total and not self.budget_spent():
                snapshot = self._meta()
                try:
                    metrics, env_records = self.iteration(self.state.iteration)
                except Preempted:
                    self._save(self.state.iteration, snapshot)
                    self._announce_preemption()
                    break
                it = self.state.iteration
                self.state.history.append(metrics)
                self.state.iteration += 1
                if self.main:
                    metrics_writer.write(it, metrics)
                    env_log.append(env_records)
                    if self.config.log.gallery:
                        write_gallery(self.workdir)
                    print(summary_line(it, metrics), flush=True)
                if (self.state.iteration % self.config.checkpoint.every == 0 or self.state.iteration == total
                        or self.budget_spent()):
                    self._save(self.state.iteration)
                if self.main and self.budget_spent():
                    print(f"agent token budget reached: {self.agent_tokens()} of {self.config.agent_token_budget} "
                          f"tokens after {self.state.iteration} iterations", flush=True)
                if self._preempted:
                    self._save(self.state.iteration)
                    self._announce_preemption()
                    break
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.checkpointer.wait()
            if metrics_writer:
                metrics_writer.close()
        if jax.process_count() > 1:
            print(f"process {jax.process_index()} state digest {self.state_digest()}", flush=True)
        return self.state.history

    def agent_tokens(self) -> int:
        """Tokens the agent generated over the run so far (its plays, plain and hinted)."""
        return sum(int(m.get("agent/generated_tokens", 0)) for m in self.state.history)

    def budget_spent(self) -> bool:
        """Whether `agent_token_budget` (0: none) is used up: the run's equal-compute stop."""
        budget = self.config.agent_token_budget
        return bool(budget) and self.agent_tokens() >= budget

    def close(self) -> None:
        self.checkpointer.close()
        self.pool.close_all()

    def restore(self) -> bool:
        step = self.checkpointer.latest_step()
        if step is None:
            return False
        train, meta = self.checkpointer.restore(step, self.trainer.state_dict())
        self.trainer.load_state_dict(train)
        self._load_meta(meta)
        self._saved_step = step
        if self.main:
            print(f"resumed from checkpoint {step} in {self.workdir}", flush=True)
        return True

    def state_digest(self) -> str:
        """A hash of the host-side run state (metric history without timings, memory, corpus cursor).

        Every process of a multi-process run computes it from gathered results, so equal
        digests mean the processes agree.
        """
        history = [
            {k: v for k, v in m.items() if not (k.startswith("time/") or "per_s" in k or k.endswith("time_s"))}
            for m in self.state.history
        ]
        corpus = self.corpus.state() if self.corpus else None
        procedures = self.procedures.to_state() if self.procedures else None
        payload = json.dumps([history, self.memory.to_state(), corpus, procedures], sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def _meta(self) -> dict:
        return {
            "seed": self.config.seed,
            "loop": self.state.to_json(),
            "memory": self.memory.to_state(),
            "corpus": self.corpus.state() if self.corpus else None,
            "procedures": self.procedures.to_state() if self.procedures else None,
        }

    def _load_meta(self, meta: dict) -> None:
        if int(meta["seed"]) != self.config.seed:
            raise ValueError(
                f"the checkpoint in {self.workdir} was made with seed {meta['seed']}, the config says {self.config.seed}"
            )
        self.state = LoopState.from_json(meta["loop"])
        self.memory = EnvironmentMemory.from_state(meta["memory"])
        if self.corpus:
            self.corpus.restore(meta["corpus"])
        if self.procedures is not None:  # a checkpoint from before procedure memory (or without it) starts empty
            self.procedures = ProcedureMemory.from_state(self.procedure_cfg, meta.get("procedures") or {})

    def _save(self, step: int, meta: dict | None = None) -> None:
        if self._saved_step == step:
            return
        self.checkpointer.save(step, self.trainer.state_dict(), meta or self._meta())
        self._saved_step = step

    def _announce_preemption(self) -> None:
        if self.main:
            print(f"SIGTERM: saved the state before iteration {self.state.iteration}; exiting", flush=True)

    def _on_sigterm(self, signum, frame) -> None:
        self._preempted = True

    def _checkpoint_phase(self) -> None:
        """Before the update, a SIGTERM abandons the iteration (its state is the last one)."""
        if self._preempted:
            raise Preempted()

    # ---- one iteration ----------------------------------------------------------------------

    def iteration(self, it: int) -> tuple[dict, list[EnvLogEntry]]:
        cfg = self.config
        times: dict[str, float] = {}
        metrics: dict[str, float] = {}
        designs: list[DesignSample] = []
        tic = time.perf_counter()

        if cfg.designer.enabled and it % cfg.designer.regeneration_period == 0:
            designs = self._design(it, metrics, times)
        self._checkpoint_phase()

        replays = self._replays(it)
        envs = self.state.pool + replays
        start = time.perf_counter()
        self._write_missing_hints(envs, it)
        times["hints_s"] = time.perf_counter() - start
        self._checkpoint_phase()

        start = time.perf_counter()
        play_stats = RolloutStats()
        trajectories = self._play(envs, it, play_stats)
        times["episodes_s"] = time.perf_counter() - start
        # Timing counters (time/*: not reproduced by a resume): compilation, device use, programs built.
        times["episodes_compile_s"] = play_stats.engine.compile_s
        times["episodes_device_busy"] = play_stats.device_busy_fraction
        times["episodes_programs_compiled"] = sum(play_stats.engine.compiled.values())
        self._checkpoint_phase()
        review_rejected: dict[str, str] = {}
        if cfg.designer.self_review:
            start = time.perf_counter()
            trajectories, review_rejected = self._self_review(envs, trajectories, it, metrics)
            times["review_s"] = time.perf_counter() - start

        stats, agent_sequences, designer = self._score(it, envs, trajectories, metrics)
        if self.procedures is not None:
            self._learn_procedures(envs, trajectories, metrics)

        start = time.perf_counter()
        train_metrics = self._update(agent_sequences + (designer.sequences if cfg.designer.train else []))
        times["update_s"] = time.perf_counter() - start
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})

        env_log = self._remember(it, envs, stats, designer.by_env_id, designs, trajectories, review_rejected)
        if it % cfg.designer.regeneration_period == cfg.designer.regeneration_period - 1:
            self.state.pool = []
        metrics["memory/size"] = len(self.memory)
        metrics["memory/retired"] = sum(r.retired for r in self.memory.records())
        if cfg.trajectories.every and (it + 1) % cfg.trajectories.every == 0:
            start = time.perf_counter()
            metrics.update(self._synthesize_trajectories(it))
            times["trajectories_s"] = time.perf_counter() - start
        metrics["agent/generated_tokens"] = sum(int(t.loss_mask.sum()) for t in trajectories)
        # The iteration that spends the token budget ends the run, so it is evaluated too.
        budget = cfg.agent_token_budget
        last = bool(budget) and self.agent_tokens() + metrics["agent/generated_tokens"] >= budget
        if self.eval_cfg.every and self.eval_cfg.specs and ((it + 1) % self.eval_cfg.every == 0 or last):
            start = time.perf_counter()
            metrics.update(self._evaluate(it + 1))
            times["eval_s"] = time.perf_counter() - start
        generated = metrics["agent/generated_tokens"] + sum(len(d.tokens) for d in designs)
        sampling_time = times.get("design_s", 0.0) + times["hints_s"] + times["episodes_s"]
        metrics["sampler/tokens_per_s"] = generated / sampling_time if sampling_time else math.nan
        times["iteration_s"] = time.perf_counter() - tic
        metrics.update({f"time/{k}": v for k, v in times.items()})
        return metrics, env_log

    def _design(self, it: int, metrics: dict, times: dict) -> list[DesignSample]:
        cfg = self.config
        start = time.perf_counter()
        with phase_bar("design", 2, enabled=cfg.log.progress and self.main) as bar:
            designs = propose(
                self.policy, self.memory if cfg.memory.enabled else None, self.corpus, self.designer_cfg,
                seed=derive_seed(cfg.seed, it, _PHASES["design"]),
            )
            bar.update(1)
            times["design_s"] = time.perf_counter() - start
            designs = admit_samples(
                designs, self.pool, self.memory if cfg.memory.enabled else None, self.admission_cfg,
                seed=derive_seed(cfg.seed, it, _PHASES["admission"]),
            )
            bar.update(1)
        times["admission_s"] = time.perf_counter() - start - times["design_s"]
        if self.calibration_cfg.enabled:
            self._calibrate(designs, it, metrics, times)
        self.state.pool = []
        for d in designs:
            env_id = design_env_id(it, d.slot) if d.admitted else None
            if env_id:
                level = (d.report.details.get("calibration") or {}).get("level")
                self.state.pool.append(
                    PoolEnv(env_id, d.report.code, d.skill, d.doc_id, design_iteration=it, difficulty=level)
                )
            self.state.pending.append(
                PendingDesign(
                    design_iteration=it,
                    due_iteration=it + cfg.designer.reward_delay - 1,
                    slot=d.slot,
                    skill=d.skill,
                    difficulty=d.difficulty,
                    doc_id=d.doc_id,
                    env_id=env_id,
                    stage=d.report.stage,
                    reason=d.report.reason,
                    prompt_tokens=[int(x) for x in d.prompt_tokens],
                    tokens=[int(x) for x in d.tokens],
                    logprobs=[float(x) for x in d.logprobs],
                )
            )
        metrics["designer/proposed"] = len(designs)
        metrics["designer/admitted"] = sum(d.admitted for d in designs)
        metrics["designer/admission_rate"] = metrics["designer/admitted"] / max(len(designs), 1)
        for stage in STAGES + ((CALIBRATION_STAGE,) if self.calibration_cfg.enabled else ()):
            metrics[f"designer/rejected/{stage}"] = sum(not d.admitted and d.report.stage == stage for d in designs)
        return designs

    def _calibrate(self, designs: Sequence[DesignSample], it: int, metrics: dict, times: dict) -> None:
        """Calibrates the admitted designs against the current agent (`config.calibration`): each
        report gets the result in ``details["calibration"]``; a program with no level in band becomes
        rejected at stage "calibration" (its designer sample then earns the failure penalty)."""
        start = time.perf_counter()
        admitted = [d for d in designs if d.admitted]
        with phase_bar("calibration", 1, enabled=self.config.log.progress and self.main) as bar:
            results = calibrate(self.policy, self.pool, [d.report.code for d in admitted], self.agent_cfg,
                                self.calibration_cfg, seed=derive_seed(self.config.seed, it, _PHASES["calibration"]))
            bar.update(1)
        for d, result in zip(admitted, results):
            d.report.details["calibration"] = result.to_dict()
            if not result.admitted:
                d.report.admitted, d.report.stage, d.report.reason = False, CALIBRATION_STAGE, result.reason
        times["calibration_s"] = time.perf_counter() - start
        metrics["calibration/episodes"] = sum(r.episodes for r in results)
        gaps = [g for r in results for g in r.gaps]
        rates = [a for r in results for a in r.agent_rates]
        metrics["calibration/solve_verify_gap_mean"] = float(np.mean(gaps)) if gaps else math.nan
        metrics["calibration/agent_solve_rate_mean"] = float(np.mean(rates)) if rates else math.nan

    def _replays(self, it: int) -> list[PoolEnv]:
        """Environments replayed from memory this iteration (not already in the pool, not retired),
        each at the difficulty level calibration chose for it."""
        n = self.config.agent.replay_envs
        in_pool = {e.env_id for e in self.state.pool}
        candidates = [r for r in self.memory.records() if r.env_id not in in_pool and not r.retired]
        if not n or not candidates:
            return []
        rng = np.random.default_rng(derive_seed(self.config.seed, it, _PHASES["replay"]))
        chosen = rng.choice(len(candidates), size=min(n, len(candidates)), replace=False)
        return [
            PoolEnv(r.env_id, r.code, r.skill, r.doc_id, design_iteration=r.iteration_added, is_replay=True,
                    difficulty=r.level)
            for r in (candidates[i] for i in sorted(chosen))
        ]

    def _write_missing_hints(self, envs: Sequence[PoolEnv], it: int) -> None:
        """Environments without a hint get one (`write_hints` samples only in mode "self")."""
        missing = [e for e in envs if e.hint is None]
        hints = write_hints(
            self.policy, [e.code for e in missing], self.hint_cfg, seed=derive_seed(self.config.seed, it, _PHASES["hints"])
        )
        for env, hint in zip(missing, hints):
            env.hint = hint

    def _play(self, envs: Sequence[PoolEnv], it: int, stats: RolloutStats):
        k = self.config.agent.episodes_per_env
        requests = []
        for e_index, env in enumerate(envs):
            seeds = [derive_seed(self.config.seed, it, e_index, j) % EPISODE_SEED_SPACE for j in range(k)]
            env_kwargs = {"difficulty": env.difficulty} if env.difficulty is not None else {}
            guidance = self._guidance(env)
            requests += [
                dataclasses.replace(r, env_kwargs=env_kwargs, guidance=guidance)
                for r in matched_requests(e_index, env.code, seeds, self.hint_cfg.mode, env.hint,
                                          self.hint_cfg.placebo_of)
            ]
        if not requests:
            return []
        with phase_bar("episodes", len(requests), enabled=self.config.log.progress and self.main) as bar:
            return play_episodes(
                self.policy,
                self.pool,
                requests,
                self.agent_cfg,
                seed=derive_seed(self.config.seed, it, _PHASES["episodes"]),
                progress=bar.update,
                stats=stats,
            )

    def _guidance(self, env: PoolEnv) -> str | None:
        """Procedure memory's preplay text for `env` (None without procedure memory): a seed
        program's from the seed library's graphs only, so that no text a designed program wrote
        reaches them through the agent following it; any other program's from every graph."""
        if self.procedures is None:
            return None
        seed = provenance(env.code, tuple(self.config.memory.heldout)) == SEED
        return self.procedures.guidance(self.procedures.key(env.code, env.skill), seed_library=seed)

    def _program_guidance(self, program: str) -> str | None:
        """The preplay text for a held-out program (its skill read from its docstring, or its
        family), from the seed library's graphs only: held-out evaluation sees nothing designed."""
        return self.procedures.guidance(self.procedures.key(program), seed_library=True)

    def _learn_procedures(self, envs: Sequence[PoolEnv], trajectories, metrics: dict) -> None:
        """Counts this iteration's plain episodes into procedure memory and writes its summary
        (`procedures.json`, for the gallery). Hinted plays are left out: they follow a privileged
        hint, and their procedures would overstate what the agent does alone. A program that claims
        a held-out family is not learned from (``procedures/heldout_claims`` counts its plain plays);
        a seed program's plays count into the seed library's graphs as well (`agent/procedures.py`)."""
        heldout = tuple(self.config.memory.heldout)
        claims = 0
        for t in trajectories:
            env = envs[t.request.env_key]
            key = self.procedures.key(env.code, env.skill)
            if t.hinted or key is None or not t.turns:
                continue
            source = provenance(env.code, heldout)
            if source is None:
                claims += 1
            else:
                self.procedures.update(key, abstract(t.messages, t.won, t.end_reason), t.won,
                                       seed_library=source == SEED)
        metrics["procedures/heldout_claims"] = claims
        metrics["procedures/keys"] = len(self.procedures.keys())
        metrics["procedures/transitions"] = self.procedures.num_transitions
        metrics["procedures/guided_episodes"] = sum(t.request.guidance is not None for t in trajectories)
        if self.main:
            path = os.path.join(self.workdir, PROCEDURES_FILE)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(self.procedures.summary(), f, indent=1, sort_keys=True)
            os.replace(path + ".tmp", path)

    def _self_review(self, envs, trajectories, it: int, metrics: dict):
        """The policy judges each environment designed this iteration from its source and one
        plain episode; rejected ones leave the pool, their episodes are dropped and their
        designer samples get the failure penalty."""
        new = [i for i, e in enumerate(envs) if not e.is_replay and e.design_iteration == it]
        samples = {}
        for t in trajectories:
            if t.request.env_key in new and not t.hinted:
                samples.setdefault(t.request.env_key, t)
        judged = [i for i in new if i in samples]
        verdicts = review(
            self.policy,
            [envs[i].code for i in judged],
            [samples[i].messages for i in judged],
            self.review_cfg,
            seed=derive_seed(self.config.seed, it, _PHASES["review"]),
        )
        rejected = {envs[i].env_id: reply for i, (kept, reply) in zip(judged, verdicts) if not kept}
        metrics["designer/review_rejected"] = len(rejected)
        if not rejected:
            return trajectories, rejected
        self.state.pool = [e for e in self.state.pool if e.env_id not in rejected]
        for p in self.state.pending:
            if p.env_id in rejected:
                p.stage, p.reason = "self_review", rejection_reason(rejected[p.env_id])
                p.env_id = None
        dropped = {i for i, e in enumerate(envs) if e.env_id in rejected}
        return [t for t in trajectories if t.request.env_key not in dropped], rejected

    def _score(self, it: int, envs: Sequence[PoolEnv], trajectories, metrics: dict):
        """Records the plays in the pool, then scores them (`scoring`): each environment's
        statistics, the agent's sequences, and the designer samples now due."""
        cfg = self.config
        for t in trajectories:
            env = envs[t.request.env_key]
            (env.hinted if t.hinted else env.plain).append((t.request.seed, t.reward, it))
        stats = scoring.env_statistics(envs)
        metrics.update(scoring.agent_metrics(trajectories, stats, envs))
        agent_sequences = scoring.agent_sequences(
            trajectories, stats, train_hinted=cfg.agent.train_hinted, regret_weighting=cfg.agent.regret_weighting,
            regret_temperature=cfg.agent.regret_temperature, weight=cfg.rl.agent_weight,
        )
        due = [p for p in self.state.pending if p.due_iteration <= it]
        self.state.pending = [p for p in self.state.pending if p.due_iteration > it]
        designed_stats = {e.env_id: s for e, s in zip(envs, stats) if s is not None and not e.is_replay}
        designer = scoring.designer_scores(
            due, designed_stats, self.reward_cfg, weight=cfg.rl.designer_weight,
            n_agent_sequences=len(agent_sequences), regeneration_period=cfg.designer.regeneration_period,
            skill_averages=self.state.skill_averages,
        )
        self.state.skill_averages = designer.skill_averages
        if due:
            metrics["designer/reward_mean"] = float(np.mean(designer.rewards))
            metrics["designer/reward_scale"] = designer.scale
            metrics["designer/nonzero_advantage"] = sum(abs(s.advantage) > 1e-12 for s in designer.sequences)
        return stats, agent_sequences, designer

    def _synthesize_trajectories(self, it: int) -> dict[str, float]:
        """Tool-use trajectories (`spade_jax.trajectories`) from the newest `trajectories.max_envs`
        tool-use environments of memory, written by the policy after `it + 1` updates: SFT chat
        records, RL tasks and the per-environment table in `trajectories/<it + 1>/`. A tool-use
        program that synthesis cannot use is skipped with its reason (a row of the table, counted
        in `trajectories/rejected`); no program's failure stops synthesis or the run."""
        seed = derive_seed(self.config.seed, it, _PHASES["trajectories"])
        cfg = dataclasses.replace(self.synth_cfg, seed=seed)
        programs, rejected = [], []
        for record in sorted(self.memory.records(), key=lambda r: r.iteration_added, reverse=True):
            try:
                read_program(record.code)
            except NotToolUse:
                continue
            except ProgramRejected as err:
                rejected.append(EnvReport(record.env_id, error=str(err)))
                continue
            programs.append((record.env_id, record.code))
            if len(programs) == self.config.trajectories.max_envs:
                break
        agent = dataclasses.replace(self.agent_cfg, temperature=0.0,
                                    max_turns=max(self.agent_cfg.max_turns, cfg.chain.max_calls + 2))

        def complete(chats):
            return [c.text for c in complete_chats(self.policy, escape_chats(self.policy.tokenizer, chats),
                                                   max_new_tokens=cfg.query.max_new_tokens,
                                                   temperature=cfg.query.temperature, seed=seed)]

        def play(requests):
            return play_episodes(self.policy, self.pool, requests, agent, seed=seed)

        examples, reports = synthesize(self.pool, programs, complete, play, cfg,
                                       progress=self.config.log.progress and self.main)
        if self.main:
            out_dir = os.path.join(self.workdir, "trajectories", str(it + 1))
            os.makedirs(out_dir, exist_ok=True)
            write_jsonl(os.path.join(out_dir, "sft.jsonl"), (sft_record(e) for e in examples))
            write_jsonl(os.path.join(out_dir, "rl.jsonl"), (rl_task(e) for e in examples))
            with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
                f.write(summary_table(rejected + reports) + "\n")
        chains = sum(r.chains for r in reports)
        return {"trajectories/envs": len(programs), "trajectories/chains": chains,
                "trajectories/kept": len(examples),
                "trajectories/acceptance": len(examples) / chains if chains else math.nan,
                "trajectories/by_agent": sum(r.by_agent for r in reports),
                "trajectories/rejected": len(rejected) + sum(r.error is not None for r in reports)}

    def _evaluate(self, step: int) -> dict[str, float]:
        """The held-out suites on the policy after `step` updates; files in `evals/<step>/`."""
        out_dir = os.path.join(self.workdir, "evals", str(step)) if self.main else None
        if self.evaluator is None:
            self.evaluator = eval_runner.Evaluator(self.eval_cfg, self.eval_generation)
        results = self.evaluator.run(self.policy, self.pool, self.agent_cfg, out_dir,
                                     progress=self.config.log.progress and self.main,
                                     guidance=self._program_guidance if self.procedures else None)
        if self.main:
            print(eval_runner.table(results), flush=True)
        return eval_runner.metrics(results)

    def _update(self, sequences: list[TrainSequence]) -> dict[str, float]:
        if not sequences:
            return {}
        rl = self.config.rl
        row_multiple = math.lcm(self.trainer.data_parallel, rl.micro_batch_rows or 1)
        batch = pack(sequences, rl.row_length, row_multiple=row_multiple)
        old = self.trainer.logprobs(batch) if rl.updates_per_iteration > 1 else None
        with phase_bar("update", rl.updates_per_iteration, enabled=self.config.log.progress and self.main) as bar:
            for _ in range(rl.updates_per_iteration):
                metrics = self.trainer.update(batch, old)
                bar.update(1)
        metrics["sequences"] = batch.num_sequences
        metrics["truncated_sequences"] = batch.truncated_sequences
        if batch.truncated_sequences:
            logging.warning(
                "%d sequences were longer than rl.row_length=%d and were cut; raise rl.row_length",
                batch.truncated_sequences,
                rl.row_length,
            )
        return metrics

    def _remember(self, it, envs, stats, designer_rewards, designs, trajectories,
                  review_rejected) -> list[EnvLogEntry]:
        """Adds or updates memory records and returns this iteration's environment log entries."""
        entries: dict[str | None, EnvLogEntry] = {}
        played = []
        sample_of = {}
        for t in trajectories:
            sample_of.setdefault((t.request.env_key, t.hinted), t)
        for e_index, (env, s) in enumerate(zip(envs, stats)):
            if s is None:
                continue
            values = dict(win_rate=s.win_rate, mean_plain=s.mean_plain, mean_hinted=s.mean_hinted, regret=s.regret)
            reward = designer_rewards.get(env.env_id)
            wins = [is_success(r) for _, r, played in env.plain if played == it]
            if env.env_id in self.memory:
                self.memory.update(env.env_id, iteration=it, designer_reward=reward, plain_wins=wins, **values)
            elif not env.is_replay:
                self.memory.add(env.code, env.skill, iteration=it, doc_id=env.doc_id, designer_reward=reward,
                                env_id=env.env_id, level=env.difficulty, plain_wins=wins, **values)
            plain_t, hinted_t = sample_of.get((e_index, False)), sample_of.get((e_index, True))
            entry = EnvLogEntry(
                iteration=it, env_id=env.env_id, skill=env.skill, doc_id=env.doc_id, code=env.code, admitted=True,
                is_seed=env.env_id.startswith("seed-"), replay=env.is_replay, hinted_win_rate=s.hinted_win_rate,
                designer_reward=reward, transcript=plain_t.messages if plain_t else None,
                hinted_transcript=hinted_t.messages if hinted_t else None, hint=env.hint, level=env.difficulty,
                **values,
            )
            played.append(entry)
            entries.setdefault(env.env_id, entry)
        if self.calibration_cfg.retire_win_rate > 0:
            for env_id in self.memory.retire_mastered(it, self.calibration_cfg.retire_win_rate,
                                                      self.calibration_cfg.retire_plays):
                if env_id in entries:
                    entries[env_id].retired = self.memory.get(env_id).retired_reason
        designed = []
        for d in designs:
            env_id = design_env_id(it, d.slot) if d.admitted else None
            stage, reason = d.report.stage, d.report.reason
            if env_id in review_rejected:
                stage, reason = "self_review", rejection_reason(review_rejected[env_id])
            design = dict(slot=d.slot, difficulty=d.difficulty, doc_excerpt=d.doc_excerpt, stage=stage, reason=reason,
                          timings=d.report.timings, calibration=d.report.details.get("calibration"))
            entry = entries.get(env_id) if env_id else None
            if entry is not None:
                for field, value in design.items():
                    setattr(entry, field, value)
            else:
                designed.append(EnvLogEntry(
                    iteration=it, env_id=env_id, skill=d.skill, doc_id=d.doc_id, code=d.report.code or d.text,
                    admitted=d.admitted and env_id not in review_rejected, **design,
                ))
        return played + designed


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    """Builds a run in `workdir` (resuming it if it has checkpoints) and runs it to completion."""
    selfplay = SelfPlay(config, workdir)
    try:
        return selfplay.run()
    finally:
        selfplay.close()
        jax.effects_barrier()
