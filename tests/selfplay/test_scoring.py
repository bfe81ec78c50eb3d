"""Scoring an iteration (selfplay/scoring.py) against hand-computed numbers."""

import json
import math

import numpy as np
import pytest

from spade_jax.agent import EpisodeRequest, Trajectory
from spade_jax.rl.rewards import DesignerRewardConfig, SkillRewardAverages
from spade_jax.selfplay import scoring
from spade_jax.selfplay.state import LoopState, OldCheckpointError, PendingDesign, PoolEnv, design_env_id


def _env(env_id, plain, hinted, skill="logical deduction"):
    """Plays given as (seed, reward) were played in iteration 0."""
    plays = [[p if len(p) == 3 else (*p, 0) for p in side] for side in (plain, hinted)]
    return PoolEnv(env_id, "code", skill, None, design_iteration=0, plain=plays[0], hinted=plays[1])


def _trajectory(env_key, seed, reward, hinted, n_tokens=4):
    tokens = np.arange(n_tokens, dtype=np.int32)
    return Trajectory(EpisodeRequest(env_key, "code", seed, hinted=hinted), tokens, np.r_[False, [True] * (n_tokens - 1)],
                      np.zeros(n_tokens, np.float32), reward, reward == 1.0, 1, "terminated", None, [])


def _pending(env_id, skill="logical deduction", stage="novelty"):
    return PendingDesign(0, 0, 0, skill, "easy", None, env_id, stage, "", [1, 2], [3, 4], [-0.5, -0.25])


def test_env_statistics_compare_the_regeneration_steps_means_over_the_pool_stay():
    envs = [
        _env("a", plain=[(1, 1.0), (2, 0.0)], hinted=[(7, 1.0), (8, 1.0)]),  # hinted seeds of their own
        _env("b", plain=[(5, 0.0), (6, 0.0)], hinted=[(5, 1.0), (6, 0.0)]),
        _env("c", plain=[], hinted=[]),
    ]
    a, b, c = scoring.env_statistics(envs)
    assert (a.win_rate, a.mean_plain, a.mean_hinted, a.regret) == (0.5, 0.5, 1.0, 0.5)
    assert (b.win_rate, b.mean_hinted, b.regret) == (0.0, 0.5, 0.5)
    assert c is None


def test_agent_metrics_and_sequences():
    trajectories = [_trajectory(0, 1, 1.0, False), _trajectory(0, 2, 0.0, False), _trajectory(0, 1, 1.0, True),
                    _trajectory(0, 2, 1.0, True)]
    stats = scoring.env_statistics([_env("a", [(1, 1.0), (2, 0.0)], [(1, 1.0), (2, 1.0)])])
    metrics = scoring.agent_metrics(trajectories, stats)
    assert metrics["agent/plain_win_rate"] == 0.5 and metrics["agent/hinted_win_rate"] == 1.0
    assert metrics["env/regret_mean"] == 0.5 and metrics["agent/episodes"] == 4
    assert metrics["env/gap_mean"] == 0.5

    sequences = scoring.agent_sequences(trajectories, stats, train_hinted=False, regret_weighting=False,
                                        regret_temperature=1.0, weight=2.0)
    # plain plays only, advantages centred over the environment's plain rewards (1, 0) and scaled
    assert [s.role for s in sequences] == ["agent", "agent"] and [s.weight for s in sequences] == [2.0, 2.0]
    assert sequences[0].advantage > 0 > sequences[1].advantage
    assert math.isclose(sequences[0].advantage, -sequences[1].advantage)
    assert scoring.agent_sequences([], [], train_hinted=False, regret_weighting=True, regret_temperature=1.0,
                                   weight=1.0) == []


def test_a_frozen_role_packs_nothing_and_leaves_the_designer_scale_at_one():
    trajectories = [_trajectory(0, 1, 1.0, False), _trajectory(0, 2, 0.0, False)]
    stats = scoring.env_statistics([_env("a", [(1, 1.0), (2, 0.0)], [])])
    frozen = scoring.agent_sequences(trajectories, stats, train_hinted=False, regret_weighting=False,
                                     regret_temperature=1.0, weight=0.0)
    assert frozen == []
    due = [_pending("a"), _pending(None, stage="feasibility")]
    (a,) = scoring.env_statistics([_env("a", [(5, 0.0), (6, 0.0)], [(5, 1.0), (6, 0.0)])])
    auto = DesignerRewardConfig(rejected="penalty")
    # "auto" reads the agent sequences that train: none -> x1, 6 over 2 designs -> x3
    assert scoring.designer_scores(due, {"a": a}, auto, weight=1.0, n_agent_sequences=len(frozen)).scale == 1.0
    assert scoring.designer_scores(due, {"a": a}, auto, weight=1.0, n_agent_sequences=6).scale == 3.0
    unweighted = scoring.designer_scores(due, {"a": a}, auto, weight=0.0)
    np.testing.assert_allclose(unweighted.rewards, [0.4, -1.0])
    assert unweighted.sequences == []


def test_designer_scores_penalise_unplayed_designs_and_centre_per_skill():
    (stats,) = scoring.env_statistics([_env("a", [(5, 0.0), (6, 0.0)], [(5, 1.0), (6, 0.0)])])
    due = [_pending("a"), _pending(None, stage="feasibility"), _pending("gone", skill="optimization")]
    penalty = DesignerRewardConfig(rejected="penalty", scaling="none")
    scores = scoring.designer_scores(due, {"a": stats}, penalty, weight=0.5)
    # blend: 0.4 * clip(0.5 / 0.15, 0, 1) + 0.6 * plateau(win rate 0) = 0.4; no environment: -1
    np.testing.assert_allclose(scores.rewards, [0.4, -1.0, -1.0])
    assert scores.by_env_id == {"a": pytest.approx(0.4), "gone": -1.0}
    # centred within each skill: (0.4, -1) -> (0.7, -0.7); a skill of one: 0
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [0.7, -0.7, 0.0], atol=1e-12)
    tokens, mask = scores.sequences[0].tokens, scores.sequences[0].loss_mask
    assert tokens.tolist() == [1, 2, 3, 4] and mask.tolist() == [False, False, True, True]
    assert all(s.weight == 0.5 and s.role == "designer" for s in scores.sequences)
    assert scoring.designer_scores([], {}, DesignerRewardConfig(), weight=1.0).sequences == []
    # a near-duplicate (rejected at novelty) is graded apart from a broken program
    graded = scoring.designer_scores([_pending(None), _pending(None, stage="load")], {}, penalty, weight=1.0)
    np.testing.assert_allclose(graded.rewards, [-0.25, -1.0])
    # the reference ("drop"): rejected samples leave the update, an admitted one without plays scores 0
    dropped = scoring.designer_scores(due, {"a": stats}, DesignerRewardConfig(scaling="none"), weight=0.5)
    np.testing.assert_allclose(dropped.rewards, [0.4, 0.0])
    assert dropped.by_env_id == {"a": pytest.approx(0.4), "gone": 0.0}


def test_env_statistics_give_the_micro_lp_of_the_plain_plays_by_iteration():
    env = _env("a", plain=[(1, 0.0, 4), (2, 0.0, 4), (3, 1.0, 5), (4, 1.0, 6), (5, 0.0, 6)],
               hinted=[(1, 1.0, 4), (2, 1.0, 4)])
    (stats,) = scoring.env_statistics([env])
    # iterations 4 | 5, 6: early mean 0, late mean (1 + 1 + 0) / 3
    assert stats.micro_lp == pytest.approx(2 / 3)
    assert stats.regret == pytest.approx(1.0)  # seeds 1 and 2: plain 0, hinted 1


def test_learning_potential_scores_carry_the_skill_averages_between_scorings():
    cfg = DesignerRewardConfig(kind="learning_potential", rejected="penalty")
    stats = scoring.env_statistics([
        _env("a", [(1, 0.0), (2, 0.0)], []),
        _env("b", [(1, 1.0), (2, 1.0), (3, 1.0), (4, 0.0), (5, 1.0), (6, 1.0)], []),
    ])
    due = [_pending("a"), _pending("b"), _pending(None, skill="optimization", stage="load")]
    first = scoring.designer_scores(due, dict(zip("ab", stats)), cfg, weight=1.0)
    # pooled mean 5 / 8 starts both averages; rewards |0 - 0.625|, |5/6 - 0.625|; the failure -1
    assert first.skill_averages == {"logical deduction": SkillRewardAverages(0.625, 0.625)}
    np.testing.assert_allclose(first.rewards, [0.625, 5 / 6 - 0.625, -1.0])
    (c,) = scoring.env_statistics([_env("c", [(1, 0.0), (2, 1.0), (3, 0.0), (4, 0.0)], [])])
    second = scoring.designer_scores([_pending("c"), _pending("c")], {"c": c}, cfg, weight=1.0,
                                     skill_averages=first.skill_averages)
    # slow average 0.15 * 0.625 + 0.85 * 0.25 = 0.30625; the input dict is left as it was
    assert second.skill_averages["logical deduction"].mu_slow == pytest.approx(0.30625)
    np.testing.assert_allclose(second.rewards, [0.05625, 0.05625])
    assert first.skill_averages["logical deduction"].mu_slow == 0.625
    # other kinds pass the averages through untouched
    blend = scoring.designer_scores([_pending("c")], {"c": c}, DesignerRewardConfig(), weight=1.0,
                                    skill_averages=first.skill_averages)
    assert blend.skill_averages == first.skill_averages


def test_designer_scores_scale_the_centred_rewards():
    (stats,) = scoring.env_statistics([_env("a", [(5, 0.0), (6, 0.0)], [(5, 1.0), (6, 0.0)])])
    due = [_pending("a"), _pending(None, stage="feasibility")]
    # auto: 8 agent sequences / 2 designer samples * period 3 = 12; centred (0.4, -1) -> (0.7, -0.7)
    scores = scoring.designer_scores(due, {"a": stats}, DesignerRewardConfig(rejected="penalty"), weight=1.0,
                                     n_agent_sequences=8, regeneration_period=3)
    assert scores.scale == 12.0
    np.testing.assert_allclose([s.advantage for s in scores.sequences], [8.4, -8.4])
    np.testing.assert_allclose(scores.rewards, [0.4, -1.0])  # the rewards themselves are not scaled
    unscaled = scoring.designer_scores(due, {"a": stats}, DesignerRewardConfig(rejected="penalty", scaling="none"),
                                       weight=1.0, n_agent_sequences=8, regeneration_period=3)
    assert unscaled.scale == 1.0
    np.testing.assert_allclose([s.advantage for s in unscaled.sequences], [0.7, -0.7])


def test_loop_state_round_trip_and_old_checkpoints():
    state = LoopState(iteration=3, pool=[_env("a", [(1, 0.5, 2)], [(1, 1.0, 2)])],
                      skill_averages={"optimization": SkillRewardAverages(0.1, 0.3)})
    restored = LoopState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored == state
    old = state.to_json()
    old["pool"][0]["plain"] = [[1, 0.5]]  # a play written before plays kept their iteration
    with pytest.raises(OldCheckpointError, match="resume it with spade_jax at that commit"):
        LoopState.from_json(old)
    old = state.to_json()
    del old["skill_averages"]
    with pytest.raises(OldCheckpointError):
        LoopState.from_json(old)


def test_design_env_id():
    assert design_env_id(3, 7) == "it0003-slot07"


def test_derive_seed_is_a_seed_sequence_of_its_parts():
    from spade_jax.seeds import derive_seed

    assert derive_seed(0, 3, 1) == int(np.random.SeedSequence([0, 3, 1]).generate_state(1)[0])
    assert derive_seed(0, "aime", 0) == derive_seed(0, "aime", 0) != derive_seed(0, "gpqa", 0)


def test_agent_metrics_per_skill_and_for_new_and_replayed_environments():
    envs = [_env("a", [(1, 1.0), (2, 0.0)], [(1, 0.0), (2, 0.0)], skill="logical deduction"),  # gap -0.5
            _env("b", [(3, 0.0), (4, 0.0)], [(3, 1.0), (4, 1.0)], skill="pattern recognition")]  # gap +1
    envs[1].is_replay = True
    trajectories = [_trajectory(0, 1, 1.0, False), _trajectory(0, 2, 0.0, False), _trajectory(1, 3, 0.0, False),
                    _trajectory(1, 4, 0.0, False), _trajectory(0, 1, 0.0, True), _trajectory(1, 3, 1.0, True)]
    metrics = scoring.agent_metrics(trajectories, scoring.env_statistics(envs), envs)
    assert metrics["env/gap_mean"] == pytest.approx(0.25) and metrics["env/regret_mean"] == 0.5
    assert metrics["skill/logical_deduction/plain_win_rate"] == 0.5 and metrics["skill/logical_deduction/regret"] == 0.0
    assert metrics["skill/pattern_recognition/plain_win_rate"] == 0.0
    assert metrics["skill/pattern_recognition/regret"] == 1.0
    assert (metrics["env/new"], metrics["env/replayed"]) == (1, 1)
    assert metrics["agent/new_plain_win_rate"] == 0.5 and metrics["agent/replayed_plain_win_rate"] == 0.0
