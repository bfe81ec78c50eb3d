"""Designer centring, agent z-scores and regret-rank weights, by hand."""
import numpy as np
import pytest

from spade_jax.rl import advantages as A


def test_designer_advantages_centre_per_skill_without_std():
    rewards = [1.0, 0.0, -1.0, 0.5, 0.3]
    skills = ["a", "a", "b", "b", "a"]
    # mean a = 1.3 / 3, mean b = -0.25
    np.testing.assert_allclose(A.designer_advantages(rewards, skills),
                               [1 - 1.3 / 3, -1.3 / 3, -0.75, 0.75, 0.3 - 1.3 / 3])
    with pytest.raises(ValueError, match="one group label per value"):
        A.designer_advantages([1.0, 2.0], ["a"])


def test_a_designer_sample_alone_in_its_skill_gets_zero():
    # a: mean 2; b and c alone: 0 as in the reference
    np.testing.assert_allclose(A.designer_advantages([1.0, 3.0, 0.5, 2.0], ["a", "a", "b", "c"]),
                               [-1.0, 1.0, 0.0, 0.0])


def test_designer_advantages_are_scaled_after_centring():
    # a: mean 2 -> (-1, 1); b alone: 0; then x 10
    np.testing.assert_allclose(A.designer_advantages([1.0, 3.0, 2.5], ["a", "a", "b"], scale=10.0),
                               [-10.0, 10.0, 0.0])


def test_zscore_by_hand_and_all_equal():
    np.testing.assert_array_equal(A.zscore([1.0, 0.0, 0.0, 1.0], eps=0.0), [1.0, -1.0, -1.0, 1.0])
    np.testing.assert_allclose(A.zscore([1.0, 0.0, 0.0, 1.0], eps=0.5), [0.5, -0.5, -0.5, 0.5])
    np.testing.assert_array_equal(A.zscore([0.1, 0.1, 0.1]), [0.0, 0.0, 0.0])
    assert A.zscore([]).shape == (0,)


def _episodes():
    # env e1: plain 1,0,0,1; hinted 1,0,1.   env e2: plain 0.5,0.5; hinted 1.
    rewards = [1.0, 0.0, 1.0, 0.0, 0.5, 0.0, 1.0, 0.5, 1.0, 1.0]
    envs = ["e1", "e1", "e1", "e1", "e2", "e1", "e1", "e2", "e1", "e2"]
    hinted = [False, False, True, False, False, True, False, False, True, True]
    return rewards, envs, hinted


def test_agent_advantages_plain_only_by_default():
    out = A.agent_advantages(*_episodes(), eps=0.0)
    np.testing.assert_array_equal(out.advantages, [1, -1, 0, -1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(out.train, [True, True, False, True, True, False, True, True,
                                              False, False])


def test_agent_advantages_hinted_own_group():
    out = A.agent_advantages(*_episodes(), eps=0.0, train_hinted=True)
    s = np.sqrt(2.0) / 2  # hinted e1 = (1, 0, 1): mean 2/3, std sqrt(2)/3
    np.testing.assert_allclose(out.advantages, [1, -1, s, -1, 0, -2 * s, 1, 0, s, 0])
    assert out.train.all()


def test_agent_advantages_hinted_plain_baseline():
    out = A.agent_advantages(*_episodes(), eps=0.0, train_hinted=True, hinted_baseline="plain")
    # e1 plain mean 0.5 std 0.5 -> hinted 1,0,1 -> 1,-1,1; e2 plain all 0.5 (std 0) ->
    # the hinted 1.0 is only centred: 0.5
    np.testing.assert_allclose(out.advantages, [1, -1, 1, -1, 0, -1, 1, 0, 1, 0.5])
    out = A.agent_advantages(*_episodes(), eps=0.25, train_hinted=True, hinted_baseline="plain")
    np.testing.assert_allclose(out.advantages[[0, 2, 9]], [0.5 / 0.75, 0.5 / 0.75, 0.5])


def test_agent_advantages_errors():
    with pytest.raises(ValueError, match="unknown"):
        A.agent_advantages([1.0], ["e"], [False], hinted_baseline="both")
    with pytest.raises(ValueError, match="same length"):
        A.agent_advantages([1.0, 0.0], ["e"], [False, False])
    with pytest.raises(ValueError, match="no plain"):
        A.agent_advantages([1.0], ["e"], [True], train_hinted=True, hinted_baseline="plain")


def test_average_ranks_descending_with_ties():
    np.testing.assert_array_equal(A.average_ranks([0.3, 0.1, 0.2]), [1, 3, 2])
    np.testing.assert_array_equal(A.average_ranks([0.2, 0.2, 0.0, 0.5]), [2.5, 2.5, 4, 1])


def test_regret_rank_weights_by_hand():
    np.testing.assert_allclose(A.regret_rank_weights([0.3, 0.1, 0.2]), [18 / 11, 6 / 11, 9 / 11])
    np.testing.assert_allclose(A.regret_rank_weights([0.2, 0.2, 0.0]), [1.2, 1.2, 0.6])
    h = np.array([1.0, 3.0, 2.0]) ** -0.5
    np.testing.assert_allclose(A.regret_rank_weights([0.3, 0.1, 0.2], temperature=2.0),
                               3 * h / h.sum())
    np.testing.assert_array_equal(A.regret_rank_weights([0.4]), [1.0])
    with pytest.raises(ValueError, match="temperature"):
        A.regret_rank_weights([0.1], temperature=0.0)
