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

REWARD_SCALINGS = ("none", "auto", "fixed")
REJECTED_RULES = ("drop", "penalty")
STEP_TIMEOUT_PENALTY = -0.5  # the reference's designer reward for a program whose step timed out


def wins(rewards) -> np.ndarray:
    """Whether each episode reward counts as a win (``contract.is_success``), shape (N,) bool."""
    return np.array([is_success(float(r)) for r in np.atleast_1d(rewards)], dtype=bool)


@dataclasses.dataclass(frozen=True)
class EnvStats:
    """Statistics of one environment's episodes.

    win_rate (the share of plays with reward >= 1), mean_plain, plain_var and
    mean_abs_advantage are over all plain episodes, mean_hinted and hinted_win_rate over
    all hinted ones (NaN when there are none); regret is over the matched plays only (see
    `env_stats`) and is 0 without hinted episodes; gap is the same difference unclipped
    (NaN without matched plays: how often a hint hurts shows here); window_regret is
    ``max(0, mean R_hint - mean R_plain)`` with every plain play counted (the reference's
    `regret` kind under a delay); micro_lp is `micro_lp` of the plain episodes (0 when their
    iterations are unknown); timed_out: a play of it was dropped because a step timed out.
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
    window_regret: float = 0.0
    plain_var: float = 0.0
    timed_out: bool = False


def micro_lp(rewards, iterations) -> float:
    """The reference's micro learning potential of one environment: did the agent improve on it?

    The iterations the environment was played in are split in time into an early and a late
    half (``mid = n // 2``, so an odd count puts the middle iteration in the late half); the
    result is ``max(0, mean late reward - mean early reward)``, over the episodes of each half
    pooled. Fewer than two distinct iterations give 0.
    """
    r = np.atleast_1d(np.asarray(rewards, dtype=np.float64))
    if len(iterations) != r.size:
        raise ValueError(f"need one iteration per reward: {r.size} rewards, {len(iterations)} iterations")
    its = np.asarray(iterations, dtype=np.int64)
    offsets = np.unique(its)
    if offsets.size < 2:
        return 0.0
    late = its >= offsets[offsets.size // 2]
    return max(0.0, float(r[late].mean()) - float(r[~late].mean()))


def env_stats(plain_rewards, hinted_rewards=(), *, plain_iterations=None, hinted_iterations=None,
              regret_iteration: int | None = None, timed_out: bool = False) -> EnvStats:
    """Statistics of one environment from its plain and hinted episode rewards.

    Regret is ``max(0, mean R_hint - mean R_plain)``, the two means compared as the reference
    compares them (its hinted plays have seeds of their own). With ``regret_iteration`` (the
    regeneration step, whose plays alone are hinted) only the plays of that iteration are
    compared, and the hinted mean of that iteration also gives ``window_regret`` against every
    plain play (the reference's `regret` kind under a delay); without it every play counts
    and ``window_regret`` equals the regret. ``mean_abs_advantage`` is ``mean |R - mean R|``
    over the plain episodes (see `designer_reward`). ``plain_iterations`` /
    ``hinted_iterations``: the iteration each episode was played in, for ``micro_lp`` and
    ``regret_iteration``.
    """
    plain = np.atleast_1d(np.asarray(plain_rewards, dtype=np.float64))
    hinted = np.atleast_1d(np.asarray(hinted_rewards, dtype=np.float64))
    if plain.size == 0:
        raise ValueError("env_stats needs at least one plain episode reward")
    p_keep, h_keep = np.ones(plain.size, bool), np.ones(hinted.size, bool)
    if regret_iteration is not None:
        if plain_iterations is None or hinted_iterations is None:
            raise ValueError("regret_iteration needs plain_iterations and hinted_iterations")
        p_keep = np.array([i == regret_iteration for i in plain_iterations], bool).reshape(plain.shape)
        h_keep = np.array([i == regret_iteration for i in hinted_iterations], bool).reshape(hinted.shape)
    mean_plain = float(plain.mean())
    gap = float("nan")
    if h_keep.any() and p_keep.any():
        gap = float(hinted[h_keep].mean()) - float(plain[p_keep].mean())
    regret = max(0.0, gap) if np.isfinite(gap) else 0.0
    window_regret = regret
    if regret_iteration is not None and h_keep.any():
        window_regret = max(0.0, float(hinted[h_keep].mean()) - mean_plain)
    return EnvStats(
        n_plain=int(plain.size),
        n_hinted=int(hinted.size),
        win_rate=float(wins(plain).mean()),
        mean_plain=mean_plain,
        mean_hinted=float(hinted.mean()) if hinted.size else float("nan"),
        hinted_win_rate=float(wins(hinted).mean()) if hinted.size else float("nan"),
        regret=regret,
        mean_abs_advantage=float(np.abs(plain - mean_plain).mean()),
        micro_lp=micro_lp(plain, plain_iterations) if plain_iterations is not None else 0.0,
        gap=gap,
        window_regret=window_regret,
        plain_var=float(plain.var()),
        timed_out=bool(timed_out),
    )


@dataclasses.dataclass(frozen=True)
class DesignerRewardConfig:
    """Which designer reward to use, its constants, and the scale of the designer's advantages.

    The defaults are the reference's rules (spade-rl/spade, `delayed_env_rewards.py`,
    `env_rewards.py`); each deliberate difference is an option with the reference's value first.

    kind: one of `REWARD_KINDS` (see `designer_reward`). blend = regret_weight *
    clip(regret / regret_scale, 0, 1) + plateau_weight * plateau(win rate), the win rate
    being the mean plain reward; without a reward delay it is scored as floored regret (the
    reference's undelayed path has no blend).

    timeout_penalty: the raw reward of a program one of whose plays timed out, for kind
    "regret", and for "blend" scored without a delay (the reference scores both through its
    undelayed regret path; its delayed blend has no override).

    rejected: what a program that was not admitted trains on. "drop" (the reference: a
    broken program never enters the designer's update), or "penalty": its raw reward is
    ``failure_penalty``, or ``duplicate_penalty`` for one rejected only as a near-duplicate
    (it passed every other stage, so it is graded apart from a broken program).

    solver_variance: kind "learning_potential" adds the reference's solver-variance reward
    ``exp(-(var R - 0.25)^2 / 0.02)`` of the plain rewards (over more than one play when
    delayed).

    lp_gamma_fast, lp_gamma_slow: the weights of the newest value in the fast and slow moving
    averages of each skill's mean reward (kind "learning_potential"; the reference's
    convention: ``mu <- (1 - gamma) mu + gamma r``, so the fast one has the larger gamma).
    The defaults are the published training recipe's (``--spade-gamma1 0.98 --spade-gamma2
    0.85``); the reference code's own defaults are 0.99 / 0.95.

    scaling: how the designer's advantages (rewards centred per skill) are multiplied, to
    balance the few designer samples, trained once per pool, against the agent's many:
    "auto" (the reference's default, its variant 1: ``min(max_scale, agent sequences /
    designer samples * regeneration_period)`` of the update they enter, 1 when either count
    is 0; 192 / 24 * 4 = 32 on the paper's schedule), "none" (x1, the reference's variant 0)
    or "fixed" (x ``scale``).
    """

    kind: str = "blend"
    regret_weight: float = 0.4
    regret_scale: float = 0.15
    plateau_weight: float = 0.6
    plateau_low: float = 0.4
    plateau_high: float = 0.6
    plateau_ramp: float = 0.25
    timeout_penalty: float = STEP_TIMEOUT_PENALTY
    rejected: str = "drop"
    failure_penalty: float = -1.0
    duplicate_penalty: float = -0.25
    solver_variance: bool = False
    lp_gamma_fast: float = 0.98
    lp_gamma_slow: float = 0.85
    scaling: str = "auto"
    scale: float = 1.0
    max_scale: float = 50.0

    def __post_init__(self):
        if self.kind not in REWARD_KINDS:
            raise ValueError(f"designer reward kind {self.kind!r} is unknown; choose one of {tuple(REWARD_KINDS)}")
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
        if self.rejected not in REJECTED_RULES:
            raise ValueError(f"designer reward rejected {self.rejected!r} is unknown; choose one of {REJECTED_RULES}")


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
        if s is not None and s.n_plain:
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


def learning_potential_baselines(averages: Mapping[str, SkillRewardAverages], skills: Sequence[str]) -> list[float]:
    """Each sample's baseline for kind "learning_potential": its skill's slow average, 0 for a
    skill not yet averaged (the reference's ``LearningPotential.get_baseline``)."""
    return [averages[k].mu_slow if k in averages else 0.0 for k in skills]


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


def solver_variance_reward(variance: float) -> float:
    """The reference's solver-variance reward: a bump of width 0.1 at a reward variance of 0.25
    (the variance of a fair 0/1 coin)."""
    return float(np.exp(-((variance - 0.25) ** 2) / (2 * 0.01)))


def _blend(stats: EnvStats, cfg: DesignerRewardConfig, baseline: float | None, delayed: bool) -> float:
    r = np.clip(stats.regret / cfg.regret_scale, 0.0, 1.0)
    pl = plateau(stats.mean_plain, cfg.plateau_low, cfg.plateau_high, cfg.plateau_ramp)
    return float(cfg.regret_weight * r + cfg.plateau_weight * pl)


def _regret(stats: EnvStats, cfg: DesignerRewardConfig, baseline: float | None, delayed: bool) -> float:
    return float(stats.window_regret if delayed else stats.regret)


def _learning_potential(stats: EnvStats, cfg: DesignerRewardConfig, baseline: float | None, delayed: bool) -> float:
    if baseline is None:
        raise ValueError("designer reward kind 'learning_potential' needs the skill's baseline")
    reward = abs(float(stats.mean_plain) - float(baseline))
    if cfg.solver_variance and (stats.n_plain > 1 or not delayed):
        reward += solver_variance_reward(stats.plain_var)
    return reward


# Each kind's raw reward of a played program: f(stats, cfg, baseline, delayed) (see `designer_reward`).
REWARD_KINDS = {
    "blend": _blend,
    "regret": _regret,
    "learnability": lambda s, cfg, baseline, delayed: float(1.0 - s.mean_plain) if s.mean_plain > 0 else 0.0,
    "sfl": lambda s, cfg, baseline, delayed: float(s.mean_plain * (1.0 - s.mean_plain)),
    "mean_abs_advantage": lambda s, cfg, baseline, delayed: float(s.mean_abs_advantage),
    "learning_potential": _learning_potential,
    "micro_lp": lambda s, cfg, baseline, delayed: float(s.micro_lp),
}


def designer_reward(stats: EnvStats | None, cfg: DesignerRewardConfig = DesignerRewardConfig(),
                    rejected_at: str | None = None, *, baseline: float | None = None,
                    delayed: bool = True) -> float:
    """Raw designer reward of one program.

    ``stats`` None: the program has no played environment; ``rejected_at`` names the
    admission stage that rejected it (None: admitted, but every play failed). Under
    ``cfg.rejected == "drop"`` (the reference) a rejected program is not scored at all
    (`designer_scores` leaves it out, so asking here is an error) and an admitted one
    without plays is the reference's "no data": 0. Under "penalty" both are worth the
    failure penalty ("novelty": the duplicate penalty).
    ``delayed``: scored under ``designer.reward_delay`` > 0 (the reference's delayed path).

    Kinds (`REWARD_KINDS`; p = the mean plain reward, the reference's win rate):
      blend: see DesignerRewardConfig; without a delay, floored regret (the reference's
        undelayed path).
      regret: the regret itself (``window_regret`` under a delay, see `env_stats`).
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
        the skill's slow moving average (`update_learning_potentials`); it must be given.
        Plus the solver-variance reward with ``cfg.solver_variance``.
      micro_lp (the reference's): the environment's `micro_lp`, its improvement over the
        iterations it was played in.
      A program whose step timed out gets ``cfg.timeout_penalty`` under "regret", and under
      "blend" when scored as regret (no delay).
    """
    if stats is None:
        if cfg.rejected == "drop":
            if rejected_at is not None:
                raise ValueError("under designer.reward.rejected='drop' a rejected program has no reward")
            return 0.0
        return float(cfg.duplicate_penalty if rejected_at == "novelty" else cfg.failure_penalty)
    kind = "regret" if cfg.kind == "blend" and not delayed else cfg.kind
    if stats.timed_out and kind == "regret":
        return float(cfg.timeout_penalty)
    return REWARD_KINDS[kind](stats, cfg, baseline, delayed)


def designer_rewards(stats: Sequence[EnvStats | None], cfg: DesignerRewardConfig = DesignerRewardConfig(),
                     rejected_at: Sequence[str | None] | None = None, *,
                     baselines: Sequence[float | None] | None = None, delayed: bool = True) -> np.ndarray:
    """`designer_reward` of each designer sample, shape (N,) float64 (None = not played;
    ``rejected_at``: the rejecting stage of each sample, None for an admitted one;
    ``baselines``: each sample's skill baseline, needed by kind "learning_potential")."""
    stages = rejected_at if rejected_at is not None else [None] * len(stats)
    bases = baselines if baselines is not None else [None] * len(stats)
    return np.array([designer_reward(s, cfg, stage, baseline=b, delayed=delayed)
                     for s, stage, b in zip(stats, stages, bases)], dtype=np.float64)


__all__ = [
    "REJECTED_RULES", "REWARD_KINDS", "REWARD_SCALINGS", "STEP_TIMEOUT_PENALTY", "SUCCESS_REWARD",
    "DesignerRewardConfig", "EnvStats", "SkillRewardAverages", "designer_reward", "designer_reward_scale",
    "designer_rewards", "env_stats", "learning_potential_baselines", "micro_lp", "plateau", "solver_variance_reward",
    "update_learning_potentials", "wins",
]
