"""Intervals for the numbers measured on one checkpoint, or on the few checkpoints one command is given.

    t_interval          a mean with Student's t 95% interval (mean +- t(0.975, n-1) * sd / sqrt(n))
    crossed_bootstrap   the mean of a (seeds x windows) matrix with a percentile bootstrap over seeds and windows: for
                        one model's windows (eval.extrapolation); too narrow over few seeds (about 2.7x at 3 seeds)
    wilson_interval     a success rate (passkey trials, task accuracy) with the Wilson score 95% interval
    seeds_and_trials    a success rate over seeds: the union of the t interval over seeds and the pooled Wilson one
    spread              the mean of a (seeds x windows) matrix, or of one model's windows, with its standard error and
                        degrees of freedom: what the tests below read
    one_sided_above, equivalent, verdict
                        "uses" (the 95% interval above 0), "none" (inside +-margin: TOST), "negligible" (both),
                        else "cannot tell"
    bounded_t_interval  the t interval cut to the quantity's range (a loss >= 0, a rate in [0, 1])
    rate_over_seeds     exact match / accuracy over seeds: values, "k of n seeds", an interval inside [0, 1]

The intervals over the seeds of a fleet of trained models (perplexity and its ratios from the mean NLL, the
comparison's seeds-and-windows interval, the tests between variants) are experiments/seed_intervals.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Student's t 0.975 quantiles for 1..30 degrees of freedom (standard tables; checked against scipy in the tests).
T_975 = [12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
         2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
         2.0518, 2.0484, 2.0452, 2.0423]
Z_975 = 1.959964


def t_quantile_975(df: int) -> float:
    """Student's t 0.975 quantile: the table up to 30 degrees of freedom, then the Cornish-Fisher expansion."""
    return _t_quantile(df, T_975, Z_975)


def _t_quantile(df: int, table: list[float], z: float) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(table):
        return table[df - 1]
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float | None  # None: no interval (a single value)
    high: float | None
    n: int

    @property
    def has_interval(self) -> bool:
        return self.low is not None

    def format(self, digits: int = 2, signed: bool = False) -> str:
        sign = "+" if signed else ""
        if not self.has_interval:
            return f"{self.mean:{sign}.{digits}f}"
        return f"{self.mean:{sign}.{digits}f} [{self.low:{sign}.{digits}f}, {self.high:{sign}.{digits}f}]"


def t_interval(values: list[float] | np.ndarray) -> Estimate | None:
    """Mean of `values` (one per seed) with its Student's t 95% interval; None when there are no values."""
    values = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if values.size == 0:
        return None
    mean = float(values.mean())
    if values.size == 1:
        return Estimate(mean, None, None, 1)
    half = t_quantile_975(values.size - 1) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return Estimate(mean, mean - half, mean + half, int(values.size))


def seed_window_rows(matrix: np.ndarray) -> np.ndarray | None:
    """A (seeds, windows) float64 matrix without its rows holding NaN (None when nothing is left)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"expected a (seeds, windows) matrix, got shape {matrix.shape}")
    matrix = matrix[~np.isnan(matrix).any(axis=1)]
    return matrix if matrix.size else None


def crossed_bootstrap(matrix: np.ndarray, resamples: int = 2000, seed: int = 0) -> Estimate | None:
    """Mean of a (seeds, windows) matrix with a 95% percentile bootstrap interval that resamples seeds and
    windows independently (the same windows are the same text in every seed). Rows holding NaN are dropped."""
    matrix = seed_window_rows(matrix)
    if matrix is None:
        return None
    seeds, windows = matrix.shape
    mean = float(matrix.mean())
    if seeds * windows == 1:
        return Estimate(mean, None, None, 1)
    rng = np.random.default_rng(seed)
    seed_counts = rng.multinomial(seeds, np.full(seeds, 1 / seeds), size=resamples)  # (resamples, seeds)
    window_counts = rng.multinomial(windows, np.full(windows, 1 / windows), size=resamples)
    draws = np.einsum("bs,sw,bw->b", seed_counts, matrix, window_counts) / (seeds * windows)
    low, high = np.percentile(draws, [2.5, 97.5])
    return Estimate(mean, float(low), float(high), seeds)


def wilson_interval(successes: int, trials: int) -> Estimate:
    """The rate successes / trials with its Wilson score 95% interval (stays inside [0, 1], and is not empty at 0
    or `trials` successes, unlike the normal approximation)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    rate, z2 = successes / trials, Z_975**2
    centre = (rate + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z_975 * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials**2)) / (1 + z2 / trials)
    return Estimate(rate, max(0.0, min(rate, centre - half)), min(1.0, max(rate, centre + half)), trials)


def seeds_and_trials(successes: list[int], trials: list[int]) -> Estimate | None:
    """A success rate measured on several training runs (successes[i] of trials[i] on seed i): the mean of the
    seeds' rates, with the union of two 95% intervals, each blind to part of the noise:

    - the t interval over the seeds' rates (clipped to [0, 1]) counts the variation between training runs, which
      pooling the trials ignores (one seed that retrieves and one that does not is not one model at 50%); but it
      is empty when every seed scores the same (all 0 is common in passkey), although each rate is a sample;
    - the Wilson interval on the pooled trials counts the sampling of trials, and is never empty.

    In simulated recipes (3 seeds of 50 trials, each seed's true rate drawn from a Beta; tests/test_stats.py checks the first) it
    covered the mean rate in 94.4% of runs for Beta(2, 3), 96.9% for Beta(20, 30) and 86.4% for the skewed
    Beta(0.5, 4.5) (most runs near 0, a few not: the t interval's weak case at few seeds); the pooled Wilson interval
    in 45.8%, 84.2% and 49.6%. One seed: its Wilson interval (trials only; it says nothing about another training
    run). None without trials."""
    if len(successes) != len(trials):
        raise ValueError(f"one success count per trial count: got {len(successes)} and {len(trials)}")
    kept = [(s, n) for s, n in zip(successes, trials) if n > 0]
    if not kept:
        return None
    pooled = wilson_interval(sum(s for s, _ in kept), sum(n for _, n in kept))
    if len(kept) == 1:
        return pooled
    over_seeds = t_interval([s / n for s, n in kept])
    low, high = max(0.0, over_seeds.low), min(1.0, over_seeds.high)
    return Estimate(over_seeds.mean, min(low, pooled.low), max(high, pooled.high), len(kept))


@dataclass(frozen=True)
class Spread:
    """A mean with its standard error and the degrees of freedom of its t quantile."""
    mean: float
    se: float
    df: int

    def bounds(self) -> tuple[float, float]:
        """The 95% t interval, what every test below reads (the interval the reports print: a verdict never
        contradicts it)."""
        half = t_quantile_975(self.df) * self.se
        return self.mean - half, self.mean + half


def spread(matrix: np.ndarray) -> Spread | None:
    """The mean of a (seeds, windows) matrix with the standard error of seeds_and_windows and seeds - 1 degrees
    of freedom; with one seed (one model), over its windows: se = sd(windows) / sqrt(windows), windows - 1 degrees
    of freedom (text sampling is then the only noise). None when there is too little to tell (one value)."""
    matrix = seed_window_rows(np.atleast_2d(np.asarray(matrix, dtype=np.float64)))
    if matrix is None:
        return None
    seeds, windows = matrix.shape
    mean = float(matrix.mean())
    if seeds == 1:
        if windows < 2:
            return None
        return Spread(mean, float(matrix[0].std(ddof=1)) / math.sqrt(windows), windows - 1)
    variance = matrix.mean(axis=1).var(ddof=1) / seeds
    if windows > 1:
        variance += matrix.mean(axis=0).var(ddof=1) / windows
    return Spread(mean, math.sqrt(variance), seeds - 1)


def one_sided_above(estimate: Spread | None, bound: float = 0.0) -> bool:
    """The one-sided test at 2.5%: the lower end of the 95% interval lies above `bound`."""
    return estimate is not None and estimate.bounds()[0] > bound


def equivalent(estimate: Spread | None, margin: float) -> bool:
    """The equivalence test (two one-sided tests at 2.5% each, TOST): the 95% interval lies inside (-margin,
    margin)."""
    if estimate is None:
        return False
    return interval_verdict(*estimate.bounds(), margin) in ("none", "negligible")


def verdict(estimate: Spread | None, margin: float, positive: str = "uses", null: str = "none",
            small: str = "negligible") -> str:
    """`positive` when the mean is shown above 0 (one-sided test) and not shown below the margin; `small` when it
    is shown above 0 and also within +-margin (the equivalence test): real, but too small to matter; `null` when it
    is shown within +-margin and not above 0; otherwise "cannot tell"."""
    if estimate is None:
        return "cannot tell"
    return interval_verdict(*estimate.bounds(), margin, positive, null, small)


def interval_verdict(low: float | None, high: float | None, margin: float, positive: str = "uses",
                     null: str = "none", small: str = "negligible") -> str:
    """verdict's words from a 95% interval already computed (low, high; None: no interval)."""
    if low is None or high is None:
        return "cannot tell"
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    above, within = low > 0, -margin < low and high < margin
    if above:
        return small if within else positive
    if within:
        return null
    return "cannot tell"


def bounded_t_interval(values: list[float] | np.ndarray, low: float | None = None,
                       high: float | None = None) -> Estimate | None:
    """The t interval of `values` intersected with the quantity's range [low, high] (a loss: low = 0; a rate: 0 and
    1). The true mean lies in the range, so cutting off the part of the interval outside it never loses coverage:
    the clipped interval covers the mean whenever the t interval does. For many values (trials of one model, as in
    eval.induction) the t interval is sound on its own; for a few seeds prefer the functions above and below."""
    estimate = t_interval(values)
    if estimate is None or not estimate.has_interval:
        return estimate
    bottom = estimate.low if low is None else max(low, estimate.low)
    top = estimate.high if high is None else min(high, estimate.high)
    return Estimate(estimate.mean, bottom, top, estimate.n)


@dataclass(frozen=True)
class Rate:
    """A rate over seeds (exact match, accuracy): the estimate with an interval inside [0, 1], the seeds' own
    values, and how many of them reach `threshold` ("k of n seeds learned")."""
    estimate: Estimate
    values: list[float]
    threshold: float | None
    reached: int | None  # seeds whose value is >= threshold (None without a threshold)
    method: str  # how the interval was made: "seeds and trials" or "t over seeds, clipped to [0, 1]"

    @property
    def n(self) -> int:
        return len(self.values)

    def format(self, digits: int = 2) -> str:
        """'mean [low, high] k/n' (the interval and the seeds that reach the threshold, where there are any)."""
        text = self.estimate.format(digits)
        return text if self.reached is None else f"{text} {self.reached}/{self.n}"

    def record(self) -> dict:
        """As results files keep it: the estimate's fields, the seeds' values and the threshold count."""
        return {**self.estimate.__dict__, "values": list(self.values), "threshold": self.threshold,
                "reached": self.reached, "interval": self.method}


def rate_over_seeds(values: list[float], trials: int | None = None, threshold: float | None = None) -> Rate | None:
    """A rate measured once per seed (the fraction of `trials` sequences a seed's model gets right) as a mean over
    seeds with a 95% interval inside [0, 1], and the number of seeds at or above `threshold` (e.g. the task's stop
    target 0.95: "k of n seeds learned").

    The interval: with `trials` known (and every value a whole number of successes out of it), seeds_and_trials:
    the union of the t interval over the seeds' rates, clipped to [0, 1], and the pooled Wilson interval of the
    trials. The first carries the between-seed variation, which at few seeds is the main noise (seeds split into
    "learned" and "not learned"); the second keeps the interval from collapsing to a point when every seed scores
    the same (3 of 3 at 1.00 is not certainty). Without `trials` (token accuracy, whose tokens are not independent
    trials), the clipped t interval alone. Clipping to [0, 1] loses no coverage, since the mean rate lies in [0, 1].
    A percentile bootstrap over seeds was not chosen: at 3 seeds it is about [min, max] of the seeds and covers far
    less than 95% (crossed_bootstrap's docstring). None without values."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    reached = None if threshold is None else sum(v >= threshold for v in values)
    successes = [v * trials for v in values] if trials else []
    if trials and all(abs(s - round(s)) < 1e-6 for s in successes):
        estimate = seeds_and_trials([round(s) for s in successes], [trials] * len(values))
        return Rate(estimate, values, threshold, reached, "seeds and trials")
    return Rate(bounded_t_interval(values, 0.0, 1.0), values, threshold, reached, "t over seeds, clipped to [0, 1]")


