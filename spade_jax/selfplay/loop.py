"""The self-play iteration: the only module that knows the whole order of the flow.

    design (every `regeneration_period` iterations) -> admission, then the admission stages
    of the side systems (calibration) -> hints -> K plain episodes per pool and replayed
    environment, K hinted ones per new design, guided by the agent components (procedure memory)
    -> self-review (optional) -> episode rewards, regret, designer rewards when due,
    advantages -> the agent components observe the episodes -> one or more compiled updates
    over designer + agent tokens -> memory and the environment log -> periodic jobs
    (trajectory synthesis, held-out evaluation)

Side systems are components (`selfplay/components/`), the run's life around its iterations
(resume, checkpoints, SIGTERM, budget) is `selfplay/lifecycle.py`. Every random choice is drawn
from a seed derived from `(config.seed, iteration, phase)`, so a resumed run repeats an
uninterrupted one exactly.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from spade_jax.admission import STAGES
from spade_jax.agent import matched_requests, play_episodes, write_hints
from spade_jax.agent.rollout import RolloutStats
from spade_jax.agent.scripted import play_scripted
from spade_jax.designer.corpus import Corpus
from spade_jax.designer.memory import EnvironmentMemory, regeneration_statistics
from spade_jax.designer.review import rejection_reason, review
from spade_jax.designer.rollout import (DesignSample, admit_samples, assign_slots, design_metrics,
                                        design_with_retries, propose)
from spade_jax.envs import library
from spade_jax.envs.contract import EPISODE_SEED_SPACE, is_success
from spade_jax.rl.batch import TrainSequence, pack
from spade_jax.rl.train import Trainer
from spade_jax.sandbox import SandboxPool
from spade_jax.seeds import derive_seed
from spade_jax.selfplay import components as components_lib
from spade_jax.selfplay import config as config_lib
from spade_jax.selfplay import scoring
from spade_jax.selfplay.chrono import Chrono, itstime
from spade_jax.selfplay.console import phase_bar
from spade_jax.selfplay.distributed import ShardedPool, is_main_process
from spade_jax.selfplay.initial_policy import build_policy, mesh_from_config
from spade_jax.selfplay.lifecycle import Lifecycle
from spade_jax.selfplay.runlog import EnvLogEntry
from spade_jax.selfplay.state import LoopState, PendingDesign, PoolEnv, design_env_id


class SelfPlay:
    """One run: the policy, its trainer, the sandbox pool, memory, corpus, side systems and loop state."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str, *, policy=None, registry=None):
        self.config = config
        self.main = is_main_process()
        self.policy = policy or build_policy(config, workdir, mesh_from_config(config))
        if self.policy.tokenizer is None:
            raise ValueError("self-play needs a policy with a tokenizer")
        self.trainer = Trainer(self.policy, config_lib.optim_config(config), config_lib.loss_config(config),
                               sampling_dtype=config.model.sampling_dtype)
        self.sampler = self.trainer.sampling_policy  # what every stage samples with, refreshed by each update
        self.designer_cfg = config_lib.designer_config(config)
        self.admission_cfg = config_lib.admission_config(config)
        self.agent_cfg = config_lib.agent_config(config)
        self.hint_cfg = config_lib.hint_config(config)
        self.review_cfg = config_lib.review_config(config)
        self.reward_cfg = config_lib.reward_config(config)
        self.rotation_cfg = config_lib.rotation_config(config)
        self.pool = ShardedPool(SandboxPool(config_lib.sandbox_config(config)))
        logging.info("sandbox isolation: %s", self.pool.isolation.to_dict())
        self.memory = config_lib.memory(config)
        if config.memory.seed_library:
            for seed_env in (e for e in library.SEED_ENVS if e.name not in config.memory.heldout):
                self.memory.add_seed(library.load_source(seed_env.name), seed_env.skill, name=seed_env.name)
        self.corpus = Corpus.from_config(config_lib.corpus_config(config)) if config.corpus.enabled else None
        self.state = LoopState()
        self.lifecycle = Lifecycle(self, config, workdir, self.main)
        self.context = components_lib.Context(config, self.lifecycle.workdir, self.sampler, self.pool, self.agent_cfg,
                                              self.main, memory_records=lambda: self.memory.records(),
                                              eval_cfg=config_lib.eval_config(config),
                                              eval_generation=config_lib.eval_generation(config))
        self.components = components_lib.build(self.context, registry or components_lib.REGISTRY)

    def run(self, num_iterations: int | None = None) -> list[dict]:
        """Runs (or resumes) to `num_iterations` (default `config.num_iterations`) or the agent-token
        budget; returns the metric history."""
        return self.lifecycle.run_to_end(self.config.num_iterations if num_iterations is None else num_iterations)

    def close(self) -> None:
        self.lifecycle.close()
        self.pool.close_all()

    def saved(self) -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
        """Every stateful piece of the host-side run by checkpoint key: how to read it, how to put it back."""
        pieces = {
            "loop": (lambda: self.state.to_json(), lambda s: setattr(self, "state", LoopState.from_json(s))),
            "memory": (lambda: self.memory.to_state(),
                       lambda s: setattr(self, "memory", EnvironmentMemory.from_state(s))),
            "corpus": (lambda: self.corpus.state() if self.corpus else None,
                       lambda s: self.corpus.restore(s) if self.corpus else None),
        }
        for c in self.components.stateful():
            pieces[c.state_key] = (c.to_state, c.load_state)
        return pieces

    # ---- one iteration ----------------------------------------------------------------------

    def iteration(self, it: int) -> tuple[dict, list[EnvLogEntry]]:
        """One pass of the flow (module docstring); its metrics and environment log entries."""
        cfg, chrono, metrics = self.config, Chrono(), {}
        designs = []
        if cfg.designer.enabled and itstime(it, cfg.designer.regeneration_period):
            designs = self._design(it, metrics, chrono)
        self.lifecycle.check_preempted()
        envs = self.state.pool + self._replays(it)
        with chrono("hints"):
            self._write_missing_hints(envs, it)
        self.lifecycle.check_preempted()
        with chrono("episodes"):
            episodes = self._play(envs, it, chrono)
        self.lifecycle.check_preempted()
        review_rejected: dict[str, str] = {}
        if cfg.designer.self_review:
            with chrono("review"):
                episodes, review_rejected = self._self_review(envs, episodes, it, metrics)
        metrics["agent/generated_tokens"] = sum(int(t.loss_mask.sum()) for t in episodes)
        last = self.lifecycle.is_last(it, metrics["agent/generated_tokens"])
        stats, agent_sequences, designer, episodes = self._score(it, envs, episodes, metrics, last=last)
        for component in self.components.agent:
            metrics.update(component.observe(envs, episodes))
        with chrono("update"):
            train_metrics = self._update(agent_sequences + designer.sequences)
        metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
        env_log = self._remember(it, envs, stats, designer.by_env_id, designs, episodes, review_rejected, metrics)
        if itstime(it + 1, cfg.designer.regeneration_period):
            self._hold_pool()
        spent = self.lifecycle.budget_spent(metrics["agent/generated_tokens"])  # the run's last iteration
        for job in self.components.jobs:
            if itstime(it + 1, job.every, last=spent and job.at_budget_end):
                with chrono(job.name):
                    metrics.update(job.run(it + 1))
        generated = metrics["agent/generated_tokens"] + sum(len(d.tokens) for d in designs)
        sampling_s = chrono.seconds("design", "hints", "episodes")
        metrics["sampler/tokens_per_s"] = generated / sampling_s if sampling_s else math.nan
        metrics.update(chrono.metrics())
        return metrics, env_log

    def _design(self, it: int, metrics: dict, chrono: Chrono) -> list[DesignSample]:
        """New designs, admitted by the sandbox's stages and then the side systems'; a slot whose
        program failed is designed again from a fresh prompt, up to `designer.max_attempts`
        attempts (the reference's generation retries). The pool becomes the admitted ones and
        every attempt waits for its reward (a failed one is dropped from the designer's update
        under the reference's rule). Returns every attempt."""
        cfg, dcfg = self.config, self.designer_cfg
        memory = self.memory if cfg.memory.enabled else None
        stage_metrics: list[dict] = []

        def attempt(slots, k, earlier):
            with chrono("design"):
                batch = propose(self.sampler, memory, self.corpus, dcfg, slots=slots, attempt=k,
                                seed=self.context.seed(it, "design", k))
            with chrono("admission"):
                batch = admit_samples(batch, self.pool, memory, self.admission_cfg,
                                      seed=self.context.seed(it, "admission", k), earlier=earlier)
            for stage in self.components.admission:
                with chrono(stage.name):
                    stage_metrics.append(stage(batch, it))
            bar.update(1)
            return batch

        slots = dict(enumerate(assign_slots(dcfg, np.random.default_rng(self.context.seed(it, "design")))))
        with phase_bar("design", dcfg.max_attempts, enabled=self.context.progress) as bar:
            designs = design_with_retries(slots, dcfg.max_attempts, attempt)
        metrics.update(components_lib.merge_metrics(stage_metrics))
        self._hold_pool()
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
                    due_iteration=it + cfg.designer.reward_delay,
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
                    attempt=d.attempt,
                )
            )
        metrics.update(design_metrics(designs, dcfg.num_slots,
                                      STAGES + tuple(s.name for s in self.components.admission)))
        return designs

    def _replays(self, it: int) -> list[PoolEnv]:
        """Environments replayed from memory this iteration (not already in the pool, not retired),
        each at the difficulty level calibration chose for it."""
        n = self.config.agent.replay_envs
        in_pool = {e.env_id for e in self.state.pool}
        candidates = [r for r in self.memory.records() if r.env_id not in in_pool and not r.retired]
        if not n or not candidates:
            return []
        rng = np.random.default_rng(self.context.seed(it, "replay"))
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
            self.sampler, [e.code for e in missing], self.hint_cfg, seed=self.context.seed(it, "hints")
        )
        for env, hint in zip(missing, hints):
            env.hint = hint

    def _play(self, envs: Sequence[PoolEnv], it: int, chrono: Chrono):
        """`agent.episodes_per_env` plain episodes of every environment and, for a new design in its
        first iteration (the reference's regeneration step), `agent.hinted_episodes_per_env` hinted
        ones on seeds of their own; the rollout engine's compilation and device use go to
        `time/episodes_*`."""
        k, k_hinted = self.config.agent.episodes_per_env, self.config.agent.hinted_episodes_per_env
        requests = []
        for e_index, env in enumerate(envs):
            seeds = [derive_seed(self.config.seed, it, e_index, j) % EPISODE_SEED_SPACE for j in range(k)]
            hinted_seeds = [derive_seed(self.config.seed, it, e_index, "hinted", j) % EPISODE_SEED_SPACE
                            for j in range(k_hinted)]
            env_kwargs = {"difficulty": env.difficulty} if env.difficulty is not None else {}
            guidance = self.components.guidance(env)
            mode = self.hint_cfg.mode if not env.is_replay and env.design_iteration == it else "none"
            requests += [
                dataclasses.replace(r, env_kwargs=env_kwargs, guidance=guidance)
                for r in matched_requests(e_index, env.code, seeds, mode, env.hint, self.hint_cfg.placebo_of,
                                          hinted_seeds)
            ]
        stats = RolloutStats()
        episodes = []
        if requests and self.config.agent.player == "scripted":
            return play_scripted(self.pool, requests, self.agent_cfg, config_lib.scripted_config(self.config),
                                 seed=self.context.seed(it, "episodes"))
        if requests:
            with phase_bar("episodes", len(requests), enabled=self.context.progress) as bar:
                episodes = play_episodes(self.sampler, self.pool, requests, self.agent_cfg,
                                         seed=self.context.seed(it, "episodes"), progress=bar.update, stats=stats)
        chrono.record("episodes_compile_s", stats.engine.compile_s)
        chrono.record("episodes_device_busy", stats.device_busy_fraction)
        chrono.record("episodes_programs_compiled", sum(stats.engine.compiled.values()))
        return episodes

    def _hold_pool(self) -> None:
        """The pool ends: its environments whose designs still wait for their reward are held
        (with their plays) until it falls due."""
        waiting = {p.env_id for p in self.state.pending if p.env_id}
        self.state.held += [e for e in self.state.pool if e.env_id in waiting]
        self.state.pool = []

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
            self.sampler,
            [envs[i].code for i in judged],
            [samples[i].messages for i in judged],
            self.review_cfg,
            seed=self.context.seed(it, "review"),
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

    def _score(self, it: int, envs: Sequence[PoolEnv], trajectories, metrics: dict, *, last: bool = False):
        """Records the plays in the pool, then scores them (`scoring`): each environment's
        statistics, the agent's sequences, and the designer samples now due (all of them in
        the run's ``last`` iteration, as the reference flushes its delayed samples).

        A play dropped because a step timed out (`Trajectory.dropped`) is counted in its
        environment's `step_timeouts` and neither recorded nor trained on; a hinted play that
        timed out is kept with reward 0 and counted too, as the reference's hint phase flags
        the game for the timeout penalty (orchestrator.py:1880-1887)."""
        cfg = self.config
        kept = []
        for t in trajectories:
            env = envs[t.request.env_key]
            if getattr(t, "dropped", False):
                env.step_timeouts += 1
                continue
            if t.hinted and t.end_reason == "timeout":
                env.step_timeouts += 1
            kept.append(t)
            (env.hinted if t.hinted else env.plain).append((t.request.seed, t.reward, it))
        metrics["agent/dropped_plays"] = len(trajectories) - len(kept)
        trajectories = kept
        stats = scoring.env_statistics(envs)
        metrics.update(scoring.agent_metrics(trajectories, stats, envs))
        agent_sequences = scoring.agent_sequences(
            trajectories, stats, train_hinted=cfg.agent.train_hinted, regret_weighting=cfg.agent.regret_weighting,
            regret_temperature=cfg.agent.regret_temperature, weight=cfg.rl.agent_weight,
        )
        due = [p for p in self.state.pending if last or p.due_iteration <= it]
        self.state.pending = [p for p in self.state.pending if not (last or p.due_iteration <= it)]
        held_stats = scoring.env_statistics(self.state.held)
        designed = [(e, s) for e, s in zip(list(envs) + self.state.held, list(stats) + held_stats)
                    if not e.is_replay]
        designer = scoring.designer_scores(
            due, {e.env_id: s for e, s in designed if s is not None}, self.reward_cfg, weight=cfg.rl.designer_weight,
            n_agent_sequences=len(agent_sequences), regeneration_period=cfg.designer.regeneration_period,
            delayed=cfg.designer.reward_delay > 0, timed_out=frozenset(e.env_id for e, _ in designed if e.step_timeouts),
            skill_averages=self.state.skill_averages, frozen=not cfg.designer.train,
        )
        self.state.skill_averages = designer.skill_averages
        waiting = {p.env_id for p in self.state.pending if p.env_id}
        self.state.held = [e for e in self.state.held if e.env_id in waiting]
        if len(designer.rewards):
            metrics["designer/reward_mean"] = float(np.mean(designer.rewards))
            metrics["designer/reward_scale"] = designer.scale
            nonzero = int(np.sum(np.abs(designer.advantages) > 1e-12))
            metrics["designer/trained"] = len(designer.advantages)
            metrics["designer/nonzero_advantage"] = nonzero
            metrics["designer/nonzero_advantage_share"] = nonzero / len(designer.advantages)
        return stats, agent_sequences, designer, trajectories

    def _update(self, sequences: list[TrainSequence]) -> dict[str, float]:
        if not sequences:
            return {}
        rl = self.config.rl
        row_multiple = math.lcm(self.trainer.data_parallel, rl.micro_batch_rows or 1)
        batch = pack(sequences, rl.row_length, row_multiple=row_multiple)
        old = self.trainer.logprobs(batch) if rl.updates_per_iteration > 1 else None
        with phase_bar("update", rl.updates_per_iteration, enabled=self.context.progress) as bar:
            for _ in range(rl.updates_per_iteration):
                metrics = self.trainer.update(batch, old)
                bar.update(1)
        metrics["sequences"] = batch.num_sequences
        metrics["truncated_sequences"] = batch.truncated_sequences
        packed = int((batch.segment_ids_RT > 0).sum())
        metrics["packed_tokens"] = packed
        metrics["trained_share"] = float(batch.target_mask_RT.sum()) / max(packed, 1)
        if batch.truncated_sequences:
            logging.warning(
                "%d sequences were longer than rl.row_length=%d and were cut; raise rl.row_length",
                batch.truncated_sequences,
                rl.row_length,
            )
        return metrics

    def _remember(self, it, envs, stats, designer_rewards, designs, trajectories, review_rejected,
                  metrics: dict) -> list[EnvLogEntry]:
        """Adds or updates memory records (and their rotation out of replay); returns this
        iteration's environment log entries."""
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
            plain_now = [r for _, r, played in env.plain if played == it]
            wins = [is_success(r) for r in plain_now]
            remembered = values
            if plain_now:
                remembered = regeneration_statistics(plain_now, [r for _, r, played in env.hinted if played == it])
            if env.env_id in self.memory:
                self.memory.update(env.env_id, iteration=it, designer_reward=reward, plain_wins=wins, **remembered)
            elif not env.is_replay:
                self.memory.add(env.code, env.skill, iteration=it, doc_id=env.doc_id, designer_reward=reward,
                                env_id=env.env_id, level=env.difficulty, plain_wins=wins, **remembered)
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
        in_play = {e.env_id for e in envs}
        for env_id, reward in designer_rewards.items():  # designs scored after their pool ended
            if env_id not in in_play and env_id in self.memory:
                self.memory.set_designer_reward(env_id, reward)
        if self.rotation_cfg.retire_win_rate > 0:
            for env_id in self.memory.retire_mastered(it, self.rotation_cfg.retire_win_rate,
                                                      self.rotation_cfg.retire_plays):
                if env_id in entries:
                    entries[env_id].retired = self.memory.get(env_id).retired_reason
        designed = []
        for d in designs:
            env_id = design_env_id(it, d.slot) if d.admitted else None
            stage, reason = d.report.stage, d.report.reason
            if env_id in review_rejected:
                stage, reason = "self_review", rejection_reason(review_rejected[env_id])
            design = dict(slot=d.slot, attempt=d.attempt, difficulty=d.difficulty, doc_excerpt=d.doc_excerpt,
                          stage=stage, reason=reason, timings=d.report.timings,
                          calibration=d.report.details.get("calibration"))
            entry = entries.get(env_id) if env_id else None
            if entry is not None:
                for field, value in design.items():
                    setattr(entry, field, value)
            else:
                designed.append(EnvLogEntry(
                    iteration=it, env_id=env_id, skill=d.skill, doc_id=d.doc_id, code=d.report.code or d.text,
                    admitted=d.admitted and env_id not in review_rejected, **design,
                ))
        metrics["memory/size"] = len(self.memory)
        metrics["memory/retired"] = sum(r.retired for r in self.memory.records())
        return played + designed


def run(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
    """Builds a run in `workdir` (resuming it if it has checkpoints) and runs it to completion."""
    selfplay = SelfPlay(config, workdir)
    try:
        return selfplay.run()
    finally:
        selfplay.close()
        jax.effects_barrier()
