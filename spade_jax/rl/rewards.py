"""Episode rewards, per-environment statistics and designer rewards (host-side numpy).

The flow is: each finished episode carries one scalar reward (the environment contract's
rule, `envs.contract.episode_reward`); the episodes of one environment give its statistics (`env_stats`: win rate, mean plain and
hinted reward, regret, micro learning potential); the statistics give the designer's reward
for the program that built the environment (`designer_rewards`, one named variant; the
reference's `learning_potential` also needs each skill's slow reward average, kept by
`update_learning_potentials`). Centring the designer rewards per skill, times
`designer_reward_scale`, is the designer's advantage and lives in `rl/advantages.py`.

Everything here is a pure function of numpy arrays and small frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from spade_jax.envs.contract import SUCCESS_REWARD, is_success

DESIGNER_REWARD_KINDS = ("blend", "regret", "learnability", "sfl", "mean_abs_advantage", "learning_potential",
                         "micro_lp")
REWARD_SCALINGS = ("none", "auto", "fixed")


def wins(rewards) -> np.ndarray:
    """Whether each episode reward counts as a win (``contract.is_success``), shape (N,) bool."""
    return np.array([is_success(float(r)) for r in np.atleast_1d(rewards)], dtype=bool)


@dataclasses.dataclass(frozen=True)
class EnvStats:
    """Statistics of one environment's episodes.

    win_rate, mean_plain and mean_abs_advantage are over all plain episodes, mean_hinted
    and hinted_win_rate over all hinted ones (NaN when there are none); regret is over
    the matched plays only (see `env_stats`) and is 0 without hinted episodes; gap is the
    same difference unclipped (NaN without matched plays: how often a hint hurts shows here);
    micro_lp is `micro_lp` of the plain episodes (0 when their iterations are unknown).
    """

    n_plain: int
    n_hinted: int
    win_rate: float
    mean_plain: float
    mean_hinted: float
    hinted_win_rate: float
    regret: float
    mean_abs_advantage: float
    micro_lp: float = 0.0
    gap: float = float("nan")


def micro_lp(rewards, iterations) -> float:
    """The reference's micro learning potential of one environment: did the agent improve on it?

    The iterations the environment was played in are split in time into an early and a late
    half (``mid = n // 2``, so an odd count puts the middle iteration in the late half); the
    result is ``max(0, mean late reward - mean early reward)``, over the episodes of each half
    pooled. Fewer than two distinct iterations give 0; episodes whose iteration is None
    (recorded before iterations were kept) are left out.
    """
    r = np.atleast_1d(np.asarray(rewards, dtype=np.float64))
    if len(iterations) != r.size:
        raise ValueError(f"need one iteration per reward: {r.size} rewards, {len(iterations)} iterations")
    known = np.array([i is not None for i in iterations], dtype=bool)
    r, its = r[known], np.array([i for i in iterations if i is not None], dtype=np.int64)
    offsets = np.unique(its)
    if offsets.size < 2:
        return 0.0
    late = its >= offsets[offsets.size // 2]
    return max(0.0, float(r[late].mean()) - float(r[~late].mean()))


def env_stats(plain_rewards, hinted_rewards=(), *, plain_seeds=None,
              hinted_seeds=None, plain_iterations=None) -> EnvStats:
    """Statistics of one environment from its plain and hinted episode rewards.

    Regret is ``max(0, mean R_hint - mean R_plain)`` over matched plays: when seeds are
    given, only episodes whose seed occurs in both sets count towards the regret (so an
    episode lost on one side does not bias it); without seeds both sets are taken as
    matched as they are. ``mean_abs_advantage`` is ``mean |R - mean R|`` over the plain
    episodes (see `designer_reward`). ``plain_iterations``: the iteration each plain episode
    was played in (None for unknown), for ``micro_lp``.
    """
    plain = np.atleast_1d(np.asarray(plain_rewards, dtype=np.float64))
    hinted = np.atleast_1d(np.asarray(hinted_rewards, dtype=np.float64))
    if plain.size == 0:
        raise ValueError("env_stats needs at least one plain episode reward")
    if (plain_seeds is None) != (hinted_seeds is None):
        raise ValueError("give both plain_seeds and hinted_seeds, or neither")
    mean_plain = float(plain.mean())
    gap = float("nan")
    if hinted.size:
        p_match, h_match = plain, hinted
        if plain_seeds is not None:
            ps, hs = np.asarray(plain_seeds), np.asarray(hinted_seeds)
            if ps.shape != plain.shape or hs.shape != hinted.shape:
                raise ValueError("seeds must have one entry per episode reward")
            p_match, h_match = plain[np.isin(ps, hs)], hinted[np.isin(hs, ps)]
        if p_match.size and h_match.size:
            gap = float(h_match.mean()) - float(p_match.mean())
    return EnvStats(
        n_plain=int(plain.size),
        n_hinted=int(hinted.size),
        win_rate=float(wins(plain).mean()),
        mean_plain=mean_plain,
        mean_hinted=float(hinted.mean()) if hinted.size else float("nan"),
        hinted_win_rate=float(wins(hinted).mean()) if hinted.size else float("nan"),
        regret=max(0.0, gap) if np.isfinite(gap) else 0.0,
        mean_abs_advantage=float(np.abs(plain - mean_plain).mean()),
        micro_lp=micro_lp(plain, plain_iterations) if plain_iterations is not None else 0.0,
        gap=gap,
    )


@dataclasses.dataclass(frozen=True)
class DesignerRewardConfig:
    """Which designer reward to use, its constants, and the scale of the designer's advantages.

    kind: one of DESIGNER_REWARD_KINDS (see `designer_reward`). blend = regret_weight *
    clip(regret / regret_scale, 0, 1) + plateau_weight * plateau(win_rate). failure_penalty:
    reward of a program that was not admitted (no environment, so no statistics);
    duplicate_penalty: reward of one rejected only as a near-duplicate (it passed every other
    stage, so it is graded apart from a broken program).

    lp_gamma_fast, lp_gamma_slow: the weights of the newest value in the fast and slow moving
    averages of each skill's mean reward (kind "learning_potential"; the reference's
    convention: ``mu <- (1 - gamma) mu + gamma r``, so the fast one has the larger gamma).
    The defaults are the published training recipe's (``--spade-gamma1 0.98 --spade-gamma2
    0.85``); the reference code's own defaults are 0.99 / 0.95.

    scaling: how the designer's advantages (rewards centred per skill) are multiplied, to
    balance the few designer samples, trained once per pool, against the agent's many:
    "none" (x1, the reference's variant 0), "auto" (the reference's variant 1:
    ``min(max_scale, agent sequences / designer samples * regeneration_period)`` of the
    update they enter, 1 when either count is 0; 192 / 24 * 4 = 32 on the paper's schedule)
    or "fixed" (x ``scale``). The default here is "none", which keeps earlier runs unchanged
    and leaves the balance of the two roles to ``rl.designer_weight``; the reference's
    default is "auto" with ``max_scale`` 50.
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
    lp_gamma_fast: float = 0.98
    lp_gamma_slow: float = 0.85
    scaling: str = "none"
    scale: float = 1.0
    max_scale: float = 50.0

    def __post_init__(self):
        if self.kind not in DESIGNER_REWARD_KINDS:
            raise ValueError(f"designer reward kind {self.kind!r} is unknown; "
                             f"choose one of {DESIGNER_REWARD_KINDS}")
        if self.regret_scale <= 0 or self.plateau_ramp <= 0:
            raise ValueError("regret_scale and plateau_ramp must be > 0")
        if not self.plateau_low <= self.plateau_high:
            raise ValueError("plateau_low must be <= plateau_high")
        if not 0 < self.lp_gamma_slow < self.lp_gamma_fast <= 1:
            raise ValueError(f"need 0 < lp_gamma_slow < lp_gamma_fast <= 1, got "
                             f"{self.lp_gamma_slow} and {self.lp_gamma_fast}")
        if self.scaling not in REWARD_SCALINGS:
            raise ValueError(f"designer reward scaling {self.scaling!r} is unknown; choose one of {REWARD_SCALINGS}")
        if self.scale <= 0 or self.max_scale <= 0:
            raise ValueError("scale and max_scale must be > 0")


def plateau(win_rate, low: float = 0.4, high: float = 0.6, ramp: float = 0.25):
    """1 on [low, high], falling linearly to 0 over ``ramp`` on each side, 0 beyond."""
    p = np.asarray(win_rate, dtype=np.float64)
    below = np.clip(1.0 - (low - p) / ramp, 0.0, 1.0)
    above = np.clip(1.0 - (p - high) / ramp, 0.0, 1.0)
    return np.where(p < low, below, np.where(p > high, above, 1.0))


@dataclasses.dataclass(frozen=True)
class SkillRewardAverages:
    """Fast and slow moving averages of one skill's mean plain reward (the reference's
    ``LearningPotential`` tracker, one per skill); the slow one is the baseline of kind
    "learning_potential"."""

    mu_fast: float
    mu_slow: float

    def updated(self, mean_reward: float, gamma_fast: float, gamma_slow: float) -> "SkillRewardAverages":
        return SkillRewardAverages((1.0 - gamma_fast) * self.mu_fast + gamma_fast * mean_reward,
                                   (1.0 - gamma_slow) * self.mu_slow + gamma_slow * mean_reward)

    def potential(self, gamma_fast: float, gamma_slow: float) -> float:
        """The reference's rho = |mu_fast - mu_slow| / (2 (gamma_fast - gamma_slow)), for monitoring."""
        return abs(self.mu_fast - self.mu_slow) / (2.0 * (gamma_fast - gamma_slow))


def update_learning_potentials(averages: Mapping[str, SkillRewardAverages], skills: Sequence[str],
                               stats: Sequence[EnvStats | None],
                               cfg: DesignerRewardConfig) -> dict[str, SkillRewardAverages]:
    """Each skill's averages after one scoring of designer samples (a new dict).

    A skill is updated once, with the mean plain reward over all episodes of its played
    samples (pooled, so an environment counts by its number of episodes); its first update
    sets both averages to that mean. Skills without a played sample keep their averages.
    """
    pooled: dict[str, list[float]] = {}
    for skill, s in zip(skills, stats):
        if s is not None:
            total = pooled.setdefault(skill, [0.0, 0])
            total[0] += s.mean_plain * s.n_plain
            total[1] += s.n_plain
    result = dict(averages)
    for skill, (reward_sum, n) in pooled.items():
        mean = reward_sum / n
        old = result.get(skill)
        result[skill] = (SkillRewardAverages(mean, mean) if old is None
                         else old.updated(mean, cfg.lp_gamma_fast, cfg.lp_gamma_slow))
    return result


def designer_reward_scale(cfg: DesignerRewardConfig, n_designer: int, n_agent: int,
                          regeneration_period: int) -> float:
    """The factor on the designer's centred rewards (``cfg.scaling``, see DesignerRewardConfig)."""
    if cfg.scaling == "none":
        return 1.0
    if cfg.scaling == "fixed":
        return float(cfg.scale)
    if n_designer <= 0 or n_agent <= 0:
        return 1.0
    return float(min(n_agent / n_designer * regeneration_period, cfg.max_scale))


def designer_reward(stats: EnvStats | None, cfg: DesignerRewardConfig = DesignerRewardConfig(),
                    rejected_at: str | None = None, *, baseline: float | None = None) -> float:
    """Designer reward of one program; ``None`` stats mean the program was not played, and
    ``rejected_at`` names the admission stage that rejected it ("novelty": the duplicate penalty).

    Variants (p = plain win rate):
      blend: see DesignerRewardConfig.
      regret: the regret itself.
      learnability (Absolute Zero, Zhao et al. 2025): 1 - p if p > 0 else 0.
      sfl (Sampling For Learnability, Rutherford et al. 2024): p (1 - p).
      mean_abs_advantage: mean |R - mean R| over the plain episodes, i.e. the mean
        absolute advantage under the group-mean baseline. This is Prioritized Level
        Replay's learning-potential score (Jiang et al. 2021, arXiv:2010.03934: average
        magnitude of the advantage estimate, the "L1 value loss") with the critic replaced
        by the per-environment mean reward, as Self-Evolving Curriculum does for LLM RL
        (Chen et al. 2025, arXiv:2505.14970: absolute advantage as learning gain). For
        0/1 rewards it equals 2 p (1 - p). It is not divided by the reward std: the mean
        |z-score| is nearly constant and would carry no signal.
      learning_potential (the reference's): |mean plain R - baseline|, the baseline being
        the slow moving average of the skill's mean reward after this scoring's update
        (`update_learning_potentials`); it must be given.
      micro_lp (the reference's): the environment's `micro_lp`, its improvement over the
        iterations it was played in.
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
    if cfg.kind == "mean_abs_advantage":
        return float(stats.mean_abs_advantage)
    if cfg.kind == "micro_lp":
        return float(stats.micro_lp)
    if baseline is None:
        raise ValueError("designer reward kind 'learning_potential' needs the skill's baseline")
    return abs(float(stats.mean_plain) - float(baseline))


def designer_rewards(stats: Sequence[EnvStats | None], cfg: DesignerRewardConfig = DesignerRewardConfig(),
                     rejected_at: Sequence[str | None] | None = None, *,
                     baselines: Sequence[float | None] | None = None) -> np.ndarray:
    """`designer_reward` of each designer sample, shape (N,) float64 (None = not played;
    ``rejected_at``: the rejecting stage of each sample, None for an admitted one;
    ``baselines``: each sample's skill baseline, needed by kind "learning_potential")."""
    stages = rejected_at if rejected_at is not None else [None] * len(stats)
    bases = baselines if baselines is not None else [None] * len(stats)
    return np.array([designer_reward(s, cfg, stage, baseline=b) for s, stage, b in zip(stats, stages, bases)],
                    dtype=np.float64)


__all__ = [
    "DESIGNER_REWARD_KINDS", "REWARD_SCALINGS", "SUCCESS_REWARD", "DesignerRewardConfig",
    "EnvStats", "SkillRewardAverages", "designer_reward", "designer_reward_scale", "designer_rewards", "env_stats",
    "micro_lp", "plateau", "update_learning_potentials", "wins",
]
