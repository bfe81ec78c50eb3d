"""The studies' statistics: exact paired tests, a clustered bootstrap, block means, and the power of
the paired tests (how many paired items a study needs to see an effect).

A paired binary test compares two outcomes on the same items (the same episode seeds before and
after training); only the discordant items carry evidence. The sign test on paired real values is
the same test on the signs of the differences, ties dropped, so one power function serves both.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats


def _two_sided_p(worse: int, better: int) -> float:
    """Exact two-sided binomial p-value of ``better`` against ``worse`` discordant items at 1/2."""
    n = worse + better
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(worse, better) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_p(before, after) -> float:
    """Exact two-sided McNemar p-value of paired 0/1 outcomes (binomial test on the discordant pairs)."""
    before, after = np.asarray(before, bool), np.asarray(after, bool)
    if before.shape != after.shape:
        raise ValueError(f"paired samples differ in shape: {before.shape} and {after.shape}")
    return _two_sided_p(int(np.sum(before & ~after)), int(np.sum(~before & after)))


def sign_test_p(before, after) -> float:
    """Exact two-sided paired sign test of ``after`` against ``before`` (item i with item i, ties
    dropped): McNemar's exact test on the signs of the differences."""
    before, after = np.asarray(before, float), np.asarray(after, float)
    if before.shape != after.shape:
        raise ValueError(f"paired samples differ in shape: {before.shape} and {after.shape}")
    return _two_sided_p(int(np.sum(after < before)), int(np.sum(after > before)))


def paired_gap(pairs_by_cluster: list[list[float]], resamples: int, rng: np.random.Generator):
    """Mean paired difference over all pairs and its 95% bootstrap interval, clusters resampled.

    ``pairs_by_cluster[i]`` holds cluster i's paired differences (a program's pairs share its hint
    and its difficulty, so the program is the unit resampled, with replacement, ``resamples`` times).
    NaN and a NaN interval when there is no pair."""
    sums = np.array([sum(p) for p in pairs_by_cluster])
    counts = np.array([len(p) for p in pairs_by_cluster])
    if not counts.sum():
        return float("nan"), (float("nan"), float("nan"))
    picks = rng.integers(len(sums), size=(resamples, len(sums)))
    means = sums[picks].sum(1) / np.maximum(counts[picks].sum(1), 1)
    return float(sums.sum() / counts.sum()), tuple(float(q) for q in np.quantile(means, [0.025, 0.975]))


def group_means(names, values) -> dict:
    """Mean of ``values`` per name (item i has name ``names[i]``), names in first-seen order."""
    out: dict = {}
    for name, value in zip(names, values):
        out.setdefault(name, []).append(float(value))
    return {name: float(np.mean(v)) for name, v in out.items()}


def block_means(values: list[float], block: int) -> list[tuple[float, float]]:
    """(mean, standard error) of consecutive blocks of `block` values (the last may be shorter)."""
    out = []
    for i in range(0, len(values), block):
        chunk = np.asarray(values[i:i + block], float)
        se = float(chunk.std(ddof=1) / math.sqrt(len(chunk))) if len(chunk) > 1 else 0.0
        out.append((float(chunk.mean()), se))
    return out


# ---- power ------------------------------------------------------------------------------------


def _largest_rejected_minority(discordant: np.ndarray, alpha: float) -> np.ndarray:
    """Per count of discordant items, the most of them on the losing side that still rejects at
    ``alpha`` (two-sided exact p < alpha, short of a tie); -1 where none does."""
    minority = scipy_stats.binom.ppf(alpha / 2, discordant, 0.5) - 1  # largest k with P(X <= k) < alpha / 2
    return np.minimum(minority, (discordant - 1) // 2)


def paired_power(n: int, p_better: float, p_worse: float, alpha: float = 0.05) -> float:
    """Probability that the exact paired test on ``n`` items finds "after" better with p < ``alpha``.

    McNemar: ``p_better`` = P(an item lost before is won after), ``p_worse`` = P(won before, lost
    after). Sign test: P(after > before) and P(after < before); ties are the rest. Counts only
    rejections in the better direction (what a study's bar asks). Exact: the number of discordant
    items is binomial(n, p_better + p_worse), the side each falls on binomial at their ratio. Not
    monotone in ``n`` (the test is discrete): see `paired_sample_size`."""
    if n < 0 or p_better < 0 or p_worse < 0 or p_better + p_worse > 1:
        raise ValueError(f"need n >= 0 and probabilities p_better={p_better}, p_worse={p_worse} summing to <= 1")
    discordance = p_better + p_worse
    if n == 0 or discordance == 0:
        return 0.0
    d = np.arange(1, n + 1)
    worse = _largest_rejected_minority(d, alpha)
    rejected = scipy_stats.binom.cdf(worse, d, p_worse / discordance)  # 0 where worse is -1
    return float(np.sum(scipy_stats.binom.pmf(d, n, discordance) * rejected))


def independent_pairs(p_before: float, p_after: float) -> tuple[float, float]:
    """(p_better, p_worse) for `paired_power` when an item's two outcomes are independent at win
    rates ``p_before`` and ``p_after``. Positively correlated outcomes (the same seed is easy on
    both sides) have fewer discordant items at the same gain and more power: this is the floor."""
    return (1 - p_before) * p_after, p_before * (1 - p_after)


def paired_sample_size(p_better: float, p_worse: float, power: float = 0.8, alpha: float = 0.05,
                       max_n: int = 5000) -> int:
    """The fewest paired items at which `paired_power` reaches ``power``. The exact test's power saws
    (one more item can lower it), so a few items more may fall below again: check the n a study uses."""
    if p_better <= p_worse:
        raise ValueError(f"no sample size detects a gain that is not there (p_better={p_better} <= p_worse={p_worse})")
    for n in range(1, max_n + 1):
        if paired_power(n, p_better, p_worse, alpha) >= power:
            return n
    raise ValueError(f"power {power} is not reached within {max_n} items")
