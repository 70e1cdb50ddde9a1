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


MIN_DRAWS = 3  # independent draws (windows, seeds) a t interval needs: at 2, t(0.975, 1) = 12.7 says nothing


def draws_interval(values: list[float] | np.ndarray, low: float | None = None,
                   high: float | None = None) -> Estimate | None:
    """The t interval over independent draws (bounded_t_interval with the quantity's range), or, with fewer than
    MIN_DRAWS of them, their mean and no interval (a report prints the values themselves)."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    if len(kept) < MIN_DRAWS:
        return Estimate(float(np.mean(kept)), None, None, len(kept)) if kept else None
    return bounded_t_interval(kept, low, high)


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


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with `df` (whole) degrees of freedom: the exact finite series of Abramowitz and
    Stegun 26.7.3-4 (theta = atan(t / sqrt(df)); odd df: (2/pi)(theta + sin theta (cos theta + 2/3 cos^3 theta +
    ...)), even df: sin theta (1 + 1/2 cos^2 theta + 3/8 cos^4 theta + ...), which is P(|T| < t))."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t < 0:
        return 1.0 - t_sf(-t, df)
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos theta (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...), (df - 1) / 2 terms
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        inside = 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    else:
        term, total = 1.0, 0.0
        for k in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ..., df / 2 terms
            total += term
            term *= c2 * (2 * k - 1) / (2 * k)
        inside = s * total
    return max(0.0, (1.0 - inside) / 2)


def p_above_zero(mean: float, se: float, df: int) -> float:
    """The one-sided p-value of 'the mean is above 0' (Student's t with df degrees of freedom)."""
    if se <= 0:
        return 0.0 if mean > 0 else 1.0
    return t_sf(mean / se, df)


def holm(p_values: list[float | None], alpha: float = 0.025) -> list[bool]:
    """Holm's step-down correction of a family of one-sided tests at level alpha: which hypotheses are rejected
    (None: a cell without a test, never rejected, not counted). The k-th smallest of m p-values is rejected when it
    and every smaller one lie at or below alpha / (m - k); the chance of any false rejection stays below alpha."""
    tested = sorted((p, index) for index, p in enumerate(p_values) if p is not None)
    rejected = [False] * len(p_values)
    for rank, (p, index) in enumerate(tested):
        if p > alpha / (len(tested) - rank):
            break
        rejected[index] = True
    return rejected


MARGIN_FLOOR = 0.05  # nats: the smallest use called more than negligible, whatever the model
MARGIN_FRACTION = 0.1  # of the model's own use within L (its positive control)


def use_margin(positive: float | None, floor: float = MARGIN_FLOOR, fraction: float = MARGIN_FRACTION) -> float:
    """The margin of the use verdicts, relative to what the model copies as trained: a tenth of its positive
    control's use (within L), at least `floor` nats. A model that copies +3 nats within L needs +0.3 past it to be
    said to use the text there; a tiny model that copies +0.2 needs the floor, +0.05."""
    return max(floor, fraction * positive) if positive is not None and math.isfinite(positive) else floor


@dataclass(frozen=True)
class Cell:
    """One cell of a report's family of use tests: the mean with its standard error and degrees of freedom."""
    mean: float
    se: float
    df: int

    def bounds(self) -> tuple[float, float]:
        half = t_quantile_975(self.df) * self.se
        return self.mean - half, self.mean + half


def calibrated_verdicts(cells: list[Cell | Spread | None], margin: float | list[float],
                        alpha: float = 0.025) -> list[str]:
    """The verdicts of a family of use cells (all the cells one report shows): "uses" where the cell is shown above
    0 by the one-sided t test, Holm-corrected over the family, and its mean is at least `margin`; "negligible" where
    it is shown above 0 but its mean is below the margin; "none" where the 95% interval lies within +-margin (and
    it is not shown above 0); else "cannot tell" (a cell without an interval included). `margin`: one for every
    cell, or each cell's own (cells of several texts or models in one family)."""
    margins = margin if isinstance(margin, list) else [margin] * len(cells)
    p_values = [None if c is None else p_above_zero(c.mean, c.se, c.df) for c in cells]
    shown = holm(p_values, alpha)
    words = []
    for cell, above, margin in zip(cells, shown, margins):
        if cell is None:
            words.append("cannot tell")
        elif above:
            words.append("uses" if cell.mean >= margin else "negligible")
        else:
            low, high = cell.bounds()
            words.append("none" if -margin < low and high < margin else "cannot tell")
    return words


def reach_of(distances: list[int], verdicts: list[str]) -> int | None:
    """The largest distance at which this distance and every nearer one read "uses" (None: not even the nearest)."""
    farthest = None
    for distance, word in sorted(zip(distances, verdicts)):
        if word != "uses":
            break
        farthest = distance
    return farthest


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


