"""Advantages for both roles (host-side numpy).

Designer: its rewards centred per skill (`designer_advantages`): each program's reward
minus the mean reward of the designer samples of the same skill in this batch, not
divided by the std (the reference's "centred, not normalised"), then multiplied by the
designer's reward scale (`rewards.designer_reward_scale`); a sample alone in its skill gets
0, as in the reference.

Agent: per-environment z-score of the plain episodes' rewards (`agent_advantages`).
Hinted episodes are not trained on by default; with ``train_hinted`` they get
advantages too. Optionally environments are weighted by their regret rank
(`regret_rank_weights`), to be multiplied into the per-sequence loss weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

import numpy as np

HINTED_BASELINES = ("own", "plain")


def _group_index(groups: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Maps arbitrary hashable group labels to 0..G-1 in order of first appearance."""
    index: dict[Hashable, int] = {}
    ids = np.array([index.setdefault(g, len(index)) for g in groups], dtype=np.int64)
    return ids, len(index)


def center_by_group(values, groups: Sequence[Hashable]) -> np.ndarray:
    """values minus the mean of their group, shape (N,) float64."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(groups) != v.size:
        raise ValueError(f"need one group label per value: {v.shape} values, {len(groups)} labels")
    ids, n = _group_index(groups)
    means = np.bincount(ids, weights=v, minlength=n) / np.bincount(ids, minlength=n)
    return v - means[ids]


def designer_advantages(rewards, skills: Sequence[str], scale: float = 1.0) -> np.ndarray:
    """Designer rewards centred per skill (subtract the skill group's mean, no std division),
    times ``scale`` (the reference applies its env reward scale after the centring).

    Every designer sample of the batch counts in its skill's mean. A sample that is the only
    one of its skill gets 0, as in the reference (delayed_env_rewards.py, per-skill centring):
    the slots of a regeneration are spread over its skills so that each holds several.
    """
    return center_by_group(np.asarray(rewards, dtype=np.float64), skills) * scale


def zscore(values, eps: float = 1e-6) -> np.ndarray:
    """(v - mean) / (std + eps) with the population std; all-equal values give exact zeros."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or np.all(v == v.flat[0]):
        return np.zeros_like(v)
    return (v - v.mean()) / (v.std() + eps)


@dataclasses.dataclass(frozen=True)
class AgentAdvantages:
    """advantages: shape (N,), one per episode (0 where not trained);
    train: shape (N,) bool, the episodes whose tokens enter the loss. Drop the others
    from the batch rather than keeping them with advantage 0: their tokens would still
    count in the token-mean denominator."""

    advantages: np.ndarray
    train: np.ndarray


def agent_advantages(rewards, env_ids: Sequence[Hashable], hinted, *, eps: float = 1e-6,
                     train_hinted: bool = False, hinted_baseline: str = "own") -> AgentAdvantages:
    """Per-environment z-scores of episode rewards.

    rewards: (N,) episode rewards; env_ids: (N,) environment of each episode;
    hinted: (N,) bool, whether the episode was played with the hint.

    Plain episodes: z-score within the plain episodes of their environment (all equal ->
    zeros). Hinted episodes are trained only with ``train_hinted``; then
    ``hinted_baseline="own"`` (default) z-scores them within the hinted episodes of their
    environment, as GRPO does for any prompt group: the hint changes the prompt, so the
    hinted plays are their own group. ``"plain"`` instead uses the plain group's mean and
    std (a hinted success then scores as far above the plain baseline as the hint
    helped); when the plain rewards are all equal (std 0) the hinted rewards are only
    centred on the plain mean, since dividing by eps would blow them up.
    """
    if hinted_baseline not in HINTED_BASELINES:
        raise ValueError(f"hinted_baseline {hinted_baseline!r} is unknown; choose one of {HINTED_BASELINES}")
    r = np.asarray(rewards, dtype=np.float64)
    h = np.asarray(hinted, dtype=bool)
    if r.ndim != 1 or h.shape != r.shape or len(env_ids) != r.size:
        raise ValueError(f"rewards, env_ids and hinted need the same length: "
                         f"{r.shape}, {len(env_ids)}, {h.shape}")
    ids, n_envs = _group_index(env_ids)
    adv = np.zeros_like(r)
    train = ~h if not train_hinted else np.ones_like(h)
    for e in range(n_envs):
        plain_idx = np.flatnonzero((ids == e) & ~h)
        hint_idx = np.flatnonzero((ids == e) & h)
        adv[plain_idx] = zscore(r[plain_idx], eps)
        if not train_hinted or hint_idx.size == 0:
            continue
        if hinted_baseline == "own":
            adv[hint_idx] = zscore(r[hint_idx], eps)
        elif plain_idx.size == 0:
            raise ValueError(f"environment {env_ids[hint_idx[0]]!r} has hinted episodes but no "
                             "plain ones to use as the baseline (hinted_baseline='plain')")
        else:
            base = r[plain_idx]
            scale = base.std() + eps if np.any(base != base[0]) else 1.0
            adv[hint_idx] = (r[hint_idx] - base.mean()) / scale
    return AgentAdvantages(advantages=adv, train=train)


def average_ranks(values) -> np.ndarray:
    """1-based ranks in descending order of value (largest = 1), ties share their mean rank."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(-v, kind="stable")
    ranks = np.empty(v.size, dtype=np.float64)
    ranks[order] = np.arange(1, v.size + 1, dtype=np.float64)
    for val in np.unique(v):
        tie = v == val
        ranks[tie] = ranks[tie].mean()
    return ranks


def regret_rank_weights(regrets, temperature: float = 1.0) -> np.ndarray:
    """Per-environment weights from regret ranks, mean 1 over environments, shape (E,).

    Prioritized Level Replay's rank prioritisation (Jiang et al. 2021): with rank_e = 1
    for the highest regret (ties share their mean rank), h_e = rank_e ** (-1 / temperature)
    and w_e = E * h_e / sum_j h_j. The mean weight is 1, so the loss scale is unchanged;
    a higher temperature flattens the weights towards 1. Index the result with each
    episode's environment to get per-episode weights.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    r = np.asarray(regrets, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise ValueError("regret_rank_weights needs a non-empty 1-D array of regrets")
    h = average_ranks(r) ** (-1.0 / temperature)
    return r.size * h / h.sum()


__all__ = [
    "AgentAdvantages", "HINTED_BASELINES", "agent_advantages", "average_ranks",
    "center_by_group", "designer_advantages", "regret_rank_weights", "zscore",
]
