"""Episode rewards, environment statistics and every designer reward variant, by hand."""
import math

import numpy as np
import pytest

from spade_jax.envs.contract import episode_reward
from spade_jax.rl import rewards as R


def test_episode_rewards_clip_truncation_and_timeout():
    final = [0.5, 2.0, -3.0, 1.0, 0.7, float("nan")]
    terminated = [True, True, True, False, True, False]
    timed_out = [False, False, False, False, True, True]
    assert [episode_reward(*e) for e in zip(final, terminated, timed_out)] == [0.5, 1.0, -1.0, 0.0, -0.5, -0.5]
    assert [episode_reward(*e, timeout_penalty=-0.3) for e in zip(final, terminated, timed_out)] == [
        0.5, 1.0, -1.0, 0.0, -0.3, -0.3]
    assert [episode_reward(0.25, t) for t in (True, False)] == [0.25, 0.0]


def test_episode_rewards_rejects_non_finite_terminated_reward():
    with pytest.raises(ValueError, match="non-finite reward"):
        episode_reward(float("inf"), True)


def test_wins_use_contract_success():
    np.testing.assert_array_equal(R.wins([1.0, 0.999, 1.0 - 1e-7, -1.0, 0.0]),
                                  [True, False, True, False, False])


def test_env_stats_by_hand():
    s = R.env_stats([1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0])
    assert (s.n_plain, s.n_hinted) == (4, 4)
    assert s.win_rate == 0.5 and s.mean_plain == 0.5
    assert s.mean_hinted == 0.75 and s.hinted_win_rate == 0.75
    assert s.regret == pytest.approx(0.25)
    assert s.mean_abs_advantage == pytest.approx(0.5)


def test_env_stats_partial_rewards_and_negative_gap():
    s = R.env_stats([0.2, -0.5, 1.0], [0.0, 0.0, 0.0])
    assert s.win_rate == pytest.approx(1 / 3)
    assert s.mean_plain == pytest.approx(0.7 / 3)
    # |0.2-0.2333| + |-0.5-0.2333| + |1-0.2333| = 0.0333 + 0.7333 + 0.7667 = 1.5333
    assert s.mean_abs_advantage == pytest.approx(1.5333333 / 3, abs=1e-6)
    assert s.regret == 0.0  # hints made it worse: clipped at 0


def test_env_stats_compare_means_and_without_hints_regret_is_zero():
    s = R.env_stats([1.0, 0.0, 0.0], [1.0, 1.0])
    assert s.mean_plain == pytest.approx(1 / 3) and s.regret == pytest.approx(2 / 3)
    s = R.env_stats([1.0, 0.0])
    assert math.isnan(s.mean_hinted) and math.isnan(s.hinted_win_rate) and s.regret == 0.0
    with pytest.raises(ValueError, match="at least one plain"):
        R.env_stats([], [1.0])
    with pytest.raises(ValueError, match="regret_iteration needs"):
        R.env_stats([1.0], [1.0], regret_iteration=0)


@pytest.mark.parametrize("p,expected", [
    (0.5, 1.0), (0.4, 1.0), (0.6, 1.0), (0.3, 0.6), (0.2, 0.2), (0.15, 0.0), (0.0, 0.0),
    (0.7, 0.6), (0.85, 0.0), (1.0, 0.0),
])
def test_plateau(p, expected):
    assert float(R.plateau(p)) == pytest.approx(expected)


def _stats(win_rate, regret, mean_abs_advantage=0.0):
    return R.EnvStats(n_plain=16, n_hinted=16, win_rate=win_rate, mean_plain=win_rate,
                      mean_hinted=win_rate + regret, hinted_win_rate=win_rate + regret,
                      regret=regret, mean_abs_advantage=mean_abs_advantage, window_regret=regret)


def test_blend_reward_by_hand():
    blend = R.DesignerRewardConfig()
    assert R.designer_reward(_stats(0.3, 0.06), blend) == pytest.approx(0.4 * 0.4 + 0.6 * 0.6)
    assert R.designer_reward(_stats(0.5, 0.30), blend) == pytest.approx(1.0)
    assert R.designer_reward(_stats(0.0, 0.0), blend) == 0.0  # impossible env
    assert R.designer_reward(_stats(1.0, 0.0), blend) == 0.0  # trivial env
    assert R.designer_reward(_stats(0.9, 0.15), blend) == pytest.approx(0.4)
    custom = R.DesignerRewardConfig(regret_weight=0.5, regret_scale=0.1, plateau_weight=0.5,
                                    plateau_low=0.3, plateau_high=0.5, plateau_ramp=0.1)
    # regret 0.05/0.1 = 0.5; p = 0.55 is 0.05 above the plateau: 1 - 0.05/0.1 = 0.5
    assert R.designer_reward(_stats(0.55, 0.05), custom) == pytest.approx(0.5)


def test_other_variants_by_hand():
    s = _stats(0.25, 0.125, mean_abs_advantage=0.375)
    assert R.designer_reward(s, R.DesignerRewardConfig(kind="regret")) == 0.125
    assert R.designer_reward(s, R.DesignerRewardConfig(kind="learnability")) == 0.75
    assert R.designer_reward(_stats(0.0, 0.0), R.DesignerRewardConfig(kind="learnability")) == 0.0
    assert R.designer_reward(_stats(1.0, 0.0), R.DesignerRewardConfig(kind="learnability")) == 0.0
    assert R.designer_reward(s, R.DesignerRewardConfig(kind="sfl")) == pytest.approx(0.1875)
    assert R.designer_reward(s, R.DesignerRewardConfig(kind="mean_abs_advantage")) == 0.375


def test_mean_abs_advantage_from_episodes_is_two_p_one_minus_p_for_binary_rewards():
    s = R.env_stats([1.0, 0.0, 0.0, 0.0])
    lp = R.designer_reward(s, R.DesignerRewardConfig(kind="mean_abs_advantage"))
    assert lp == pytest.approx(2 * 0.25 * 0.75)


def test_learning_potential_is_the_distance_from_the_skill_slow_average_updated_first():
    cfg = R.DesignerRewardConfig(kind="learning_potential")  # gammas 0.98 / 0.85
    g1 = R.env_stats([0.0, 0.0])  # mean 0
    g2 = R.env_stats([1.0, 1.0, 1.0, 0.0, 1.0, 1.0])  # mean 5/6
    other = R.env_stats([1.0])
    # first update: both averages start at the skill's pooled mean 5 / 8 (not the mean of means 5 / 12);
    # a skill without a played sample is left out
    averages = R.update_learning_potentials({}, ["logic", "logic", "math", "math"], [g1, g2, None, None], cfg)
    assert averages == {"logic": R.SkillRewardAverages(0.625, 0.625)}
    rewards = R.designer_rewards([g1, g2, None], cfg, baselines=[0.625, 0.625, None])
    np.testing.assert_allclose(rewards, [0.625, 5 / 6 - 0.625, 0.0])  # unplayed: the reference's "no data"
    # second update with mean 0.25: slow 0.15 * 0.625 + 0.85 * 0.25, fast 0.02 * 0.625 + 0.98 * 0.25
    g3 = R.env_stats([0.0, 1.0, 0.0, 0.0])
    averages = R.update_learning_potentials(averages, ["logic", "optimization"], [g3, other], cfg)
    assert averages["logic"].mu_slow == pytest.approx(0.30625) and averages["logic"].mu_fast == pytest.approx(0.2575)
    assert averages["optimization"] == R.SkillRewardAverages(1.0, 1.0)
    assert R.designer_reward(g3, cfg, baseline=averages["logic"].mu_slow) == pytest.approx(0.05625)
    # the reference's rho (monitoring only): |0.2575 - 0.30625| / (2 (0.98 - 0.85))
    assert averages["logic"].potential(0.98, 0.85) == pytest.approx(0.1875)
    with pytest.raises(ValueError, match="baseline"):
        R.designer_reward(g3, cfg)


@pytest.mark.parametrize("by_iteration,expected", [
    ({0: [0.0, 0.0], 2: [1.0, 1.0]}, 1.0),
    ({0: [0.25, 0.25], 1: [0.75, 0.75]}, 0.5),
    ({0: [0.0], 1: [0.5], 2: [1.0]}, 0.75),  # odd: the middle iteration is late
    ({0: [0.0, 0.0, 0.0, 1.0], 1: [1.0], 2: [1.0], 3: [0.0, 1.0]}, 2 / 3 - 0.4),  # pooled halves
    ({0: [1.0], 1: [0.0]}, 0.0),  # got worse: floored
    ({3: [0.0, 1.0]}, 0.0),  # one iteration
])
def test_micro_lp_by_hand(by_iteration, expected):
    rewards = [r for rs in by_iteration.values() for r in rs]
    iterations = [i for i, rs in by_iteration.items() for _ in rs]
    assert R.micro_lp(rewards, iterations) == pytest.approx(expected)
    s = R.env_stats(rewards, plain_iterations=iterations)
    assert R.designer_reward(s, R.DesignerRewardConfig(kind="micro_lp")) == pytest.approx(expected)


def test_micro_lp_needs_one_iteration_per_play():
    assert R.env_stats([0.0, 1.0]).micro_lp == 0.0
    with pytest.raises(ValueError, match="one iteration per reward"):
        R.micro_lp([1.0, 0.0], [1])


def test_designer_reward_scale():
    assert R.designer_reward_scale(R.DesignerRewardConfig(), 24, 192, 4) == 32.0  # "auto", the reference's
    assert R.designer_reward_scale(R.DesignerRewardConfig(scaling="none"), 24, 192, 4) == 1.0
    assert R.designer_reward_scale(R.DesignerRewardConfig(scaling="fixed", scale=3.0), 24, 192, 4) == 3.0
    auto = R.DesignerRewardConfig(scaling="auto")
    assert R.designer_reward_scale(auto, 24, 192, 4) == 32.0  # the paper's schedule
    assert R.designer_reward_scale(auto, 2, 8, 3) == 12.0
    assert R.designer_reward_scale(auto, 8, 1000, 4) == 50.0  # capped at max_scale
    assert R.designer_reward_scale(R.DesignerRewardConfig(scaling="auto", max_scale=10.0), 2, 8, 3) == 10.0
    assert R.designer_reward_scale(auto, 0, 8, 3) == R.designer_reward_scale(auto, 8, 0, 3) == 1.0


def test_failures_get_penalty_and_batch_function():
    cfg = R.DesignerRewardConfig(kind="sfl", failure_penalty=-0.7, rejected="penalty")
    out = R.designer_rewards([_stats(0.5, 0.0), None, _stats(0.1, 0.0)], cfg)
    np.testing.assert_allclose(out, [0.25, -0.7, 0.09])
    penalty = R.DesignerRewardConfig(rejected="penalty")
    assert R.designer_reward(None, penalty) == -1.0
    assert R.designer_reward(None, penalty, rejected_at="novelty") == -0.25
    assert R.designer_reward(None, R.DesignerRewardConfig(duplicate_penalty=-0.5, rejected="penalty"), "novelty") == -0.5
    np.testing.assert_allclose(R.designer_rewards([None, None], cfg, ["novelty", "contract"]), [-0.25, -0.7])
    # the reference ("drop"): an admitted program without plays is "no data", a rejected one is not scored
    assert R.designer_reward(None) == 0.0
    with pytest.raises(ValueError, match="no reward"):
        R.designer_reward(None, rejected_at="contract")


def test_config_validation():
    with pytest.raises(ValueError, match="unknown"):
        R.DesignerRewardConfig(kind="nope")
    with pytest.raises(ValueError, match="> 0"):
        R.DesignerRewardConfig(regret_scale=0.0)
    with pytest.raises(ValueError, match="plateau_low"):
        R.DesignerRewardConfig(plateau_low=0.7, plateau_high=0.6)
    with pytest.raises(ValueError, match="lp_gamma_slow < lp_gamma_fast"):
        R.DesignerRewardConfig(lp_gamma_fast=0.5, lp_gamma_slow=0.9)
    with pytest.raises(ValueError, match="scaling"):
        R.DesignerRewardConfig(scaling="simple")
    with pytest.raises(ValueError, match="scale and max_scale"):
        R.DesignerRewardConfig(scaling="fixed", scale=0.0)
