"""experiments/stats.py against hand-computed numbers: the exact paired tests, the clustered
bootstrap, block and group means, and the paired tests' power and sample size."""

import math

import numpy as np
import pytest

from experiments import stats


def test_mcnemar_p_is_the_two_sided_binomial_tail_of_the_discordant_pairs():
    before = np.array([1, 1, 0, 0, 0, 1, 0], bool)
    after = np.array([1, 0, 1, 1, 1, 1, 1], bool)  # 1 worse, 4 better: 2 * (C(5,0) + C(5,1)) / 2**5
    assert stats.mcnemar_p(before, after) == pytest.approx(0.375)
    assert stats.mcnemar_p(after, before) == pytest.approx(0.375)
    assert stats.mcnemar_p(before, before) == 1.0
    assert stats.mcnemar_p([0] * 6, [1] * 6) == pytest.approx(2 / 2 ** 6)
    with pytest.raises(ValueError, match="shape"):
        stats.mcnemar_p([0, 1], [0, 1, 1])


def test_the_sign_test_pairs_item_by_item_and_drops_ties():
    before = [0.0, 0.5, 1.0, 0.2, 0.3, 0.3]
    after = [1.0, 0.6, 1.0, 0.1, 0.9, 0.8]  # 4 up, 1 down, 1 tie: 2 * (C(5,0) + C(5,1)) / 2**5
    assert stats.sign_test_p(before, after) == pytest.approx(0.375)
    assert stats.sign_test_p([0.0] * 6, [1.0] * 6) == pytest.approx(2 / 2 ** 6)
    assert stats.sign_test_p(before, before) == 1.0
    with pytest.raises(ValueError, match="shape"):
        stats.sign_test_p([0.0, 1.0], [0.0, 1.0, 1.0])


def test_paired_gap_resamples_clusters():
    rng = np.random.default_rng(0)
    # Two clusters of one pair each: resampled means are 1, 0.5, 0 with chances 1/4, 1/2, 1/4.
    gap, (low, high) = stats.paired_gap([[1.0], [0.0]], 4000, rng)
    assert (gap, low, high) == (0.5, 0.0, 1.0)
    # Clusters of equal sums and sizes: every resample has the mean, (0.2 + 0.4 + 0.6 + 0.0) / 4.
    gap, (low, high) = stats.paired_gap([[0.2, 0.4], [0.6, 0.0]], 100, rng)
    assert gap == pytest.approx(0.3) and (low, high) == pytest.approx((0.3, 0.3))
    # Pairs weigh alike: (1 + 0 + 0.5) / 3, not the mean of the clusters' means.
    assert stats.paired_gap([[1.0, 0.0], [0.5]], 10, rng)[0] == pytest.approx(0.5)
    gap, interval = stats.paired_gap([[], []], 10, rng)
    assert math.isnan(gap) and all(map(math.isnan, interval))


def test_block_means_with_standard_errors():
    blocks = stats.block_means([0.0, 1.0, 0.5, 0.5, 2.0], 2)
    assert blocks[0] == pytest.approx((0.5, 0.5))  # std (ddof 1) 0.7071 / sqrt 2
    assert blocks[1] == pytest.approx((0.5, 0.0))
    assert blocks[2] == (2.0, 0.0)


def test_group_means_in_order_of_appearance():
    rates = stats.group_means(["b", "a", "b", "a", "b"], [True, False, True, True, False])
    assert list(rates) == ["b", "a"] and rates == {"b": pytest.approx(2 / 3), "a": 0.5}


def test_paired_power_on_hand_computed_cases():
    # Six items all better after: p = 2 / 2**6 = 0.031 rejects; five: 2 / 2**5 = 0.0625 does not.
    assert stats.paired_power(6, 1.0, 0.0) == 1.0 and stats.paired_power(5, 1.0, 0.0) == 0.0
    # Six items, half of them discordant (all better): only six discordant of six reject, 0.5**6.
    assert stats.paired_power(6, 0.5, 0.0) == pytest.approx(1 / 64)
    # Six discordant always, better with 0.9: only 6 better of 6 rejects (5 of 6: p = 0.22), 0.9**6;
    # seven: 6 of 7 gives p = 2 * 8 / 128 = 0.125, so only 7 of 7 does, 0.9**7: the power saws.
    assert stats.paired_power(6, 0.9, 0.1) == pytest.approx(0.9 ** 6)
    assert stats.paired_power(7, 0.9, 0.1) == pytest.approx(0.9 ** 7)
    # At n = 6 only six better of six rejects: P(all six discordant and better) = 0.6**6.
    assert stats.paired_power(6, 0.6, 0.2) == pytest.approx(0.6 ** 6)
    # Rejections the wrong way (every item worse) are not power.
    assert stats.paired_power(6, 0.0, 1.0) == 0.0 and stats.paired_power(0, 0.5, 0.1) == 0.0
    with pytest.raises(ValueError, match="summing"):
        stats.paired_power(6, 0.7, 0.5)


def test_paired_sample_size_and_independent_outcomes():
    assert stats.paired_sample_size(1.0, 0.0) == 6  # five all-better items cannot reject
    assert stats.paired_sample_size(0.9, 0.1, power=0.5) == 6  # 0.9**6 = 0.53; fewer items never reject
    assert stats.independent_pairs(0.3, 0.4) == pytest.approx((0.7 * 0.4, 0.3 * 0.6))
    # 0.3 -> 0.4, independent outcomes, power 0.8: discordance 0.46, the normal approximation
    # ((1.96 sqrt(0.46) + 0.84 sqrt(0.46 - 0.1**2)) / 0.1)**2 = 358 items; the exact test needs a few more.
    n = stats.paired_sample_size(*stats.independent_pairs(0.3, 0.4))
    assert 358 <= n <= 400 and stats.paired_power(n, 0.28, 0.18) >= 0.8 > stats.paired_power(n - 1, 0.28, 0.18)
    with pytest.raises(ValueError, match="not there"):
        stats.paired_sample_size(0.1, 0.1)
    with pytest.raises(ValueError, match="not reached"):
        stats.paired_sample_size(0.02, 0.01, max_n=50)
