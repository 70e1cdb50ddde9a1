"""eval.stats against independent references: scipy's t quantiles (when installed) and the Wilson interval as the
set of rates that a score test at 95% does not reject (found by bisection)."""
import math

import pytest

from eval.stats import Z_975, t_interval, t_quantile_975, wilson_interval


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
