"""Scoring an iteration: plays -> each environment's statistics -> advantages -> training sequences.

Pure functions of the iteration's trajectories and the pool's play records; the loop calls
them in this order:

1. `env_statistics`: each environment's statistics (win rate, means, matched regret, micro
   learning potential) over every play since it entered the pool (plays dropped because a
   step timed out or the play failed are not among them), computed once and used by
   everything below, by the memory and by the environment log;
2. `agent_metrics` and `agent_sequences`: the agent's win rates and its training sequences
   (advantages centred per environment, optionally weighted by regret rank);
3. `designer_scores`: the reward and training sequence of each designer sample now due, and
   the skills' reward averages after them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from spade_jax.agent import Trajectory
from spade_jax.rl import advantages as adv_lib
from spade_jax.rl import rewards as rew_lib
from spade_jax.rl.batch import TrainSequence
from spade_jax.selfplay.state import PendingDesign, PoolEnv


def env_statistics(envs: Sequence[PoolEnv]) -> list[rew_lib.EnvStats | None]:
    """Statistics of each environment over its recorded plays; None for one not played.

    The regret compares the means of the plain and hinted plays of the first iteration that
    has hinted plays (the regeneration step, as the reference plays them: hinted plays on seeds
    of their own, `rewards.env_stats`). The plain plays' iterations give the micro learning
    potential.
    """
    stats = []
    for env in envs:
        if not env.plain:
            stats.append(None)
            continue
        hinted_its = [iteration for _, _, iteration in env.hinted]
        stats.append(rew_lib.env_stats(
            [reward for _, reward, _ in env.plain],
            [reward for _, reward, _ in env.hinted],
            plain_iterations=[iteration for _, _, iteration in env.plain],
            hinted_iterations=hinted_its,
            regret_iteration=min(hinted_its) if hinted_its else None,
            timed_out=env.step_timeouts > 0,
        ))
    return stats


def agent_metrics(trajectories: Sequence[Trajectory], stats: Sequence[rew_lib.EnvStats | None],
                  envs: Sequence[PoolEnv] = ()) -> dict[str, float]:
    """Episode counts, plain and hinted win rates and mean rewards, the mean regret and the mean
    unclipped hinted - plain gap; with ``envs`` (``envs[k]`` played ``request.env_key == k``)
    also plain win rate and regret per skill (``skill/<skill>/...``) and apart for the
    environments designed this period and those replayed from memory."""
    plain = [t for t in trajectories if not t.hinted]
    hinted = [t for t in trajectories if t.hinted]
    metrics = {
        "agent/episodes": len(trajectories),
        "agent/plain_win_rate": _mean([t.won for t in plain]),
        "agent/hinted_win_rate": _mean([t.won for t in hinted]),
        "agent/plain_reward_mean": _mean([t.reward for t in plain]),
        "agent/hinted_reward_mean": _mean([t.reward for t in hinted]),
        "env/regret_mean": _mean([s.regret for s in stats if s is not None]),
    }
    gaps = [s.gap for s in stats if s is not None and math.isfinite(s.gap)]
    if gaps:  # environments with matched hinted plays (none in an iteration that regenerates nothing)
        metrics["env/gap_mean"] = _mean(gaps)
    if not envs:
        return metrics
    for name, keep in (("new", lambda e: not e.is_replay), ("replayed", lambda e: e.is_replay)):
        metrics[f"env/{name}"] = sum(keep(e) for e, s in zip(envs, stats) if s is not None)
        played = [t.won for t in plain if keep(envs[t.request.env_key])]
        if played:
            metrics[f"agent/{name}_plain_win_rate"] = _mean(played)
    for skill in sorted({e.skill for e in envs if e.skill}):
        key = "skill/" + "_".join(skill.split())
        mine = [k for k, e in enumerate(envs) if e.skill == skill and stats[k] is not None]
        if mine:
            metrics[f"{key}/plain_win_rate"] = _mean([t.won for t in plain if t.request.env_key in mine])
            metrics[f"{key}/regret"] = _mean([stats[k].regret for k in mine])
    return metrics


def agent_sequences(trajectories: Sequence[Trajectory], stats: Sequence[rew_lib.EnvStats | None], *,
                    train_hinted: bool, regret_weighting: bool, regret_temperature: float,
                    weight: float) -> list[TrainSequence]:
    """The agent's training sequences: advantages centred over each environment's plays
    (`advantages.agent_advantages`), times ``weight`` and, with ``regret_weighting``, the
    environment's regret-rank weight. ``stats[k]`` belongs to ``request.env_key == k``.
    ``weight`` 0 (a frozen agent) gives none: its sequences would train nothing, only add to
    the token count the loss divides by and to the designer's "auto" reward scale."""
    if not trajectories or weight == 0:
        return []
    result = adv_lib.agent_advantages(
        [t.reward for t in trajectories],
        [t.request.env_key for t in trajectories],
        [t.hinted for t in trajectories],
        train_hinted=train_hinted,
    )
    env_weights = np.full(len(stats), 1.0)
    if regret_weighting and len(stats):
        env_weights = adv_lib.regret_rank_weights([s.regret if s else 0.0 for s in stats],
                                                  temperature=regret_temperature)
    return [
        TrainSequence(t.tokens, t.loss_mask, t.sampler_logprobs, advantage=float(a),
                      weight=weight * float(env_weights[t.request.env_key]), role="agent")
        for t, a, train in zip(trajectories, result.advantages, result.train)
        if train and t.loss_mask.any()
    ]


@dataclasses.dataclass(frozen=True)
class DesignerScores:
    """The due designer samples' rewards (in order, before centring) and advantages (centred and
    scaled), their training sequences, the reward per admitted environment id, the scale
    applied to their centred rewards, and every skill's reward averages after this scoring."""

    rewards: np.ndarray
    advantages: np.ndarray
    sequences: list[TrainSequence]
    by_env_id: dict[str, float]
    scale: float
    skill_averages: dict[str, rew_lib.SkillRewardAverages]


def designer_scores(due: Sequence[PendingDesign], stats_by_env_id: dict[str, rew_lib.EnvStats],
                    cfg: rew_lib.DesignerRewardConfig, *, weight: float, n_agent_sequences: int = 0,
                    regeneration_period: int = 1, delayed: bool = True, timed_out: frozenset = frozenset(),
                    skill_averages: dict[str, rew_lib.SkillRewardAverages] | None = None,
                    frozen: bool = False) -> DesignerScores:
    """Rewards (`rewards.designer_rewards`), advantages centred per skill times
    `rewards.designer_reward_scale` (from ``n_agent_sequences``, the agent's sequences in the
    same update, and the ``regeneration_period``), and one training sequence per sample.

    Samples that were not admitted are left out under ``cfg.rejected == "drop"`` (the
    reference) and get the failure penalty under "penalty"; an admitted sample none of whose
    plays survived scores 0 (the reference's "no data"), or the timeout penalty where the
    kind applies it when its id is in ``timed_out``. ``delayed``: scored under a reward
    delay. Kind "learning_potential" measures each sample against its skill's slow average and
    updates ``skill_averages`` with the due samples' plays: under a delay the update comes
    first (the reference's delayed path, delayed_env_rewards.py:129-162), without one the
    baseline is read first (its immediate path, env_rewards.py:107-128); other kinds pass the
    averages through unchanged. ``weight`` 0 gives rewards and no training sequences."""
    averages = dict(skill_averages or {})
    if cfg.rejected == "drop":
        due = [p for p in due if p.env_id]
    if not due:
        return DesignerScores(np.zeros(0), np.zeros(0), [], {}, 1.0, averages)
    stats = [stats_by_env_id.get(p.env_id) if p.env_id else None for p in due]
    stats = [_timed_out_without_plays() if s is None and p.env_id in timed_out else s for p, s in zip(due, stats)]
    skills = [p.skill for p in due]
    baselines = None
    if cfg.kind == "learning_potential":
        before = averages
        averages = rew_lib.update_learning_potentials(averages, skills, stats, cfg)
        baselines = rew_lib.learning_potential_baselines(before if not delayed else averages, skills)
    rewards = rew_lib.designer_rewards(stats, cfg, [None if p.env_id else p.stage for p in due], baselines=baselines,
                                       delayed=delayed)
    scale = rew_lib.designer_reward_scale(cfg, len(due), n_agent_sequences, regeneration_period)
    advantages = adv_lib.designer_advantages(rewards, skills, scale)
    sequences = []
    for p, a in zip(due, advantages):
        tokens, mask, logprobs = p.sequence_arrays()
        if mask.any() and weight != 0:
            sequences.append(TrainSequence(tokens, mask, logprobs, advantage=0.0 if frozen else float(a), weight=weight,
                                           role="designer"))
    by_env_id = {p.env_id: float(r) for p, r in zip(due, rewards) if p.env_id}
    return DesignerScores(np.asarray(rewards), np.asarray(advantages, np.float64), sequences, by_env_id, scale,
                          averages)


def _timed_out_without_plays() -> rew_lib.EnvStats:
    """The statistics of an environment every play of which was dropped by a step timeout."""
    return dataclasses.replace(rew_lib.env_stats([0.0]), n_plain=0, timed_out=True)


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else math.nan
