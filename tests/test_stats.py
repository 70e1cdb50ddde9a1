"""eval.stats against independent references: scipy's t quantiles (when installed) and the Wilson interval as the
set of rates that a score test at 95% does not reject (found by bisection); the penalty's interval over seeds
and windows against the t interval it reduces to, and by its coverage in simulated comparisons."""
import math
import statistics

import numpy as np
import pytest

from eval.stats import (
    Z_975,
    Estimate,
    crossed_bootstrap,
    seeds_and_trials,
    seeds_and_windows,
    t_interval,
    t_quantile_975,
    wilson_interval,
)


@pytest.mark.parametrize("df", [1, 2, 5, 30, 31, 60, 200])
def test_t_quantiles_match_scipy(df):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4)


def score_test_bound(successes: int, trials: int, upper: bool) -> float:
    """The edge of {p : |successes/trials - p| <= z sqrt(p (1 - p) / trials)}, by bisection."""
    rate = successes / trials
    inside = lambda p: abs(rate - p) <= Z_975 * math.sqrt(p * (1 - p) / trials)  # noqa: E731
    low, high = (rate, 1.0) if upper else (0.0, rate)
    for _ in range(200):
        middle = (low + high) / 2
        if inside(middle) == upper:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@pytest.mark.parametrize("successes,trials", [(0, 50), (1, 50), (25, 50), (49, 50), (50, 50), (3, 7)])
def test_wilson_interval_is_the_score_tests_acceptance_region(successes, trials):
    estimate = wilson_interval(successes, trials)
    assert estimate.mean == successes / trials and estimate.n == trials
    assert estimate.low == pytest.approx(score_test_bound(successes, trials, upper=False), abs=1e-9)
    assert estimate.high == pytest.approx(score_test_bound(successes, trials, upper=True), abs=1e-9)
    assert 0.0 <= estimate.low <= estimate.mean <= estimate.high <= 1.0


def test_wilson_refuses_impossible_counts_and_t_interval_needs_two_values():
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    with pytest.raises(ValueError):
        wilson_interval(0, 0)
    assert t_interval([1.0]).low is None and t_interval([]) is None
    assert t_interval([1.0, 3.0]).low == pytest.approx(2.0 - 12.7062 * math.sqrt(2) / math.sqrt(2))


def test_seeds_and_windows_reduces_to_the_t_interval_when_one_factor_is_constant():
    rng = np.random.default_rng(1)
    seed_values = rng.normal(0.8, 0.1, size=3)
    constant_windows = np.repeat(seed_values[:, None], 32, axis=1)  # every window the same within a seed
    both, over_seeds = seeds_and_windows(constant_windows), t_interval(seed_values)
    assert (both.mean, both.low, both.high, both.n) == pytest.approx((over_seeds.mean, over_seeds.low, over_seeds.high, 3))
    window_values = rng.normal(0.5, 0.2, size=32)
    same_in_every_seed = np.repeat(window_values[None, :], 4, axis=0)  # four identical trainings
    estimate = seeds_and_windows(same_in_every_seed)
    half = t_quantile_975(3) * window_values.std(ddof=1) / math.sqrt(32)
    assert estimate.low == pytest.approx(window_values.mean() - half) and estimate.high == pytest.approx(
        window_values.mean() + half)


def test_seeds_and_windows_gives_no_interval_for_one_seed_and_drops_nan_rows():
    windows = np.linspace(0.1, 0.9, 16)
    one = seeds_and_windows(windows[None, :])
    assert one.mean == pytest.approx(0.5) and one.low is None and one.n == 1
    with_nan = np.stack([windows, windows + 0.1, np.full(16, np.nan)])
    assert seeds_and_windows(with_nan).n == 2
    assert seeds_and_windows(np.full((2, 4), np.nan)) is None
    with pytest.raises(ValueError):
        seeds_and_windows(windows)


def simulated_comparisons(runs: int, seeds: int, windows: int, rng) -> np.ndarray:
    """(runs, seeds, windows) penalties of a crossed design with true mean 0: a seed effect (sd 0.1, the
    training run), a window effect shared by every seed (sd 0.05, the text) and their interaction (sd 0.05)."""
    return (rng.normal(0, 0.1, (runs, seeds, 1)) + rng.normal(0, 0.05, (runs, 1, windows))
            + rng.normal(0, 0.05, (runs, seeds, windows)))


def test_the_penalty_interval_covers_the_true_mean_at_three_seeds_where_the_bootstrap_does_not():
    rng = np.random.default_rng(0)
    draws = simulated_comparisons(4000, 3, 32, rng)
    estimates = [seeds_and_windows(matrix) for matrix in draws]
    coverage = np.mean([e.low <= 0 <= e.high for e in estimates])
    assert 0.93 <= coverage <= 0.99
    bootstrapped = [crossed_bootstrap(matrix, resamples=400, seed=i) for i, matrix in enumerate(draws[:400])]
    bootstrap_coverage = np.mean([e.low <= 0 <= e.high for e in bootstrapped])
    assert bootstrap_coverage < 0.85  # a percentile bootstrap over 3 seeds is too narrow (about 75%)
    widths = np.mean([e.high - e.low for e in estimates[:400]]) / np.mean([e.high - e.low for e in bootstrapped])
    assert widths > 2.0


def test_seeds_and_trials_is_the_pooled_wilson_interval_when_the_seeds_agree_and_one_seed():
    pooled = wilson_interval(0, 150)
    assert seeds_and_trials([0, 0, 0], [50, 50, 50]) == Estimate(0.0, pooled.low, pooled.high, 3)  # t: empty
    one = seeds_and_trials([7, 0], [50, 0])  # a seed without trials (a length too short) is left out
    assert one == wilson_interval(7, 50)
    assert seeds_and_trials([], []) is None and seeds_and_trials([0], [0]) is None
    with pytest.raises(ValueError, match="one success count per trial count"):
        seeds_and_trials([1, 2], [50])


def test_seeds_and_trials_counts_the_variation_between_training_runs():
    split = seeds_and_trials([50, 0], [50, 50])  # one run retrieves, the other does not
    assert split.mean == 0.5 and (split.low, split.high) == (0.0, 1.0)
    assert wilson_interval(50, 100).high - wilson_interval(50, 100).low < 0.2  # pooling would claim +-0.1
    # Simulated recipes whose training runs differ (each seed's true rate drawn from Beta(2, 3), mean 0.4; 50
    # trials per seed): the interval should cover 0.4 about 95% of the time; pooling the trials does not.
    rng = np.random.default_rng(0)
    covered = {"seeds_and_trials": 0, "pooled": 0}
    runs = 2000
    for _ in range(runs):
        rates = rng.beta(2, 3, size=3)
        successes = rng.binomial(50, rates)
        estimate = seeds_and_trials(list(successes), [50] * 3)
        pooled = wilson_interval(int(successes.sum()), 150)
        covered["seeds_and_trials"] += estimate.low <= 0.4 <= estimate.high
        covered["pooled"] += pooled.low <= 0.4 <= pooled.high
    assert covered["seeds_and_trials"] / runs >= 0.93  # 94.4%
    assert covered["pooled"] / runs < 0.6  # 45.8%


# Intervals inside the quantity's range (issue 61): hand-made data against independent references.

def test_perplexity_interval_is_the_exponentiated_t_interval_of_the_nll_and_stays_positive():
    scipy_stats = pytest.importorskip("scipy.stats")
    from eval.stats import perplexity_interval
    nll = [4.0, 4.2, 9.0]  # one seed diverges: a t interval on raw perplexity would reach below 0
    mean, sd = statistics.fmean(nll), statistics.stdev(nll)
    half = scipy_stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    estimate = perplexity_interval(nll)
    assert estimate.mean == pytest.approx(math.exp(mean))  # the geometric mean of the seeds' perplexities
    assert estimate.mean == pytest.approx((math.exp(4.0) * math.exp(4.2) * math.exp(9.0)) ** (1 / 3))
    assert (estimate.low, estimate.high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-4)
    raw = t_interval([math.exp(v) for v in nll])
    assert raw.low < 0 < estimate.low
    assert perplexity_interval([3.0]).low is None and perplexity_interval([]) is None


def test_perplexity_ratio_interval_pairs_by_seed_on_the_log_scale():
    scipy_stats = pytest.importorskip("scipy.stats")
    from eval.stats import perplexity_ratio_interval
    here, base = [5.0, 5.5, 7.0], [4.0, 4.1, 4.2]
    differences = [1.0, 1.4, 2.8]
    mean, sd = statistics.fmean(differences), statistics.stdev(differences)
    half = scipy_stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    estimate = perplexity_ratio_interval(here, base)
    assert estimate.mean == pytest.approx(math.exp(mean))
    assert (estimate.low, estimate.high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), rel=1e-4)
    assert estimate.low > 0
    assert perplexity_ratio_interval([2.0, 2.0], [2.0, 2.0]).format() == "1.00 [1.00, 1.00]"
    with pytest.raises(ValueError):
        perplexity_ratio_interval([1.0], [1.0, 2.0])


def test_bounded_t_interval_cuts_the_t_interval_at_the_range():
    from eval.stats import bounded_t_interval
    values = [0.0, 0.1, 2.0]
    plain = t_interval(values)
    cut = bounded_t_interval(values, low=0.0)
    assert plain.low < 0 and cut.low == 0.0 and cut.high == plain.high and cut.mean == plain.mean
    assert bounded_t_interval([0.9, 1.0, 0.5], 0.0, 1.0).high == 1.0


def test_rate_over_seeds_counts_learned_seeds_and_stays_in_the_unit_interval():
    scipy_stats = pytest.importorskip("scipy.stats")
    from eval.stats import rate_over_seeds, seeds_and_trials
    values = [0.0, 1.0, 1.0]  # FoX's mqar: one seed learned nothing; the t interval is [-0.77, 2.10]
    assert t_interval(values).low < 0 and t_interval(values).high > 1
    rate = rate_over_seeds(values, trials=256, threshold=0.95)
    assert rate.reached == 2 and rate.n == 3 and rate.method == "seeds and trials"
    assert rate.estimate == seeds_and_trials([0, 256, 256], [256] * 3)
    assert 0.0 <= rate.estimate.low and rate.estimate.high <= 1.0
    assert rate.format() == f"{rate.estimate.format()} 2/3"
    assert rate.record()["values"] == values and rate.record()["reached"] == 2
    # every seed at 1: not a point interval, the pooled Wilson interval of 768 of 768 (scipy's binomtest reference)
    all_right = rate_over_seeds([1.0, 1.0, 1.0], trials=256)
    wilson = scipy_stats.binomtest(768, 768).proportion_ci(method="wilson")
    assert all_right.estimate.low == pytest.approx(wilson.low, abs=1e-6) and all_right.estimate.high == 1.0
    # a mean score per sequence (token accuracy, no whole number of the trials): the same union, with the Wilson
    # interval of the summed scores; every seed at 1.0 still leaves an interval of some width
    scores = rate_over_seeds([0.1, 0.9, 0.95], trials=256)
    assert scores.method == "seeds and sequences" and scores.estimate.high == 1.0 and scores.estimate.low == 0.0
    assert scores.estimate == seeds_and_trials([25.6, 230.4, 243.2], [256] * 3)
    perfect = rate_over_seeds([1.0, 0.999, 1.0], trials=256)
    assert perfect.method == "seeds and sequences" and perfect.estimate.low < 0.999 and perfect.estimate.high == 1.0
    # without trials: the t interval cut to [0, 1]
    clipped = rate_over_seeds([0.1, 0.9, 0.95])
    assert clipped.method == "t over seeds, clipped to [0, 1]" and clipped.estimate.high == 1.0
    assert rate_over_seeds([]) is None and rate_over_seeds([0.5]).reached is None


def test_paired_bootstrap_against_an_exhaustive_enumeration():
    import itertools

    from eval.stats import paired_bootstrap
    here, base = [1.0, 2.0, 4.0], [0.0, 0.5, 1.0]
    differences = [1.0, 1.5, 3.0]
    estimate = paired_bootstrap(here, base, resamples=20000, seed=3)
    assert estimate.mean == pytest.approx(statistics.fmean(differences))
    # all 27 equally likely resamples of 3 pairs: their means' 2.5th and 97.5th percentiles
    means = sorted(statistics.fmean(pick) for pick in itertools.product(differences, repeat=3))
    # (the exact distribution's quantiles: 1/27 of it sits on each extreme, more than 2.5%)
    assert estimate.low == pytest.approx(float(np.percentile(means, 2.5, method="inverted_cdf")), abs=1e-9)
    assert estimate.high == pytest.approx(float(np.percentile(means, 97.5, method="inverted_cdf")), abs=1e-9)
    assert min(differences) <= estimate.low and estimate.high <= max(differences)  # narrow at few pairs
    assert paired_bootstrap(here, base, seed=3) == paired_bootstrap(here, base, seed=3)  # deterministic
    assert paired_bootstrap([1.0], [0.0]).low is None


# scipy.stats.t.sf at these points (scipy 1.17.1), the golden values of t_sf's exact series
T_SF_SCIPY = [((0.5, 1), 0.35241638234956674), ((2.0, 3), 0.06966298427942152), ((3.1, 7), 0.008661144712748757),
              ((5.0, 7), 0.0007826389765864124), ((1.2, 12), 0.12664736512679722), ((-1.0, 4), 0.8130495168499705),
              ((4.5, 2), 0.02300095399713801), ((10.0, 7), 1.0697101445386401e-05)]


@pytest.mark.parametrize("point, expected", T_SF_SCIPY)
def test_the_t_tail_matches_scipy(point, expected):
    from eval.stats import t_sf
    assert t_sf(*point) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_the_t_tail_at_the_975_quantile_is_2_5_percent():
    from eval.stats import T_975, t_sf
    assert all(abs(t_sf(T_975[df - 1], df) - 0.025) < 5e-6 for df in range(1, 31))


def test_holm_steps_down_and_stops_at_the_first_acceptance():
    from eval.stats import holm
    # m = 4 tested: thresholds 0.025/4, /3, /2, /1; 0.01 > 0.025/3 stops it although 0.02 < 0.025/2
    assert holm([0.001, 0.01, None, 0.02, 0.5]) == [True, False, False, False, False]
    assert holm([0.004, 0.005, 0.012, 0.02]) == [True, True, True, True]
    assert holm([None, None]) == [False, False]


def test_use_verdicts_test_the_margin_and_survive_the_family():
    from eval.stats import Spread
    from eval.verdicts import use_verdicts
    strong, small, null = Spread(1.0, 0.1, 7), Spread(0.08, 0.01, 7), Spread(0.01, 0.01, 7)
    assert use_verdicts([strong, small, null, None], 0.3) == ["uses", "negligible", "none", "cannot tell"]
    # use - margin = 0.22 at se 0.08: t = 2.75, one-sided p = 0.014; alone it is shown above the margin, among 20
    # such cells Holm asks p < 0.00125
    marginal = Spread(0.52, 0.08, 7)
    assert use_verdicts([marginal], 0.3) == ["uses"]
    assert use_verdicts([marginal] * 20, 0.3) == ["cannot tell"] * 20  # above 0 but its interval reaches past 0.3
    assert use_verdicts([strong, strong], [0.3, 2.0]) == ["uses", "negligible"]  # each cell's own margin
    # a mean above the margin is not enough: [0.164, 0.276] around 0.2197 against 0.2178
    edge = Spread(0.2197, (0.2197 - 0.164) / 2.3646, 7)
    assert use_verdicts([edge], 0.2178) == ["cannot tell"]


def test_a_use_at_the_margin_reads_uses_rarely_and_twice_the_margin_mostly():
    """Planted cells, 8 windows each (sd 0.1 per window): a true use equal to the margin (0.1) reads "uses" in at
    most 5% of draws (the one-sided level is 2.5%); a true use of twice the margin in most draws. The same with the
    margin itself estimated (a tenth of a planted positive control of 1.0, sd 0.3 per window), its error carried."""
    from eval.stats import spread
    from eval.verdicts import use_margin, use_verdicts
    rng = np.random.default_rng(0)
    draws = 2000
    at, twice, at_estimated = 0, 0, 0
    for _ in range(draws):
        noise = rng.normal(0.0, 0.1, 8)
        at += use_verdicts([spread((0.1 + noise)[None, :])], 0.1) == ["uses"]
        twice += use_verdicts([spread((0.2 + noise)[None, :])], 0.1) == ["uses"]
        margin = use_margin([spread(rng.normal(1.0, 0.3, 8)[None, :])])
        at_estimated += use_verdicts([spread((0.1 + noise)[None, :])], margin) == ["uses"]
    assert at / draws <= 0.05 and at_estimated / draws <= 0.05
    assert twice / draws > 0.5


def test_the_rule_rarely_reads_uses_where_there_is_none():
    """Families of 40 null cells, 8 windows each (a true use of 0): any false "uses" in at most ~2.5% of families;
    a per-cell rule without the correction or the margin (the interval above 0) in most."""
    from eval.stats import spread
    from eval.verdicts import use_verdicts
    rng = np.random.default_rng(0)
    found = uncorrected = 0
    for _ in range(400):
        cells = [spread(v[None, :]) for v in rng.normal(0.0, 0.3, (40, 8))]
        found += "uses" in use_verdicts(cells, 0.05)
        uncorrected += any(c.bounds()[0] > 0 for c in cells)
    assert found / 400 <= 0.04 and uncorrected / 400 > 0.4


def test_reach_needs_every_nearer_distance():
    from eval.verdicts import reach_of
    assert reach_of([100, 200, 300], ["uses", "uses", "cannot tell"]) == 200
    assert reach_of([300, 100, 200], ["uses", "uses", "negligible"]) == 100  # 300 reads uses, 200 does not
    assert reach_of([100, 200], ["none", "uses"]) is None


def test_the_margin_is_a_tenth_of_the_positive_control_with_a_floor_and_carries_its_error():
    from eval.stats import Spread
    from eval.verdicts import use_margin, use_verdicts
    found = use_margin([Spread(2.0, 0.2, 7), Spread(4.0, 0.4, 5)])
    assert found == pytest.approx(0.3) and found.se == pytest.approx(0.03) and found.df == 5
    assert use_margin([Spread(0.2, 0.1, 7)]) == 0.05 and use_margin([Spread(0.2, 0.1, 7)]).se == 0
    assert use_margin(None) == 0.05 and use_margin([None]) == 0.05
    # the margin's error widens the test: 0.45 at se 0.05 clears a fixed 0.3 (t = 3) but not 0.3 +- 0.1
    cell = Spread(0.45, 0.05, 7)
    assert use_verdicts([cell], 0.3) == ["uses"]
    assert use_verdicts([cell], use_margin([Spread(3.0, 1.0, 7)])) == ["cannot tell"]


def test_spearman_matches_scipy_with_ties():
    from experiments.ruler_report import spearman
    # scipy.stats.spearmanr (scipy 1.17.1) on these: 0.9746794344808963 (ties at their mean rank) and -1
    assert spearman([0.9, 0.1, 0.5, 0.5, 0.0], [2.1, 0.2, 1.0, 1.3, 0.0]) == pytest.approx(0.9746794344808963)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_the_rank_correlations_permutation_p_value_counts_every_order_of_the_methods():
    from experiments.ruler_report import spearman_p
    # four methods: +0.80 or more in 4 of the 24 orders (the identity and the three adjacent swaps)
    assert spearman_p([0.0, 1.0, 0.45, 0.8], [0.052, 1.442, -0.015, 0.133]) == pytest.approx(4 / 24)
    assert spearman_p([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == pytest.approx(1 / 120)
    # scipy.stats.permutation_test(permutation_type="pairings", alternative="greater", n_resamples=inf) of
    # scipy.stats.spearmanr (scipy 1.17.1), ties in both: 0.5388888888888889
    assert spearman_p([0.0, 0.0, 0.5, 0.5, 0.9, 1.0], [0.1, 0.3, 0.2, 0.9, 1.4, 0.0]) == pytest.approx(0.5388888888888889)
    assert spearman_p([1, 1, 1], [1, 2, 3]) is None


def test_published_orderings_count_only_the_pairs_the_samples_separate():
    from experiments.ruler_report import concordance, published_rows
    every = {pair: {"separated": True} for pair in (("a", "b"), ("a", "c"), ("b", "c"))}
    assert concordance({"a": 3, "b": 2, "c": 1}, {"a": 0.9, "b": 0.1, "c": 0.5}, every) == (2, 1, 0)
    # b against c not separated: left out, however the shares order it
    some = {**every, ("b", "c"): {"separated": False}}
    assert concordance({"a": 3, "b": 2, "c": 1}, {"a": 0.9, "b": 0.1, "c": 0.5}, some) == (2, 0, 1)
    assert concordance({"a": 3, "b": 2}, {"a": 0.5, "b": 0.5, "c": 1.0}, every) == (0, 0, 1)  # a tie: not counted
    shares = {"yarn": 0.8, "ntk": 0.9, "linear": 0.0, "none": 0.0}
    separated = {pair: {"separated": "linear" in pair or "none" in pair} for pair in
                 (("yarn", "ntk"), ("yarn", "linear"), ("yarn", "none"), ("ntk", "linear"), ("ntk", "none"),
                  ("linear", "none"))}
    rows = published_rows(shares, separated)
    drope = next(row for row in rows if row["source"].startswith("DroPE"))
    # YaRN > NTK > PI = plain published; the lab: NTK > YaRN (not separated) > PI = plain (tied)
    assert (drope["alike"], drope["opposite"], drope["left"]) == (4, 0, 2)
    string = next(row for row in published_rows({"string": 0.9, "yarn": 0.8}, {}) if row["source"].startswith("STRING"))
    assert string["counted"] is False and "within" in string["why"]


def test_mcnemar_and_clopper_pearson_against_hand_values():
    from eval.stats import clopper_pearson, mcnemar_exact
    from eval.verdicts import separated_by_samples
    # the exact two-sided McNemar p: 2 x 0.5^n for n to 0, 2 x P(X <= 1) for 3 to 1
    assert mcnemar_exact(4, 0) == 0.125 and mcnemar_exact(5, 0) == 0.0625 and mcnemar_exact(1, 3) == 0.625
    assert mcnemar_exact(0, 0) == 1.0
    # 10 to 0 (p = 0.00195) separates alone, not among 45 pairs (Holm: 0.05 / 45 = 0.0011)
    assert separated_by_samples([(10, 0)]) == [True] and separated_by_samples([(10, 0)] + [(0, 0)] * 44)[0] is False
    # Clopper-Pearson (R's binom.test): 1 of 8 [0.00316, 0.52651], 5 of 20 [0.08657, 0.49105], 0 of 104 [0, 0.03485]
    assert clopper_pearson(1, 8).low == pytest.approx(0.0031597, abs=1e-6)
    assert clopper_pearson(1, 8).high == pytest.approx(0.5265097, abs=1e-6)
    assert clopper_pearson(5, 20).low == pytest.approx(0.0865715, abs=1e-6)
    assert clopper_pearson(5, 20).high == pytest.approx(0.4910459, abs=1e-6)
    assert clopper_pearson(0, 104).low == 0 and clopper_pearson(0, 104).high == pytest.approx(0.0348483, abs=1e-6)


def test_needle_shares_average_only_the_tasks_every_method_was_asked():
    from experiments.ruler_report import needle_shares

    def cell(method, task, k, length=16):
        return {"method": method, "task": task, "length": length,
                "samples": [{"score": 1.0}] * k + [{"score": 0.5}] * (4 - k)}
    cells = [cell("a", "niah_single_1", 4), cell("a", "niah_multikey_2", 0), cell("b", "niah_single_1", 2),
             cell("b", "ruler_vt", 4), cell("c", "niah_single_1", 1, length=8)]
    assert needle_shares(cells, 16) == {"a": 1.0, "b": 0.5}  # niah_multikey_2 only a has; vt is no needle task
    assert needle_shares(cells + [cell("b", "niah_multikey_2", 4)], 16) == {"a": 0.5, "b": 0.75}


def test_ruler_own_score_is_given_for_tasks_with_several_answers_with_a_bounded_interval():
    from experiments.ruler_report import partial_score, score_text
    vt = {"samples": [{"target": list("abcde"), "score": 0.2}] * 3 + [{"target": list("abcde"), "score": 0.0}] * 17}
    score = partial_score(vt)
    assert score.mean == pytest.approx(0.03) and 0 < score.low < 0.03 < score.high < 0.25
    assert score_text(vt).startswith("0/20 [0.00, 0.16]; score 0.03 [")
    needle = {"samples": [{"target": ["4430567"], "score": 1.0}] * 20}
    assert partial_score(needle) is None and score_text(needle) == "20/20 [0.84, 1.00]"


def test_needle_responses_are_told_apart_by_the_number_they_give():
    from eval.ruler import response_value
    from experiments.ruler_report import value_lines
    # response_value's cases: tests/test_ruler.py; here, the table of what the responses give
    assert response_value(" 1743906.", "8734194", {"1743906"}) == "held"
    values = ["held", "held", "held", "answer", "none"]
    cell = {"method": "none", "task": "niah_multikey_2", "length": 16384,
            "samples": [{"value": value, "target": [f"{i}000000"], "response": f" {(i + 1) % 5}000000"}
                        for i, value in enumerate(values)]}
    assert value_lines([cell])[-2] == "| plain RoPE | niah_multikey_2 @ 16,384 | 5 | 1 | 3 | 0 | 1 |"
    assert value_lines([{**cell, "samples": [{"value": None}]}]) == []


def test_ruler_is_read_pooled_over_the_niah_tasks_and_each_alone_and_held_against_use_with_holm():
    from experiments.ruler_report import correlate, ruler_readings

    def cell(method, task, k, length=16):
        return {"method": method, "task": task, "length": length,
                "samples": [{"score": 1.0}] * k + [{"score": 0.5}] * (4 - k)}
    methods = "abcdef"
    cells = [cell(m, "niah_single_1", 4 - i * 4 // 6) for i, m in enumerate(methods)]
    assert list(ruler_readings(cells, 16)) == ["niah_single_1"]  # one task: no pooled reading
    cells += [cell(m, "niah_multikey_2", 0) for m in methods[:-1]]
    assert list(ruler_readings(cells, 16)) == ["niah_single_1"]  # f was not asked niah_multikey_2
    cells += [cell("f", "niah_multikey_2", 1), cell("a", "ruler_vt", 4)]
    readings = ruler_readings(cells, 16)
    pooled = "mean over niah_multikey_2 and niah_single_1"
    assert list(readings) == [pooled, "niah_multikey_2", "niah_single_1"]
    assert readings["niah_multikey_2"]["f"] == 0.25 and readings[pooled]["f"] == pytest.approx(
        (0.25 + 1 / 4) / 2)
    use = {m: {"book": {100: 6.0 - i, 300: 0.0}} for i, m in enumerate(methods)}
    rows = correlate(readings, use)
    assert len(rows) == 6
    single = next(r for r in rows if r["ruler_reading"] == "niah_single_1" and r["use"] == "mean over the distances")
    multikey = next(r for r in rows if r["ruler_reading"] == "niah_multikey_2" and r["use"] == "mean over the "
                    "distances")
    assert single["spearman"] > 0.9 and single["holm"]  # shares fall with use: 1/720-ish orders, passes Holm at 5%
    assert multikey["spearman"] < 0 and not multikey["holm"]  # only the least-using method answers one


def test_ruler_is_held_against_use_over_the_windows_distances_and_at_the_farthest():
    from experiments.ruler_report import correlate, ordering
    use = {"a": {"book": {100: 2.0, 300: 0.0}}, "b": {"book": {100: 0.5, 300: 0.4}},
           "c": {"book": {100: 0.1, 300: 0.0}, "other": {100: 0.3, 300: 0.2}}}
    shares = {"a": 0.9, "b": 0.5, "c": 0.0, "d": 1.0}  # d has no use: left out
    mean, farthest = correlate({"pooled": shares}, use)
    assert mean["methods"] == ["a", "b", "c"] and mean["reading"] == pytest.approx([1.0, 0.45, 0.15])
    assert mean["spearman"] == pytest.approx(1.0) and mean["p"] == pytest.approx(1 / 6)
    assert farthest["reading"] == pytest.approx([0.0, 0.4, 0.1]) and farthest["spearman"] == pytest.approx(-0.5)
    assert not mean["holm"]  # 1/6 of the orders: no three methods can pass at 5%
    assert correlate({"pooled": {"a": 1.0, "b": 0.0}}, use) == []
    assert ordering({"yarn": 48.25, "linear": 0.0, "none": 0.0}, ["linear", "yarn", "none"]) == \
        "YaRN 48.25 > PI (linear) 0 = plain RoPE 0"


def test_fewer_than_three_draws_give_their_mean_and_no_interval():
    from eval.stats import draws_interval
    two = draws_interval([1.0, 2.0])
    assert two.mean == 1.5 and two.low is None and two.n == 2
    three = draws_interval([1.0, 2.0, 3.0], 0.0)
    assert three.low == pytest.approx(max(0.0, 2.0 - 4.302653 / 3 ** 0.5)) and three.high > 2.0
    assert draws_interval([]) is None
