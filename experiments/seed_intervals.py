"""Intervals over the seeds of a fleet of trained models: what a comparison, a ladder or a sweep states about
encodings from several training runs each (eval/stats.py holds the intervals for one checkpoint's numbers).

    seeds_and_windows   a mean over a (seeds x windows) matrix with a Student's t interval over seeds whose standard
                        error adds the between-seed and the between-window variance: training noise and text
                        sampling both count, and few seeds give a wide interval (the comparison's penalty)
    spread_interval     seeds_and_windows's interval, or over one seed's windows
    perplexity_interval perplexity over seeds from their mean NLL: the t interval of the NLL, exponentiated
    perplexity_ratio_interval  a ratio of perplexities paired by seed: the t interval of NLL differences,
                        exponentiated
    excludes_zero       whether an interval lies wholly on one side of 0: the comparison's criterion for stating an
                        order or a difference between two variants, on their difference paired by seed
    separated           whether two intervals do not overlap (the ladder's criterion, between estimates of separate
                        comparisons)
    paired_bootstrap    a mean paired difference with a percentile bootstrap over the pairs (seeds or windows)

These stay inside the range of what they measure. A t interval on a raw perplexity, on a ratio of perplexities or on
a rate over few seeds reaches below 0 (or past 1) once the seeds disagree much: one seed whose loss explodes at 16x
gave perplexity 9058.61 [-6010.65, 24127.86]. Perplexity is made on the log scale, where the t interval is sound.
"""
from __future__ import annotations

import math

import numpy as np

from eval.stats import Estimate, seed_window_rows, spread, t_interval, t_quantile_975


def seeds_and_windows(matrix: np.ndarray) -> Estimate | None:
    """Mean of a (seeds, windows) matrix (the same window is the same text in every seed; rows holding NaN are
    dropped) with a 95% interval over both the training run and the text: mean +- t(0.975, seeds - 1) * se, where

        se^2 = var(seed means) / seeds + var(window means) / windows

    (sample variances). The two terms estimate the between-seed and the between-window variance of the grand
    mean; each also holds the seed-by-window residual once, so the interval is a little conservative. Student's t
    with seeds - 1 degrees of freedom keeps the 95% coverage at few seeds, where a bootstrap over seeds does not:
    in simulated comparisons (tests/test_stats.py: seed, window and interaction effects, 32 windows) this interval
    covered the true mean in 99.5% / 96.9% / 96.1% / 95.6% of runs at 2 / 3 / 5 / 10 seeds, the percentile
    bootstrap in 74.8% at 3 seeds, with intervals 2.7x narrower. One seed: no interval, as for t_interval; the windows
    alone say nothing about another training run."""
    matrix = seed_window_rows(matrix)
    if matrix is None:
        return None
    seeds = matrix.shape[0]
    if seeds < 2:
        return Estimate(float(matrix.mean()), None, None, seeds)
    estimate = spread(matrix)
    half = t_quantile_975(estimate.df) * estimate.se
    return Estimate(estimate.mean, estimate.mean - half, estimate.mean + half, seeds)


def separated(a: Estimate, b: Estimate) -> bool:
    """True when the two intervals do not overlap (both must have intervals)."""
    if not (a.has_interval and b.has_interval):
        return False
    return a.high < b.low or b.high < a.low


def excludes_zero(estimate: Estimate | None) -> bool:
    """Whether `estimate` has an interval that lies wholly above or wholly below 0."""
    return estimate is not None and estimate.has_interval and (estimate.low > 0 or estimate.high < 0)


def spread_interval(matrix: np.ndarray) -> Estimate | None:
    """The mean of a (seeds, windows) matrix with the 95% t interval the tests below read: seeds_and_windows's over
    seeds, or, for one seed, over its windows (no interval from a single value)."""
    matrix = np.atleast_2d(np.asarray(matrix, dtype=np.float64))
    estimate = spread(matrix)
    if estimate is None:
        rows = seed_window_rows(matrix)
        return None if rows is None else Estimate(float(rows.mean()), None, None, rows.shape[0])
    low, high = estimate.bounds()
    return Estimate(estimate.mean, low, high, matrix.shape[0])


def exp_t_interval(values: list[float] | np.ndarray) -> Estimate | None:
    """exp of the Student's t 95% interval of `values` (log-scale numbers, one per seed): mean exp(mean(values)),
    bounds exp(low) and exp(high), so always > 0. Exponentiating is monotonic, so the interval covers exp(mu)
    exactly when the t interval covers mu. None without values; no interval with one value."""
    estimate = t_interval(values)
    if estimate is None:
        return None
    if not estimate.has_interval:
        return Estimate(math.exp(estimate.mean), None, None, estimate.n)
    return Estimate(math.exp(estimate.mean), math.exp(estimate.low), math.exp(estimate.high), estimate.n)


def perplexity_interval(nll: list[float] | np.ndarray) -> Estimate | None:
    """Perplexity over seeds from each seed's mean NLL (nats per token): the t interval over seeds of the NLL, then
    exponentiated (exp_t_interval). The point estimate is exp(mean NLL), the geometric mean of the seeds'
    perplexities, not their arithmetic mean: the perplexity of the average model's loss, which one exploding seed
    does not dominate. The loss is where the seeds' noise is near-normal; the perplexity is its exponential, whose
    spread over seeds is skewed, so a t interval on raw perplexity falls below 0 when one seed diverges."""
    return exp_t_interval(nll)


def perplexity_ratio_interval(nll: list[float] | np.ndarray, base: list[float] | np.ndarray) -> Estimate | None:
    """The perplexity ratio exp(NLL - base NLL), paired: nll[i] and base[i] come from the same seed (or window).
    The t interval of the NLL differences, exponentiated (exp_t_interval): always > 0, and it excludes 1 exactly
    when the paired t interval of the differences excludes 0."""
    nll, base = np.asarray(nll, dtype=np.float64), np.asarray(base, dtype=np.float64)
    if nll.shape != base.shape:
        raise ValueError(f"paired values need the same shape, got {nll.shape} and {base.shape}")
    return exp_t_interval(nll - base)


def paired_bootstrap(values: list[float] | np.ndarray, base: list[float] | np.ndarray, resamples: int = 10000,
                     seed: int = 0) -> Estimate | None:
    """The mean difference values - base, paired (values[i] and base[i] share a seed or a window), with a 95%
    percentile bootstrap interval: resample the pairs with replacement, take the 2.5th and 97.5th percentiles of
    the resampled mean differences. Deterministic (`seed`). It assumes nothing about the differences' shape, but
    at few pairs it is narrow: with n pairs the resampled means cannot leave [min, max] of the differences, and at
    3 pairs the percentiles are about those extremes (coverage well under 95%; tests/test_stats.py). The paired t
    interval (t_interval of the differences) is the conservative choice at few seeds; this one is for a few
    windows or seeds whose differences are skewed or hold an outlier. None without pairs; no interval with one."""
    values, base = np.asarray(values, dtype=np.float64), np.asarray(base, dtype=np.float64)
    if values.shape != base.shape or values.ndim != 1:
        raise ValueError(f"paired values need the same 1-d shape, got {values.shape} and {base.shape}")
    differences = values - base
    differences = differences[np.isfinite(differences)]
    if differences.size == 0:
        return None
    mean = float(differences.mean())
    if differences.size == 1:
        return Estimate(mean, None, None, 1)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(differences.size, np.full(differences.size, 1 / differences.size), size=resamples)
    draws = counts @ differences / differences.size
    low, high = np.percentile(draws, [2.5, 97.5])
    return Estimate(mean, float(low), float(high), int(differences.size))


def paired_rate_difference(values: list[float], first: Estimate, second: Estimate) -> Estimate | None:
    """A difference of two rates measured on the same seeds (a model's exact match minus its window control's),
    `values` the seeds' differences, `first` and `second` the two rates with their intervals inside [0, 1]: the
    union of the t interval over the seeds' differences and the MOVER interval from the parts' own limits (Newcombe
    1998, Zou and Donner 2008),

        d - sqrt((p1 - l1)^2 + (u2 - p2)^2),   d + sqrt((u1 - p1)^2 + (p2 - l2)^2),

    cut to [-1, 1]. The MOVER part keeps the trials' uncertainty that a difference constant over the seeds would
    lose (every seed 1.00 against 0.00 is not +1.00 [+1.00, +1.00]) and ignores the pairing, which makes it
    conservative where the parts move together; the union is never narrower than either part's interval."""
    over_seeds = t_interval(values)
    if over_seeds is None:
        return None
    d = first.mean - second.mean
    if first.low is None or second.low is None:
        return over_seeds if over_seeds.low is None else Estimate(over_seeds.mean, max(-1.0, over_seeds.low),
                                                                   min(1.0, over_seeds.high), over_seeds.n)
    low = d - math.hypot(first.mean - first.low, second.high - second.mean)
    high = d + math.hypot(first.high - first.mean, second.mean - second.low)
    if over_seeds.low is not None:
        low, high = min(low, over_seeds.low), max(high, over_seeds.high)
    return Estimate(over_seeds.mean, max(-1.0, low), min(1.0, high), over_seeds.n)
