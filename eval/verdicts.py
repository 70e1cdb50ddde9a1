"""Every word a report says of a number, in one place: each rule that turns estimates (eval/stats.py) into a verdict.

    use of the text          "uses" / "negligible" / "none" / "cannot tell" (use_verdicts over a report's
                             family of cells, each against its margin: use_margin), how far back (reach_of), the
                             positive and the negative controls (positive_control, negative_word)
    harm on text             the extrapolation penalty's side: "flat" / "above" / "below" / "noise" (penalty_side)
    the map                  harm against use: "extrapolates", "window-like", "degrades", ... (map_reading)
    orders                   '<' where two variants differ, '≈' within noise (order_chain, separated_pairs)
    claims                   a paper's threshold claim "reproduced" / "not reproduced" / "within noise" (threshold_claim),
                             a claim between two variants "agrees" / "disagrees" / "cannot tell" (paired_claim), a
                             method against a baseline "better" / "worse" / "the same within 1%" (ratio_word), a
                             sweep's value against the preset's (sweep_choice)
    trends                   "rises" / "falls" / "within noise" between two estimates of separate fleets (movement);
                             where a growing curve points, or why it points nowhere (projection);
                             two orders of the same variants "the same" / "differs" / ... (ordering_pairs,
                             ordering_verdict: a ladder's smallest rung against its largest)
    impossible use           where a method cannot read the copy: past its layers' relay reach (impossible_use)
    pairs of windows         "separated": a paired difference shown not 0, Holm over the family (separated_by_windows)
    pairs on shared samples  "separated": the exact McNemar test, Holm over the family (separated_by_samples)

Studies and eval/ commands read the words from here and from nowhere else (experiments/render.py writes them).
"""
from __future__ import annotations

import math
from typing import Callable

from eval.stats import (
    Estimate,
    Spread,
    excludes_zero,
    holm,
    mcnemar_exact,
    p_above_zero,
    separated,
    t_quantile_975,
    t_sf,
)

USE_RULE = ("'uses' where a one-sided t test, Holm-corrected over the family, shows use above the margin (the "
            "margin's own standard error carried where it is estimated); 'negligible' where it shows use above 0 and "
            "the 95% interval lies below the margin; 'none' where the 95% interval lies within +-margin; else 'cannot "
            "tell' (a cell whose own 95% interval clears the margin can still read 'cannot tell': Holm over the "
            "family asks more)")


def verdict(estimate: Spread | None, margin: float) -> str:
    """One cell's use verdict: use_verdicts over a family of one."""
    return use_verdicts([estimate], margin)[0]


MARGIN_FLOOR = 0.05  # nats: the smallest use called more than negligible, whatever the model
MARGIN_FRACTION = 0.1  # of the model's own use within L (its positive control)


class Margin(float):
    """An equivalence margin in nats, with the uncertainty of its estimate carried: `se` its standard error and `df`
    the degrees of freedom of its t quantile (se 0: a margin fixed before the data). A float everywhere else."""

    se: float
    df: int | None

    def __new__(cls, value: float, se: float = 0.0, df: int | None = None) -> "Margin":
        found = super().__new__(cls, value)
        found.se, found.df = float(se), df
        return found


def use_margin(positive: list[Spread | None] | None, floor: float = MARGIN_FLOOR,
               fraction: float = MARGIN_FRACTION) -> Margin:
    """The margin of the use verdicts, relative to what the model copies as trained: a tenth of its positive
    control's use within L (the mean of its cells), at least `floor` nats. A model that copies +3 nats within L needs
    +0.3 past it to be said to use the text there; a tiny model that copies +0.2 needs the floor, +0.05. Above the
    floor the margin is an estimate and carries its standard error: a tenth of the cells' mean standard error (an
    upper bound on the standard error of their mean, however the cells correlate), with their smallest df."""
    found = [p for p in positive or [] if p is not None and math.isfinite(p.mean)]
    mean = sum(p.mean for p in found) / len(found) if found else None
    if mean is None or fraction * mean <= floor:
        return Margin(floor)
    return Margin(fraction * mean, fraction * sum(p.se for p in found) / len(found), min(p.df for p in found))


def _combined(cell: Spread, margin: float) -> tuple[float, float]:
    """The standard error of use - margin and its degrees of freedom (Welch-Satterthwaite where the margin carries a
    standard error of its own: Margin.se)."""
    own = getattr(margin, "se", 0.0)
    if not own:
        return cell.se, cell.df
    a, b = cell.se ** 2, own ** 2
    df = (a + b) ** 2 / ((a * a / cell.df if cell.df else 0.0) + b * b / margin.df) if a else margin.df
    return math.sqrt(a + b), max(1, int(df))


def use_verdicts(cells: list[Spread | None], margin: float | list[float], alpha: float = 0.025) -> list[str]:
    """The use verdicts of a family of cells (all the cells one report shows), the one rule every report reads:

        "uses"        a one-sided t test shows use above the margin (use - margin > 0), Holm over the family;
        "negligible"  a one-sided t test shows use above 0, Holm over the family, and the 95% interval lies below
                      the margin: real, but too small to matter;
        "none"        the 95% interval of use lies within +-margin (two one-sided tests at 2.5%), not shown above 0;
        "cannot tell" otherwise (a cell shown above 0 whose interval reaches past the margin included: neither
                      shown above it nor below it), and for a cell without an interval (None).

    `margin`: one for every cell or each cell's own; a Margin with a standard error carries it into the "uses" and
    "none" tests (use_margin). A true use at the margin reads "uses" at most alpha of the time."""
    margins = margin if isinstance(margin, list) else [margin] * len(cells)
    for m in margins:
        if not m > 0:
            raise ValueError(f"an equivalence margin must be positive, got {m}")
    against = [None if c is None else _combined(c, m) for c, m in zip(cells, margins)]
    p_margin = [None if c is None else p_above_zero(c.mean - m, se, df)
                for c, m, (se, df) in zip(cells, margins, [a or (0.0, 1) for a in against])]
    p_zero = [None if c is None else p_above_zero(c.mean, c.se, c.df) for c in cells]
    uses, above = holm(p_margin, alpha), holm(p_zero, alpha)
    words = []
    for cell, m, found, shown_uses, shown_above in zip(cells, margins, against, uses, above):
        if cell is None:
            words.append("cannot tell")
        elif shown_uses:
            words.append("uses")
        else:
            half = t_quantile_975(found[1]) * found[0]
            below = cell.mean + half < m
            words.append("negligible" if shown_above and below else
                         "none" if below and cell.mean - half > -m else "cannot tell")
    return words


def reach_of(distances: list[int], verdicts: list[str]) -> int | None:
    """The largest distance at which this distance and every nearer one read "uses" (None: not even the nearest)."""
    farthest = None
    for distance, word in sorted(zip(distances, verdicts)):
        if word != "uses":
            break
        farthest = distance
    return farthest

# ----------------------------------------------------------------------------------------------------- controls

def positive_control(distances: list[int], lengths: list[int], verdicts: list[str], trained: int) -> bool | None:
    """Whether use is shown at some distance within L in windows of at most L (None: no such column)."""
    within = [v for d, n, v in zip(distances, lengths, verdicts) if d < trained and n <= trained]
    return None if not within else "uses" in within


def negative_word(verdicts) -> str:
    """The negative control in a word: it passes where every verdict past the reach is 'none' or 'negligible' (within
    the margin), fails where one is 'uses' (the measure reads use where none is possible), and is too noisy to
    confirm otherwise."""
    verdicts = list(verdicts)
    if "uses" in verdicts:
        return "FAILS: the measure reads use where none is possible"
    return "passes" if all(v in ("none", "negligible") for v in verdicts) else \
        "not confirmed: too noisy to show use within the margin everywhere"


# ---------------------------------------------------------------------------------------------------- harm

# A penalty whose whole interval lies within +-FLAT nats (+-1% perplexity) is called flat: too small to matter, even
# where the interval excludes zero.
FLAT = 0.01


def penalty_side(estimate: Estimate) -> str:
    """'flat', 'above' (degrades beyond L), 'below' (gains from the longer context), 'noise', or 'single' (one
    seed: no interval, nothing to claim)."""
    if not estimate.has_interval:
        return "single"
    if -FLAT < estimate.low and estimate.high < FLAT:
        return "flat"
    if estimate.low > 0:
        return "above"
    if estimate.high < 0:
        return "below"
    return "noise"


PENALTY_MEANINGS = {"flat": f"flat (the interval lies within +-{FLAT} nats)",
                    "above": "positions beyond L cost more than the longer context gives",
                    "below": "it gains from the longer context", "noise": "within noise of no change",
                    "single": "one seed, no interval"}


def map_reading(harm: Estimate | None, uses_past_l: bool, positive: bool | None, measured: bool = True) -> str:
    """The extrapolation map's word for a variant: its harm on text (the penalty at the longest length) against
    whether it uses the text past L. `positive`: its positive control (False: use not shown even within L);
    `measured`: whether use was measured at all."""
    side = penalty_side(harm) if harm is not None else "single"
    if positive is False:
        return "no use within L: cannot tell"
    if not measured:
        return "no use measured"
    if uses_past_l:
        return {"flat": "extrapolates", "below": "extrapolates", "noise": "extrapolates (text within noise)"}.get(
            side, "uses the context past L but degrades on text" if side == "above" else "uses the context past L "
            "(one seed: no text interval)")
    return {"flat": "window-like", "below": "window-like", "noise": "window-like (text within noise)",
            "above": "degrades"}.get(side, "does not beat its window (one seed: no text interval)")


MAP_ORDER = ["extrapolates", "extrapolates (text within noise)", "uses the context past L but degrades on text",
             "window-like", "window-like (text within noise)", "degrades", "no use within L: cannot tell"]


# ------------------------------------------------------------------------------------------------------ orders

def order_chain(estimates: list[tuple[Estimate, str]], digits: str = ".1f",
                differ: Callable[[str, str], bool] | None = None) -> str:
    """The names by their estimates' means, lowest first, each with its mean (format `digits`); '<' between
    neighbours that differ, '≈' (within noise) where they do not. differ(lower, higher): whether two names differ
    (a comparison: their paired difference excludes 0); by default, whether their 95% intervals separate (estimates
    of separate fleets). '' for none."""
    ranked = sorted(estimates, key=lambda pair: pair[0].mean)
    if not ranked:
        return ""
    parts = [f"{ranked[0][1]} ({ranked[0][0].mean:{digits}})"]
    for (previous, below), (current, name) in zip(ranked, ranked[1:]):
        different = differ(below, name) if differ is not None else separated(previous, current)
        parts.append(("< " if different else "≈ ") + f"{name} ({current.mean:{digits}})")
    return " ".join(parts)


def separated_pairs(estimates: list[tuple[Estimate, str]], differ: Callable[[str, str], bool]) -> str | None:
    """Every pair that differs (differ(better, worse)), not only neighbours in the order (a chain of '≈' can join
    two that differ): "a < b, c; ...". None when fewer than two have an interval."""
    ranked = sorted(((e, name) for e, name in estimates if e and e.has_interval), key=lambda p: p[0].mean)
    if len(ranked) < 2:
        return None
    pairs = []
    for index, (_, name) in enumerate(ranked):
        worse = [other for _, other in ranked[index + 1:] if differ(name, other)]
        if worse:
            pairs.append(f"{name} < {', '.join(worse)}")
    return "; ".join(pairs) if pairs else "none"


def movement(first: Estimate, last: Estimate, up: str = "rises", down: str = "falls") -> str:
    """How an estimate moved from `first` to `last` (estimates of separate fleets): `up` or `down` where the two
    intervals separate, else 'within noise'."""
    if not separated(first, last):
        return "within noise"
    return up if last.mean > first.mean else down


def relation(a: Estimate | None, b: Estimate | None) -> str:
    """'<' or '>' where the intervals separate, '≈' where they overlap, '?' without both."""
    if a is None or b is None:
        return "?"
    if not separated(a, b):
        return "≈"
    return "<" if a.mean < b.mean else ">"


# ------------------------------------------------------------------------------------------------------ claims

def threshold_claim(estimate: Estimate | None, threshold: float, holds_above: bool) -> str:
    """A paper's claim that a quantity lies above (or at most at) `threshold`: 'reproduced' when the interval lies
    on the claim's side, 'not reproduced' when it lies on the other side, 'within noise' when it straddles it."""
    if estimate is None:
        return "not measured here"
    if not estimate.has_interval:
        return "undetermined (one seed: no interval)"
    if estimate.low > threshold:
        return "reproduced" if holds_above else "not reproduced"
    if estimate.high <= threshold:
        return "not reproduced" if holds_above else "reproduced"
    return f"within noise (the interval straddles {threshold:g})"


def ratio_word(ratio: Estimate) -> str:
    """A perplexity ratio (a method over its baseline, paired by seed): 'better' / 'worse' where the interval excludes
    1, 'the same within 1%' where the whole interval lies within +-FLAT nats; else 'within noise'."""
    if ratio.low is None or ratio.high is None:
        return "one seed, no interval"
    if ratio.low >= math.exp(-FLAT) and ratio.high <= math.exp(FLAT):
        return "the same within 1%"
    if ratio.high < 1:
        return "better"
    if ratio.low > 1:
        return "worse"
    return "within noise"


def ratio_claim(change: Estimate, expected: str) -> str:
    """A paper's claim that a variant's perplexity is "lower" than, or "not higher" (within the flat band) than, a
    baseline's, from their ratio paired by seed."""
    limit = 1.0 if expected == "lower" else math.exp(FLAT)
    if change.high < limit or (expected == "not higher" and change.high <= limit):
        return "agrees"
    if change.low >= limit:
        return "disagrees (the interval excludes what the paper claims)"
    return "cannot tell (within noise)"


def penalty_claim(difference: Estimate, expected: str) -> str:
    """A paper's claim that a variant's penalty is "lower" than, or "not higher" than, a baseline's, from their
    difference paired by seed and window."""
    if difference.high < 0:
        return "agrees"
    if difference.low > 0 and not (expected == "not higher" and difference.high <= FLAT):
        return "disagrees (the paired difference excludes 0 the other way)"
    if expected == "not higher" and difference.high <= FLAT:
        return "agrees (at most the 0.01-nat flat band higher)"
    return "cannot tell (the paired difference's interval holds 0)"


def differs(estimate: Estimate | None) -> bool:
    """Whether a paired difference says two variants differ: its interval excludes 0."""
    return excludes_zero(estimate)



# ------------------------------------------------------------------------ the use grid's cells and pairs of windows

def relay_reach(window: int | None, layers: int) -> int | None:
    """How far back a stack of layers that each see `window` keys (the query's own included) can carry a token:
    layers x (window - 1) (None: no window, every key)."""
    return None if window is None else layers * (window - 1)


def impossible_use(distance: int, window: int | None, layers: int, span: int) -> str | None:
    """Why a method cannot read a first copy `distance` back, or None: past what its layers relay (relay_reach) by
    more than a passage's length `span` (within it, the later tokens of a first copy are within reach). A method
    without a window may read any distance: nothing else makes a cell impossible by construction."""
    relay = relay_reach(window, layers)
    if relay is not None and distance > relay + span:
        return f"past what its {layers} layers of {window:,}-key windows relay ({relay:,} tokens) plus a passage"
    return None


def separated_by_windows(differences: list[tuple[float, float | None, int]], alpha: float = 0.05) -> list[bool]:
    """Which paired differences (mean, standard error over windows, windows) are "separated": shown not 0 by the
    two-sided t test over windows, Holm-corrected over the whole family at `alpha`. A difference without a spread
    (no standard error, or 0: the same in every window) has no test and is never separated."""
    p_values = [2 * t_sf(abs(mean) / se, n - 1) if se else None for mean, se, n in differences]
    return holm(p_values, alpha)


def separated_by_samples(discordant: list[tuple[int, int]], alpha: float = 0.05) -> list[bool]:
    """Which pairs of methods answering the same samples are "separated": (samples only the first answered, samples
    only the second answered) shown unequal by the exact McNemar test, Holm-corrected over the family at `alpha`."""
    return holm([mcnemar_exact(a, b) for a, b in discordant], alpha)


def ordering_pairs(names: list[str], small: dict[str, Estimate | None], large: dict[str, Estimate | None],
                   rungs: tuple[str, str]) -> dict[str, list[str]]:
    """Every pair of `names` by their estimates at two settings (a ladder's smallest and largest rung, named `rungs`):
    'same' (the same separated order at both), 'reversed' (separated in opposite directions), 'only_small' /
    'only_large' (separated at one, within noise at the other), 'neither' (within noise at both); a pair without both
    estimates at both is left out. ORDERING_WORDS say each kind but 'neither' in words."""
    kinds: dict[str, list[str]] = {"same": [], "reversed": [], "only_small": [], "only_large": [], "neither": []}
    for index, a in enumerate(names):
        for b in names[index + 1:]:
            here, there = relation(small.get(a), small.get(b)), relation(large.get(a), large.get(b))
            if "?" in (here, there):
                continue
            pair = f"{a} {here} {b}" if here != "≈" else f"{a} {there} {b}"
            if here == there == "≈":
                kinds["neither"].append(f"{a} ≈ {b}")
            elif here == there:
                kinds["same"].append(pair)
            elif "≈" not in (here, there):
                kinds["reversed"].append(f"{a} {here} {b} at {rungs[0]}, {a} {there} {b} at {rungs[1]}")
            else:
                kinds["only_small" if there == "≈" else "only_large"].append(pair)
    return kinds


ORDERING_WORDS = {"same": "separated the same way at both", "reversed": "reversed",
                  "only_small": "separated at {small} only", "only_large": "separated at {large} only"}


def ordering_verdict(kinds: dict[str, list[str]]) -> str:
    """Whether two orders agree (ordering_pairs' kinds), in words."""
    if not (kinds["same"] or kinds["reversed"] or kinds["only_small"] or kinds["only_large"]):
        return "not told apart: no pair separates at either rung"
    if kinds["reversed"]:
        return "differs: a pair separated at both rungs is in opposite orders"
    if kinds["only_small"] or kinds["only_large"]:
        return ("no pair reverses, but some pairs separate at one rung only (the orders agree where both rungs "
                "tell them apart)")
    return "the same: every pair separated at one rung is separated the same way at the other"


def sweep_choice(best: str, default: str, difference: Estimate | None) -> tuple[str, str]:
    """A sweep's choice for one variant: the value of lowest mean loss (`best`) where its loss less the preset's value's
    (`default`), paired by seed, has an interval below 0, else the preset's value; (the value chosen, why)."""
    if best == default:
        return default, "the preset's value is best"
    if difference is not None and difference.high is not None and difference.high < 0:
        return best, "better than the preset's value"
    return default, "within noise of the preset's value"


def projection(points: list[tuple[int, Estimate]], target: float) -> str:
    """Where a growing curve (order within L against tokens trained: the budget search) points from its last two
    points: the tokens at which it would reach `target` if its last doubling's growth went on (geometric, the
    optimistic reading) and if its gain per doubling went on (linear in log tokens, the pessimistic one). Only from
    points shown above 0 (interval above 0) and growing: noise has no direction."""
    if len(points) < 2:
        return "one kept model: no projection"
    (t1, e1), (t2, e2) = points[-2], points[-1]
    o1, o2, doublings = e1.mean, e2.mean, math.log2(t2 / t1)
    shown = [e.has_interval and e.low > 0 for e in (e1, e2)]
    if not shown[1]:
        return f"order at the last kept model {e2.format(3, signed=True)}, not shown above 0: no projection"
    if o2 <= o1:
        return f"order did not grow over its last {doublings:.0f} doubling(s) ({o1:+.3f} -> {o2:+.3f}): no projection"

    def tokens(count: float) -> str:
        return "beyond 1e15 tokens" if count > 1e15 else f"{count:.2g} tokens"

    gain = (o2 - o1) / doublings
    text = f"gain {gain:+.3f} nats per doubling, linear in log tokens: {tokens(t2 * 2 ** ((target - o2) / gain))}"
    if shown[0]:
        growth = (o2 / o1) ** (1 / doublings)
        text = f"x{growth:.2f} per doubling, geometric: {tokens(t2 * 2 ** (math.log(target / o2) / math.log(growth)))}; " \
               + text
    return f"from {t1:,} to {t2:,} tokens, " + text
