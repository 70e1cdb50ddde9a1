"""Intervals for the numbers measured on one checkpoint, or on the few checkpoints one command is given.

    t_interval          a mean with Student's t 95% interval (mean +- t(0.975, n-1) * sd / sqrt(n))
    crossed_bootstrap   the mean of a (seeds x windows) matrix with a percentile bootstrap over seeds and windows: for
                        one model's windows (eval.extrapolation); too narrow over few seeds (about 2.7x at 3 seeds)
    wilson_interval     a success rate (passkey trials, task accuracy) with the Wilson score 95% interval
    seeds_and_trials    a success rate over seeds: the union of the t interval over seeds and the pooled Wilson one
    spread              the mean of a (seeds x windows) matrix, or of one model's windows, with its standard error and
                        degrees of freedom: what the tests below read
    one_sided_above, equivalent, p_above_zero, holm
                        the one-sided test, the equivalence test (TOST), its p-value, Holm's correction over a family
    spearman, spearman_p  Spearman's rank correlation (ties at their mean rank) and its one-sided permutation p-value
    bounded_t_interval  the t interval cut to the quantity's range (a loss >= 0, a rate in [0, 1])
    rate_over_seeds     exact match / accuracy over seeds: values, "k of n seeds", an interval inside [0, 1]

Over the seeds of a fleet of trained models (a comparison, a ladder, a sweep):

    seeds_and_windows   a mean over a (seeds x windows) matrix with a Student's t interval over seeds whose standard
                        error adds the between-seed and the between-window variance: training noise and text
                        sampling both count, and few seeds give a wide interval (the comparison's penalty)
    spread_interval     seeds_and_windows's interval, or over one seed's windows
    perplexity_interval perplexity over seeds from their mean NLL: the t interval of the NLL, exponentiated
    perplexity_ratio_interval  a ratio of perplexities paired by seed: the t interval of NLL differences,
                        exponentiated
    excludes_zero, separated  an interval wholly on one side of 0; two intervals that do not overlap
    paired_bootstrap    a mean paired difference with a percentile bootstrap over the pairs (seeds or windows)
    paired_rate_difference  a difference of two rates on the same seeds, inside [-1, 1]

These stay inside the range of what they measure. A t interval on a raw perplexity, on a ratio of perplexities or on
a rate over few seeds reaches below 0 (or past 1) once the seeds disagree much: one seed whose loss explodes at 16x
gave perplexity 9058.61 [-6010.65, 24127.86]. Perplexity is made on the log scale, where the t interval is sound.
The words a report says of these numbers ("uses", "flat", "reproduced", ...) are eval/verdicts.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

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
        """'mean [low, high]' at `digits` decimals; an interval of some width that would print with none (both bounds
        rounding alike: a rate of 1.00 [0.997, 1.000]) gets up to two more decimals on its bounds."""
        sign = "+" if signed else ""
        if not self.has_interval:
            return f"{self.mean:{sign}.{digits}f}"
        places = digits
        while places < digits + 2 and abs(self.high - self.low) > 1e-9 and \
                f"{self.low:.{places}f}" == f"{self.high:.{places}f}":
            places += 1
        return f"{self.mean:{sign}.{digits}f} [{self.low:{sign}.{places}f}, {self.high:{sign}.{places}f}]"


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


def binomial_cdf(successes: int, trials: int, rate: float) -> float:
    """P(X <= successes) for X ~ Binomial(trials, rate)."""
    return sum(math.comb(trials, k) * rate**k * (1 - rate) ** (trials - k) for k in range(successes + 1))


def clopper_pearson(successes: int, trials: int, level: float = 0.95) -> Estimate:
    """The rate successes / trials with its exact (Clopper-Pearson) interval: the rates at which the observed count
    or a more extreme one has probability (1 - level) / 2 on each side; 0 and 1 where the count is 0 or `trials`.
    Found by bisection on the binomial distribution (no beta quantile needed)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    tail = (1 - level) / 2

    def solve(target: Callable[[float], float]) -> float:  # target rises with the rate
        low, high = 0.0, 1.0
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if target(middle) < 0 else (low, middle)
        return (low + high) / 2

    lower = 0.0 if successes == 0 else solve(lambda r: 1 - binomial_cdf(successes - 1, trials, r) - tail)
    upper = 1.0 if successes == trials else solve(lambda r: tail - binomial_cdf(successes, trials, r))
    return Estimate(successes / trials, lower, upper, trials)


def poisson_binomial_sf(observed: int, chances: list[float]) -> float:
    """P(X >= observed) for X the number of successes of independent trials with these chances (exact, by dynamic
    programming over the trials)."""
    counts = [1.0]
    for chance in chances:
        counts = [(counts[k] if k < len(counts) else 0.0) * (1 - chance) + (counts[k - 1] * chance if k else 0.0)
                  for k in range(len(counts) + 1)]
    return float(min(1.0, sum(counts[observed:])))


def mcnemar_exact(only_first: int, only_second: int) -> float:
    """The two-sided exact McNemar p-value of two methods answering the same samples: of the discordant samples (one
    right, the other wrong), `only_first` favour the first and `only_second` the second; under "no difference" each
    falls either way with chance 1/2, so p = min(1, 2 P(X <= min) ), X ~ Binomial(discordant, 1/2). 4 to 0: 0.125."""
    discordant = only_first + only_second
    if discordant == 0:
        return 1.0
    return min(1.0, 2 * binomial_cdf(min(only_first, only_second), discordant, 0.5))


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
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    low, high = estimate.bounds()
    return -margin < low and high < margin


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


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    values = np.asarray(values, dtype=float)
    ranked = np.empty(len(values))
    ranked[values.argsort(kind="stable")] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        ranked[values == value] = ranked[values == value].mean()
    return ranked


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks, ties at their mean rank); None when either is constant."""
    ra, rb = ranks(a), ranks(b)
    return None if ra.std() == 0 or rb.std() == 0 else float(np.corrcoef(ra, rb)[0, 1])


PERMUTATION_DRAWS = 200_000


def spearman_p(a: list[float], b: list[float], draws: int = PERMUTATION_DRAWS, seed: int = 0) -> float | None:
    """One-sided p-value of Spearman's rank correlation being as large as observed when the pairing is random: the
    share of the orders of `b`'s ranks (ties kept at their mean rank) whose correlation with `a`'s ranks is at least
    the observed one. Every order for up to 9 items (9! = 362,880), else `draws` random ones."""
    import itertools

    observed = spearman(a, b)
    if observed is None:
        return None
    ra, rb = ranks(a), ranks(b)
    if len(rb) <= 9:
        orders = np.array(list(itertools.permutations(range(len(rb)))))
    else:
        orders = np.argsort(np.random.default_rng(seed).random((draws, len(rb))), axis=1)
    centred = rb[orders] - rb[orders].mean(axis=1, keepdims=True)
    centred_a = ra - ra.mean()
    rho = centred @ centred_a / (np.linalg.norm(centred, axis=1) * np.linalg.norm(centred_a))
    return float(np.mean(rho >= observed - 1e-12))


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
    if trials:  # a mean score in [0, 1] over `trials` sequences (token accuracy): its Wilson interval on the summed
        # scores is valid (a [0, 1] score of mean p varies at most as a 0-or-1 one) and keeps the union from
        # collapsing where every seed scores the same
        return Rate(seeds_and_trials(successes, [trials] * len(values)), values, threshold, reached,
                    "seeds and sequences")
    return Rate(bounded_t_interval(values, 0.0, 1.0), values, threshold, reached, "t over seeds, clipped to [0, 1]")

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


def log_scale_interval(values: list[float] | np.ndarray) -> Estimate | None:
    """A positive level (a mean NLL) over independent draws: the t interval of the logs, exponentiated (the geometric
    mean, bounds always > 0); None without values, no interval below MIN_DRAWS."""
    kept = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if len(kept) < MIN_DRAWS:
        return Estimate(float(np.mean(kept)), None, None, len(kept)) if kept else None
    return exp_t_interval(np.log(kept))


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
