"""The designer's learning signal against the reference's rules (spade-rl/spade).

Each test computes one rule of the reference on a case read off its code
(`spade/core/utils/delayed_env_rewards.py`, `env_rewards.py`, `spade/slime/spade_rollout.py`)
or its own tests (`tests/test_delayed_env_rewards.py`, `tests/test_env_reward_assignment.py`,
whose inputs and expected numbers are reused here), and checks that spade_jax's default
settings give the same numbers. `reference_delayed_blend` below is an independent statement
of the reference's delayed blend, written from its code, for the end-to-end recipe check.
"""

import numpy as np
import pytest

from spade_jax.rl import rewards as R
from spade_jax.rl.advantages import designer_advantages
from spade_jax.selfplay import scoring
from spade_jax.selfplay.state import PendingDesign, PoolEnv


def _env(env_id, plain, hinted=(), skill="logic", timeouts=0):
    """A pool environment from ``{iteration: [rewards]}`` plays (seeds 0.. within an iteration,
    hinted plays on the plain plays' seeds, as the loop plays them)."""
    plays = lambda by_it: [(seed, float(r), it) for it, rs in by_it.items() for seed, r in enumerate(rs)]
    return PoolEnv(env_id, "code", skill, None, design_iteration=0, plain=plays(plain),
                   hinted=plays(dict(hinted)), step_timeouts=timeouts)


def _pending(env_id, skill="logic", stage="novelty"):
    return PendingDesign(design_iteration=0, due_iteration=0, slot=0, skill=skill, difficulty="medium", doc_id=None,
                         env_id=env_id, stage=stage, reason="", prompt_tokens=[1], tokens=[2], logprobs=[0.0])


def _scores(envs, cfg=R.DesignerRewardConfig(), *, delayed=True, pending=None, n_agent=0, period=4):
    stats = dict(zip([e.env_id for e in envs], scoring.env_statistics(envs)))
    due = pending if pending is not None else [_pending(e.env_id, e.skill) for e in envs]
    return scoring.designer_scores(due, {k: v for k, v in stats.items() if v is not None}, cfg, weight=1.0,
                                   n_agent_sequences=n_agent, regeneration_period=period, delayed=delayed,
                                   timed_out=frozenset(e.env_id for e in envs if e.step_timeouts))


def _plateau(p, low=0.4, high=0.6, ramp=0.25):
    if p < low:
        return max(0.0, 1.0 - (low - p) / ramp)
    if p > high:
        return max(0.0, 1.0 - (p - high) / ramp)
    return 1.0


def reference_delayed_blend(games, *, scale, regret_weight=0.4, plateau_weight=0.6, regret_scale=0.15):
    """The reference's delayed blend with its recipe's flags (plateau 0.4/0.6/0.25, floored regret,
    micro-LP and frontier weights 0): ``games`` maps a game to (skill, {offset: plain rewards},
    hint reward or None). R_hint is the regeneration step's hinted mean (0 when the hint failed),
    regret = R_hint - mean plain at offset 0, clipped to [0, 1] after dividing by its scale; the win
    rate is the mean of every plain reward of the window; rewards are centred per skill, times
    the scale. Returns {game: reward}."""
    raw = {}
    for game, (skill, by_offset, r_hint) in games.items():
        regret = (r_hint or 0.0) - float(np.mean(by_offset[0]))
        win_rate = float(np.mean([r for rs in by_offset.values() for r in rs]))
        raw[game] = (skill, regret_weight * min(max(regret / regret_scale, 0.0), 1.0)
                     + plateau_weight * _plateau(win_rate))
    out = {}
    for skill in {s for s, _ in raw.values()}:
        members = {g: v for g, (s, v) in raw.items() if s == skill}
        mean = float(np.mean(list(members.values())))
        out.update({g: (v - mean) * scale for g, v in members.items()})
    return out


def test_the_win_rate_of_non_binary_rewards_is_their_mean_and_the_designer_advantage_follows():
    # delayed_env_rewards.py: win_rate = mean of the window's plain rewards
    mixed = _env("mixed", {0: [1, 1, 1, 1, 0, -1, 0, -1]})  # mean 0.25 (the share of wins is 0.5)
    steady = _env("steady", {0: [1, 1, 1, 0, 0, 0, 0, 0]})  # mean 0.375 = the share of wins
    (stats, _) = scoring.env_statistics([mixed, steady])
    assert stats.mean_plain == 0.25 and stats.win_rate == 0.5
    # blend (no hinted plays, regret 0): 0.6 * plateau(0.25) = 0.24 and 0.6 * plateau(0.375) = 0.54;
    # centred in their skill and scaled x 32: -4.8 and +4.8. The share of wins would give 0.6 for
    # `mixed` and flip both signs.
    scores = _scores([mixed, steady], R.DesignerRewardConfig(scaling="fixed", scale=32.0))
    np.testing.assert_allclose(scores.rewards, [0.24, 0.54])
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [-4.8, 4.8])


def test_under_a_delay_the_blend_regret_comes_from_the_regeneration_step_plays_only():
    # orchestrator.py: hints are written and played only when the pool regenerates; the blend's
    # regret is that step's R_hint minus that step's plain mean (offset 0). Later plain plays move
    # only the win rate.
    env = _env("g", {0: [0.0, 0.0], 1: [1.0, 1.0], 2: [1.0, 1.0], 3: [1.0, 1.0]},
               hinted={0: [1.0, 0.0], 1: [1.0, 1.0]})  # an extra hinted round at 1 must not count
    (s,) = scoring.env_statistics([env])
    assert s.regret == pytest.approx(0.5)  # iteration 0 only: 0.5 - 0
    assert s.window_regret == 0.0  # kind "regret": 0.5 - the window's plain mean 0.75, floored


def test_regret_kind_under_a_delay_subtracts_the_window_plain_mean_and_penalises_step_timeouts():
    # test_delayed_env_rewards.py::test_regret_floors_negatives_and_penalizes_step_timeouts
    helpful = _env("g1", {0: [0.2], 1: [0.2]}, hinted={0: [0.8]})  # 0.8 - 0.2 = 0.6
    unhelpful = _env("g2", {0: [0.5], 1: [0.5]}, hinted={0: [0.1]})  # 0.1 - 0.5 -> floored 0
    timed_out = PoolEnv("g3", "code", "math", None, design_iteration=0, step_timeouts=1)  # no plays survive
    no_data = PoolEnv("g4", "code", "math", None, design_iteration=0)  # no hint, no plays
    cfg = R.DesignerRewardConfig(kind="regret", scaling="fixed", scale=10.0)
    pending = [_pending("g1"), _pending("g2"), _pending("g3", "math"), _pending("g4", "math")]
    scores = _scores([helpful, unhelpful, timed_out, no_data], cfg, pending=pending)
    np.testing.assert_allclose(scores.rewards, [0.6, 0.0, -0.5, 0.0])
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [3.0, -3.0, -2.5, 2.5])


def test_without_a_delay_a_step_timeout_overrides_the_designer_reward():
    # test_env_reward_assignment.py::test_regret_step_timeout_and_failed_first_turn_keep_bounded_signals
    # (the reference's immediate path scores "blend" as floored regret): raw -0.5, 0.5 at scale 3
    timeout = _env("timeout", {0: [0.0]}, hinted={0: [1.0]}, timeouts=1)
    valid = _env("valid", {0: [0.5]}, hinted={0: [1.0]})
    scores = _scores([timeout, valid], R.DesignerRewardConfig(scaling="fixed", scale=3.0), delayed=False)
    np.testing.assert_allclose(scores.rewards, [-0.5, 0.5])
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [-1.5, 1.5])


def test_the_plateau_blend_of_the_reference_test():
    # test_delayed_env_rewards.py::test_blend_plateau_config_keeps_every_game_non_negative
    easy = _env("g1", {0: [1.0, 1.0], 1: [1.0, 1.0]})  # no hint: regret floored to 0, plateau 0
    in_band = _env("g2", {0: [0.5, 0.5], 1: [0.5, 0.5]}, hinted={0: [0.8, 0.8]})
    hard = _env("g3", {0: [0.2, 0.2], 1: [0.2, 0.2]}, hinted={0: [0.275, 0.275]}, skill="math")
    cfg = R.DesignerRewardConfig(regret_weight=1.0, plateau_weight=1.0, scaling="none")
    scores = _scores([easy, in_band, hard], cfg)
    np.testing.assert_allclose(scores.rewards, [0.0, 2.0, 0.7])
    # logic (0, 2) -> mean 1; math has one game, which the reference centres on itself: 0
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [-1.0, 1.0, 0.0])


def test_a_rejected_program_never_enters_the_designer_update():
    # A program broken after its attempts is dropped by the reference, not trained on a penalty.
    env = _env("a", {0: [0.0, 1.0]})
    scores = _scores([env], pending=[_pending("a"), _pending(None, stage="feasibility")])
    assert len(scores.sequences) == 1 and len(scores.rewards) == 1
    penalised = _scores([env], R.DesignerRewardConfig(rejected="penalty"),
                        pending=[_pending("a"), _pending(None, stage="feasibility")])
    assert len(penalised.sequences) == 2 and penalised.rewards[1] == -1.0


def test_an_environment_without_hinted_plays_has_regret_zero():
    # hint_generator.py: a failed hint gives R_hint 0, so regret max(0, 0 - plain) = 0
    (s,) = scoring.env_statistics([_env("a", {0: [0.0, 0.0, 1.0, 0.0]})])
    assert s.regret == 0.0 and R.designer_reward(s, R.DesignerRewardConfig(kind="regret")) == 0.0


def test_the_solver_variance_reward_needs_more_than_one_play():
    # test_delayed_env_rewards.py::test_delayed_baseline_variance_reward_needs_more_than_one_play
    two_plays, one_play = _env("g1", {0: [0.0], 1: [1.0]}), _env("g2", {0: [0.5]})
    cfg = R.DesignerRewardConfig(kind="learning_potential", solver_variance=True, scaling="fixed", scale=2.0)
    stats = scoring.env_statistics([two_plays, one_play])
    raw = R.designer_rewards(stats, cfg, baselines=[0.5, 0.5])
    np.testing.assert_allclose(raw, [1.0, 0.0])  # |0.5 - 0.5| + exp(0) for two plays, nothing for one
    np.testing.assert_allclose(designer_advantages(raw, ["logic", "logic"], 2.0), [1.0, -1.0])


def test_the_four_four_recipe_gives_the_reference_designer_advantages_on_recorded_plays():
    """Regenerate every 4, delay 4, blend: six designs of three skills with non-binary rewards, a
    failed hint, a skill of one, plays at offsets 0..3 and hinted plays at the regeneration step."""
    recorded = {
        "a": ("logic", {0: [0.0, 0.0, 1.0, 0.0], 1: [0.0, 1.0, 0.0, 0.0], 2: [1.0, 1.0, 0.0, 0.0],
                        3: [1.0, 0.0, 1.0, 1.0]}, [1.0, 1.0, 1.0, 0.0]),
        "b": ("logic", {0: [1.0, 1.0, 1.0, 1.0], 1: [1.0, 1.0, 1.0, 0.0], 2: [1.0] * 4, 3: [1.0] * 4},
              [1.0] * 4),
        "c": ("math", {0: [0.5, -1.0, 0.0, 0.5], 1: [1.0, 0.5, 0.0, 0.0], 2: [0.5, 0.5, 0.5, 0.5],
                       3: [0.0, 1.0, 0.0, 0.5]}, [1.0, 0.5, 0.5, 1.0]),
        "d": ("math", {0: [0.0] * 4, 1: [0.0] * 4, 2: [0.0, 0.0, 1.0, 0.0], 3: [0.0] * 4}, None),  # hint failed
        "e": ("math", {0: [1.0, 0.0, 1.0, -1.0], 1: [0.0, 0.0, 1.0, 1.0], 2: [1.0, -1.0, 0.0, 0.0],
                       3: [1.0, 1.0, 1.0, 0.0]}, [1.0, 1.0, 0.0, 0.0]),
        "f": ("planning", {0: [0.0, 1.0, 0.0, 1.0], 1: [0.0, 1.0, 1.0, 1.0], 2: [1.0, 0.0, 1.0, 1.0],
                           3: [0.0, 1.0, 0.0, 0.0]}, [1.0, 1.0, 1.0, 1.0]),
    }
    envs = [_env(g, plain, {0: hinted} if hinted else {}, skill=skill) for g, (skill, plain, hinted) in recorded.items()]
    scores = _scores(envs, n_agent=48, period=4)  # auto scale: 48 agent sequences / 6 designs x 4 = 32
    assert scores.scale == 32.0
    expected = reference_delayed_blend(
        {g: (skill, plain, float(np.mean(hinted)) if hinted else None) for g, (skill, plain, hinted) in recorded.items()},
        scale=32.0)
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [expected[g] for g in recorded], atol=1e-9)
    assert {round(expected[g], 6) for g in recorded} != {0.0}  # the case is not degenerate


def test_hinted_plays_have_seeds_of_their_own_and_regret_compares_means():
    # orchestrator.py: plain plays reset unseeded, hinted plays on seeds of their own (1818)
    env = PoolEnv("a", "code", "logic", None, design_iteration=0,
                  plain=[(1, 0.0, 0), (2, 1.0, 0), (3, 0.0, 0), (4, 0.0, 0)],
                  hinted=[(11, 1.0, 0), (12, 1.0, 0), (13, 0.0, 0), (14, 1.0, 0)])
    (s,) = scoring.env_statistics([env])
    assert s.regret == pytest.approx(0.75 - 0.25)



def test_learning_potential_without_a_delay_reads_the_baseline_before_updating_it():
    """env_rewards.py:107-128 (the immediate path): each game is measured against its skill's slow
    average as it stood (0 before the first update), then the averages are updated; the delayed
    path (delayed_env_rewards.py:129-162) updates first, then reads."""
    cfg = R.DesignerRewardConfig(kind="learning_potential", scaling="none")
    a, b = _env("a", {0: [0.0, 0.0]}), _env("b", {0: [1.0, 1.0, 1.0, 0.0]})
    first = _scores([a, b], cfg, delayed=False)
    np.testing.assert_allclose(first.rewards, [0.0, 0.75])  # baseline 0: nothing averaged yet
    assert first.skill_averages["logic"].mu_slow == pytest.approx(0.5)  # (0 + 0 + 1 + 1 + 1 + 0) / 6
    stats = dict(zip("ab", scoring.env_statistics([a, b])))
    later = scoring.designer_scores([_pending("a"), _pending("b")], stats, cfg, weight=1.0, delayed=False,
                                    skill_averages=first.skill_averages)
    np.testing.assert_allclose(later.rewards, [0.5, 0.25])  # against 0.5, the average before this update
    delayed = _scores([a, b], cfg, delayed=True)
    np.testing.assert_allclose(delayed.rewards, [0.5, 0.25])  # the first update sets the baseline to 0.5
