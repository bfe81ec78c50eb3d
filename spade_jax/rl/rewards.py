"""Episode rewards, per-environment statistics and designer rewards (host-side numpy).

The flow is: each finished episode gets one scalar reward (`episode_rewards`); the
episodes of one environment give its statistics (`env_stats`: win rate, mean plain and
hinted reward, regret); the statistics give the designer's reward for the program that
built the environment (`designer_rewards`, one named variant). Centring the designer
rewards per skill is the designer's advantage and lives in `rl/advantages.py`.

Everything here is a pure function of numpy arrays and small frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from spade_jax.envs.contract import SUCCESS_REWARD, is_success

DEFAULT_TIMEOUT_PENALTY = -0.5
DESIGNER_REWARD_KINDS = ("blend", "regret", "learnability", "sfl", "learning_potential")


def episode_rewards(final_rewards, terminated, timed_out=None, *,
                    timeout_penalty: float = DEFAULT_TIMEOUT_PENALTY) -> np.ndarray:
    """Scalar reward of each episode, shape (N,) float64.

    final_rewards: the reward returned by each episode's last step (ignored unless the
      episode terminated); terminated: whether that step set ``terminated``;
    timed_out: whether a step ran past its deadline (takes precedence: the episode gets
      ``timeout_penalty``). A terminated episode gets its last reward clipped to [-1, 1];
    an episode that ended any other way (truncated, ran out of turns or context) gets 0.
    """
    final = np.atleast_1d(np.asarray(final_rewards, dtype=np.float64))
    term = np.broadcast_to(np.atleast_1d(np.asarray(terminated, dtype=bool)), final.shape)
    if timed_out is None:
        timeout = np.zeros(final.shape, dtype=bool)
    else:
        timeout = np.broadcast_to(np.atleast_1d(np.asarray(timed_out, dtype=bool)), final.shape)
    bad = term & ~timeout & ~np.isfinite(final)
    if bad.any():
        raise ValueError(f"episode(s) {np.flatnonzero(bad).tolist()} terminated with a "
                         f"non-finite reward {final[bad].tolist()}; the sandbox must report "
                         "such a step as a failure instead")
    rewards = np.where(term, np.clip(np.nan_to_num(final), -1.0, 1.0), 0.0)
    return np.where(timeout, float(timeout_penalty), rewards)


def wins(rewards) -> np.ndarray:
    """Whether each episode reward counts as a win (``contract.is_success``), shape (N,) bool."""
    return np.array([is_success(float(r)) for r in np.atleast_1d(rewards)], dtype=bool)


@dataclasses.dataclass(frozen=True)
class EnvStats:
    """Statistics of one environment's episodes.

    win_rate, mean_plain and mean_abs_advantage are over all plain episodes, mean_hinted
    and hinted_win_rate over all hinted ones (NaN when there are none); regret is over
    the matched plays only (see `env_stats`) and is 0 without hinted episodes.
    """

    n_plain: int
    n_hinted: int
    win_rate: float
    mean_plain: float
    mean_hinted: float
    hinted_win_rate: float
    regret: float
    mean_abs_advantage: float


def env_stats(plain_rewards, hinted_rewards=(), *, plain_seeds=None,
              hinted_seeds=None) -> EnvStats:
    """Statistics of one environment from its plain and hinted episode rewards.

    Regret is ``max(0, mean R_hint - mean R_plain)`` over matched plays: when seeds are
    given, only episodes whose seed occurs in both sets count towards the regret (so an
    episode lost on one side does not bias it); without seeds both sets are taken as
    matched as they are. ``mean_abs_advantage`` is ``mean |R - mean R|`` over the plain
    episodes (the learning-potential signal, see `designer_rewards`).
    """
    plain = np.atleast_1d(np.asarray(plain_rewards, dtype=np.float64))
    hinted = np.atleast_1d(np.asarray(hinted_rewards, dtype=np.float64))
    if plain.size == 0:
        raise ValueError("env_stats needs at least one plain episode reward")
    if (plain_seeds is None) != (hinted_seeds is None):
        raise ValueError("give both plain_seeds and hinted_seeds, or neither")
    mean_plain = float(plain.mean())
    regret = 0.0
    if hinted.size:
        p_match, h_match = plain, hinted
        if plain_seeds is not None:
            ps, hs = np.asarray(plain_seeds), np.asarray(hinted_seeds)
            if ps.shape != plain.shape or hs.shape != hinted.shape:
                raise ValueError("seeds must have one entry per episode reward")
            p_match, h_match = plain[np.isin(ps, hs)], hinted[np.isin(hs, ps)]
        if p_match.size and h_match.size:
            regret = max(0.0, float(h_match.mean()) - float(p_match.mean()))
    return EnvStats(
        n_plain=int(plain.size),
        n_hinted=int(hinted.size),
        win_rate=float(wins(plain).mean()),
        mean_plain=mean_plain,
        mean_hinted=float(hinted.mean()) if hinted.size else float("nan"),
        hinted_win_rate=float(wins(hinted).mean()) if hinted.size else float("nan"),
        regret=regret,
        mean_abs_advantage=float(np.abs(plain - mean_plain).mean()),
    )


@dataclasses.dataclass(frozen=True)
class DesignerRewardConfig:
    """Which designer reward to use and its constants.

    kind: one of DESIGNER_REWARD_KINDS. blend = regret_weight * clip(regret / regret_scale,
    0, 1) + plateau_weight * plateau(win_rate). failure_penalty: reward of a program that
    was not admitted (no environment, so no statistics); duplicate_penalty: reward of one
    rejected only as a near-duplicate (it passed every other stage, so it is graded apart
    from a broken program).
    """

    kind: str = "blend"
    regret_weight: float = 0.4
    regret_scale: float = 0.15
    plateau_weight: float = 0.6
    plateau_low: float = 0.4
    plateau_high: float = 0.6
    plateau_ramp: float = 0.25
    failure_penalty: float = -1.0
    duplicate_penalty: float = -0.25

    def __post_init__(self):
        if self.kind not in DESIGNER_REWARD_KINDS:
            raise ValueError(f"designer reward kind {self.kind!r} is unknown; "
                             f"choose one of {DESIGNER_REWARD_KINDS}")
        if self.regret_scale <= 0 or self.plateau_ramp <= 0:
            raise ValueError("regret_scale and plateau_ramp must be > 0")
        if not self.plateau_low <= self.plateau_high:
            raise ValueError("plateau_low must be <= plateau_high")


def plateau(win_rate, low: float = 0.4, high: float = 0.6, ramp: float = 0.25):
    """1 on [low, high], falling linearly to 0 over ``ramp`` on each side, 0 beyond."""
    p = np.asarray(win_rate, dtype=np.float64)
    below = np.clip(1.0 - (low - p) / ramp, 0.0, 1.0)
    above = np.clip(1.0 - (p - high) / ramp, 0.0, 1.0)
    return np.where(p < low, below, np.where(p > high, above, 1.0))


def designer_reward(stats: EnvStats | None, cfg: DesignerRewardConfig = DesignerRewardConfig(),
                    rejected_at: str | None = None) -> float:
    """Designer reward of one program; ``None`` stats mean the program was not played, and
    ``rejected_at`` names the admission stage that rejected it ("novelty": the duplicate penalty).

    Variants (p = plain win rate):
      blend: see DesignerRewardConfig.
      regret: the regret itself.
      learnability (Absolute Zero, Zhao et al. 2025): 1 - p if p > 0 else 0.
      sfl (Sampling For Learnability, Rutherford et al. 2024): p (1 - p).
      learning_potential: mean |R - mean R| over the plain episodes, i.e. the mean
        absolute advantage under the group-mean baseline. This is Prioritized Level
        Replay's learning-potential score (Jiang et al. 2021, arXiv:2010.03934: average
        magnitude of the advantage estimate, the "L1 value loss") with the critic replaced
        by the per-environment mean reward, as Self-Evolving Curriculum does for LLM RL
        (Chen et al. 2025, arXiv:2505.14970: absolute advantage as learning gain). For
        0/1 rewards it equals 2 p (1 - p). It is not divided by the reward std: the mean
        |z-score| is nearly constant and would carry no signal.
    """
    if stats is None:
        return float(cfg.duplicate_penalty if rejected_at == "novelty" else cfg.failure_penalty)
    p = stats.win_rate
    if cfg.kind == "blend":
        r = np.clip(stats.regret / cfg.regret_scale, 0.0, 1.0)
        pl = plateau(p, cfg.plateau_low, cfg.plateau_high, cfg.plateau_ramp)
        return float(cfg.regret_weight * r + cfg.plateau_weight * pl)
    if cfg.kind == "regret":
        return float(stats.regret)
    if cfg.kind == "learnability":
        return float(1.0 - p) if p > 0 else 0.0
    if cfg.kind == "sfl":
        return float(p * (1.0 - p))
    return float(stats.mean_abs_advantage)


def designer_rewards(stats: Sequence[EnvStats | None], cfg: DesignerRewardConfig = DesignerRewardConfig(),
                     rejected_at: Sequence[str | None] | None = None) -> np.ndarray:
    """`designer_reward` of each designer sample, shape (N,) float64 (None = not played;
    ``rejected_at``: the rejecting stage of each sample, None for an admitted one)."""
    stages = rejected_at if rejected_at is not None else [None] * len(stats)
    return np.array([designer_reward(s, cfg, stage) for s, stage in zip(stats, stages)], dtype=np.float64)


__all__ = [
    "DEFAULT_TIMEOUT_PENALTY", "DESIGNER_REWARD_KINDS", "SUCCESS_REWARD", "DesignerRewardConfig",
    "EnvStats", "designer_reward", "designer_rewards", "env_stats", "episode_rewards",
    "plateau", "wins",
]
