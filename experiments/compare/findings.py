"""The comparison's findings: plain statements computed from the numbers, each ordering and each paper's claim stated
only where the 95% interval allows it ("within noise" otherwise). A claim between two variants rests on their
difference paired by seed (the same seed is the same initialisation seed and data order for every variant; penalties
are paired by window too), not on whether their own intervals overlap. report.py writes them into report.md; the
scale ladder (experiments/ladder.py) states its orders and trends with the same helpers (order_chain, movement).
"""
from __future__ import annotations

import math
from typing import Callable

from eval.stats import Estimate
from experiments.compare.results import Snapshots, Variant
from experiments.seed_intervals import excludes_zero, perplexity_ratio_interval, separated
from model.encodings import POSITION_ENCODINGS
from model.methods import NONE, label

PAPER = "the ALiBi paper (Press et al. 2022; WikiText-103, 247M parameters, L = 512)"


def order_chain(estimates: list[tuple[Estimate, str]], digits: str = ".1f",
                differ: Callable[[str, str], bool] | None = None) -> str:
    """The names by their estimates' means, lowest first, each with its mean (format `digits`); '<' between
    neighbours that differ, '≈' (within noise) where they do not. differ(lower, higher): whether two names differ
    (the comparison: their paired difference excludes 0); by default, whether their 95% intervals separate (the
    ladder, whose estimates come from separate comparisons). '' for none."""
    ranked = sorted(estimates, key=lambda pair: pair[0].mean)
    if not ranked:
        return ""
    parts = [f"{ranked[0][1]} ({ranked[0][0].mean:{digits}})"]
    for (previous, below), (current, name) in zip(ranked, ranked[1:]):
        different = differ(below, name) if differ is not None else separated(previous, current)
        parts.append(("< " if different else "≈ ") + f"{name} ({current.mean:{digits}})")
    return " ".join(parts)


def movement(first: Estimate, last: Estimate, up: str = "rises", down: str = "falls") -> str:
    """How an estimate moved from `first` to `last`: `up` or `down` where the two intervals separate, else 'within
    noise'."""
    if not separated(first, last):
        return "within noise"
    return up if last.mean > first.mean else down


def loss_differs(variants: dict[str, Variant], length: int) -> Callable[[str, str], bool]:
    """differ(a, b) for order_chain: whether a's loss at `length` less b's, paired by seed, excludes 0."""
    return lambda a, b: excludes_zero(variants[a].nll_difference(variants[b], length))


def order_statement(variants: dict[str, Variant], length: int, multiple: float) -> str | None:
    """Best to worst at one length; '<' where the loss difference of neighbours, paired by seed, excludes 0, '≈'
    (within noise) where it does not."""
    chain = order_chain([(v.ppl(length), name) for name, v in variants.items() if v.ppl(length)],
                        differ=loss_differs(variants, length))
    return f"Perplexity at {multiple:g}x, best to worst: {chain}." if chain else None


def separated_pairs(variants: dict[str, Variant], length: int) -> str | None:
    """Every pair whose loss difference, paired by seed, excludes 0, not only neighbours in the order (a chain of
    '≈' can join two variants that differ). None when fewer than two have an interval."""
    estimates = [(v.ppl(length), name) for name, v in variants.items()]
    estimates = sorted(((e, name) for e, name in estimates if e and e.has_interval), key=lambda p: p[0].mean)
    if len(estimates) < 2:
        return None
    differ = loss_differs(variants, length)
    pairs = []
    for index, (_, name) in enumerate(estimates):
        worse = [other for _, other in estimates[index + 1:] if differ(name, other)]
        if worse:
            pairs.append(f"{name} < {', '.join(worse)}")
    return "; ".join(pairs) if pairs else "none"


def verdict(estimate: Estimate | None, threshold: float, holds_above: bool) -> str:
    """'reproduced' when the interval lies on the claim's side of the threshold, 'not reproduced' when it lies on
    the other side, 'within noise' when it straddles it (or there is no interval)."""
    if estimate is None:
        return "not measured here"
    if not estimate.has_interval:
        return "undetermined (one seed: no interval)"
    if estimate.low > threshold:
        return "reproduced" if holds_above else "not reproduced"
    if estimate.high <= threshold:
        return "not reproduced" if holds_above else "reproduced"
    return f"within noise (the interval straddles {threshold:g})"


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


MEANINGS = {"flat": f"flat (the interval lies within +-{FLAT} nats)",
            "above": "positions beyond L cost more than the longer context gives",
            "below": "it gains from the longer context", "noise": "within noise of no change",
            "single": "one seed, no interval"}


def absolute_gap(variants: dict[str, Variant], variant: Variant, first: int) -> str:
    """For an absolute encoding (it adds positions to the embeddings: sinusoidal, learned), its 1x perplexity
    against RoPE's, the gap every claim about its extrapolation should be read with; '' otherwise."""
    encoding = POSITION_ENCODINGS.get(variant.encoding)
    rope = variants.get("rope")
    if encoding is None or encoding.per_layer or rope is None or not rope.ppl(first) or not variant.ppl(first):
        return ""
    ratio = variant.ppl(first).mean / rope.ppl(first).mean
    return (f" (absolute encoding; its 1x perplexity is {ratio:.2f}x RoPE's, "
            f"{'within' if abs(ratio - 1) <= 0.10 else 'not within'} 10%)")


def penalty_statement(variant: Variant, length: int, gap: str = "") -> str | None:
    estimate = variant.penalty_estimate(length)
    if estimate is None:
        return None
    return f"{variant.label} {estimate.format(3, signed=True)} nats: {MEANINGS[penalty_side(estimate)]}{gap}"


# The ALiBi paper's order of degradation beyond L (its Figure 1, perplexity against evaluation length): the
# sinusoid worst, then rotary, then the T5 bias; ALiBi flat.
PAPER_ORDER = ["sinusoidal", "rope", "t5", "alibi"]


def paper_order_finding(variants: dict[str, Variant], longest: int, first: int, trained: int) -> str | None:
    """Each neighbouring pair of PAPER_ORDER present here, by the penalty at the longest length: 'agrees' where
    their difference (paired by seed and window) excludes 0 in the paper's direction, 'reversed' where it excludes 0
    the other way, else 'within noise'."""
    present = [name for name in PAPER_ORDER if name in variants and variants[name].penalty_estimate(longest)]
    if len(present) < 2:
        return None
    parts = []
    for worse, better in zip(present, present[1:]):
        a, b = variants[worse].penalty_estimate(longest), variants[better].penalty_estimate(longest)
        difference = variants[worse].penalty_difference(variants[better], longest)
        word = ("undetermined (no interval)" if difference is None or not difference.has_interval else
                "agrees" if difference.low > 0 else "reversed" if difference.high < 0 else "within noise")
        shown = f", difference {difference.format(3, signed=True)}" if difference is not None else ""
        parts.append(f"{worse} ({a.mean:+.3f}) > {better} ({b.mean:+.3f}{shown}): {word}")
    gaps = "".join(f" {name}{absolute_gap(variants, variants[name], first)}." for name in present
                   if absolute_gap(variants, variants[name], first))
    return ("  - the order of degradation beyond L (sinusoidal > rotary > T5 > ALiBi), by the penalty at "
            f"{longest / trained:g}x: " + "; ".join(parts) + "." + gaps)


def findings(variants: dict[str, Variant], lengths: list[int], trained: int, probe_offsets: list[int]) -> list[str]:
    """Plain statements computed from the numbers; each ordering and claim only where the intervals allow."""
    if not variants:
        return ["No variant could be evaluated; see the status column above."]
    first, longest = min(lengths), max(lengths)
    # With inference-time methods the orderings and the per-variant penalties cover the encodings as trained; the
    # methods are compared with the same trained models below, paired by seed, and grouped by penalty side.
    as_trained = {name: v for name, v in variants.items() if v.method == NONE}
    ordered = as_trained if as_trained and len(as_trained) < len(variants) else variants
    lines = []
    for length in sorted({first, longest}):
        statement = order_statement(ordered, length, length / trained)
        if statement:
            lines.append(f"- {statement}")
            pairs = separated_pairs(ordered, length)
            if pairs:
                lines.append(f"  Pairs that differ at {length / trained:g}x (better < worse): {pairs}.")
    lines.append("  ('<': the loss difference of the two, paired by seed, has a 95% t interval that excludes 0; '≈': "
                 "it does not, so the order is within noise; '≈' is not transitive, hence the pairs.)")
    if ordered is not variants:
        lines.append("  (The encodings as trained; each inference-time method against the same trained models: "
                     "below, paired by seed.)")
    penalties = [penalty_statement(v, longest, absolute_gap(variants, v, first)) for v in ordered.values()]
    penalties = [p for p in penalties if p]
    if penalties:
        lines.append(f"- Extrapolation penalty at {longest / trained:g}x (positions >= L against the L-window "
                     "reference): " + "; ".join(penalties) + ".")
    grouped: dict[str, list[tuple[float, str]]] = {"above": [], "below": [], "flat": [], "noise": [], "single": []}
    for variant in variants.values():
        estimate = variant.penalty_estimate(longest)
        if estimate is not None:
            grouped[penalty_side(estimate)].append((estimate.mean, f"{variant.label} ({estimate.mean:+.3f})"))
    names = {side: ", ".join(name for _, name in sorted(items, reverse=side == "above")) or "none"
             for side, items in grouped.items()}
    lines.append(f"- At {longest / trained:g}x, largest penalty first. Degrade beyond L (interval above 0): "
                 f"{names['above']}. Flat (interval within +-{FLAT} nats, i.e. +-1% perplexity): {names['flat']}. "
                 f"Gain from the longer context (interval below 0): {names['below']}. "
                 f"Within noise of 0: {names['noise']}." + (f" One seed, so no interval: {names['single']}."
                                                             if grouped["single"] else "")
                 + "".join(f" {v.label}{absolute_gap(variants, v, first)}." for v in ordered.values()
                           if absolute_gap(variants, v, first)))
    lines += probe_findings(variants, probe_offsets, trained)
    lines += method_findings(variants, lengths, trained)
    lines += newer_claim_findings(variants, lengths, trained)
    lines.append(f"- Against {PAPER} (the paper reports nonoverlapping perplexity, so these use the ratio to each "
                 "model's own 1x perplexity, per seed, with a t interval):")
    checks = [
        ("sinusoidal", 2 * trained, 2.0, True, "sinusoidal perplexity more than doubles by 2x"),
        ("t5", 4 * trained, 1.25, False, "T5 bias holds (within 25%) to 4x"),
        ("alibi", longest, 1.10, False, f"ALiBi stays flat (within 10%) out to {longest / trained:g}x"),
        ("rope", longest, 1.10, True, f"rotary degrades (more than 10%) by {longest / trained:g}x"),
    ]
    for name, length, threshold, above, claim in checks:
        variant = variants.get(name)
        estimate = variant.ratio(length, first) if variant and length in lengths else None
        shown = f" ({name} at {length / trained:g}x = {estimate.format(2)}x its 1x perplexity)" if estimate else ""
        gap = absolute_gap(variants, variant, first) if variant else ""
        lines.append(f"  - {claim}: {verdict(estimate, threshold, above)}{shown}{gap}.")
    order = paper_order_finding(variants, longest, first, trained)
    if order:
        lines.append(order)
    sinusoidal, rope = variants.get("sinusoidal"), variants.get("rope")
    if sinusoidal and rope and sinusoidal.ppl(first) and rope.ppl(first):
        ratio = sinusoidal.ppl(first).mean / rope.ppl(first).mean
        line = (f"  - sinusoidal equals rotary at 1x (paper: 20.05 vs 20.07): here {sinusoidal.ppl(first).mean:.1f}"
                f" vs {rope.ppl(first).mean:.1f}, a ratio of {ratio:.3f} "
                f"({'within' if abs(ratio - 1) <= 0.10 else 'not within'} 10%; the difference paired by seed "
                f"{'differs from' if excludes_zero(sinusoidal.nll_difference(rope, first)) else 'is within noise of'}"
                " 0)")
        shifted = sinusoidal.probe_estimate(trained)
        if shifted and sinusoidal.probe_estimate(0):
            line += (f". The shift probe shows the sinusoidal model relies on absolute positions: the same windows "
                     f"score {shifted.mean / sinusoidal.probe_estimate(0).mean - 1:+.0%} perplexity when only their "
                     "positions move by L")
        lines.append(line + ".")
    return lines


def snapshot_findings(snapshots: Snapshots, budget: int, longest_multiple: float) -> list[str]:
    """How each variant's penalty at the longest length moves from the first kept model to the final one."""
    moves = []
    for name, rows in snapshots.items():
        if len(rows) < 2:
            continue
        (_, first, _, _), (_, last, _, _) = rows[0], rows[-1]
        moves.append(f"{name} {first.mean:+.3f} -> {last.mean:+.3f} ({movement(first, last)})")
    if not moves:
        return []
    return [f"- Penalty at {longest_multiple:g}x from the model kept at {rows[0][0]:g} of the {budget:,}-token budget "
            "to the final one: " + "; ".join(moves) + "."]


def paired_change(variant: Variant, baseline: Variant, length: int) -> Estimate | None:
    """Perplexity ratio variant / baseline at `length`, paired by seed (the same trained model under two methods),
    with the t interval over seeds of the NLL differences, exponentiated."""
    here, there = variant.nll.get(length, {}), baseline.nll.get(length, {})
    seeds = [s for s in here if s in there]
    return perplexity_ratio_interval([here[s] for s in seeds], [there[s] for s in seeds])


def method_findings(variants: dict[str, Variant], lengths: list[int], trained: int) -> list[str]:
    """For each inference-time method other than the RoPE scalings: whether it beats the model as trained ("plain
    extrapolation") and the same model under YaRN, at 4x and at the longest length, paired by seed."""
    targets = sorted({length for length in lengths if length in (4 * trained, max(lengths)) and length > trained})
    lines = []
    for variant in variants.values():
        if variant.method in (NONE, "yarn") or "+" not in variant.label:
            continue
        plain = variants.get(variant.encoding)
        yarn = variants.get(label(variant.encoding, "yarn"))
        parts = []
        for length in targets:
            for name, baseline in (("plain", plain), ("yarn", yarn)):
                if baseline is None or baseline is variant:
                    continue
                change = paired_change(variant, baseline, length)
                if change is None:
                    continue
                side = verdict_word(change)
                parts.append(f"{length / trained:g}x vs {name}: {change.format(3)}x perplexity, {side}")
        if parts:
            lines.append(f"  - {variant.label}: " + "; ".join(parts) + ".")
    if not lines:
        return []
    return ["- Inference-time methods against the same trained models as trained (plain) and under YaRN, as a "
            "perplexity ratio paired by seed (< 1: the method helps; 'better' / 'worse' where the 95% interval "
            "excludes 1, 'the same within 1%' where it lies within +-1%, else 'within noise'):", *lines]


# Claims of the newer encodings' papers that this comparison can test: (variant, baseline, at "1x" or "longest",
# what the paper expects of the perplexity ratio variant / baseline: "lower" or "not higher", the claim).
NEWER_CLAIMS = [
    ("xpos", "rope", "longest", "lower", "xPos extrapolates better than RoPE (Sun et al. 2022)"),
    ("kerple", "alibi", "longest", "not higher", "KERPLE-log extrapolates at least as well as ALiBi (Chi et al. 2022)"),
    ("fire", "rope", "longest", "lower", "FIRE generalises to longer inputs better than RoPE (Li et al. 2024)"),
    ("fire", "alibi", "longest", "not higher", "FIRE is at least as good as ALiBi beyond L (Li et al. 2024)"),
    ("fire-512", "alibi", "longest", "not higher", "FIRE with the public code's T0 = 512 is at least as good as ALiBi "
     "beyond L (Li et al. 2024)"),
    ("fire-512", "fire", "longest", "not higher", "FIRE's threshold T0 = 512 (the public code's) does no worse beyond L "
     "than T0 = L"),
    ("cope", "rope", "1x", "not higher", "CoPE's perplexity is no worse than RoPE's (Golovneva et al. 2024)"),
    ("p-rope", "rope", "1x", "not higher", "p-RoPE (p = 0.75) loses nothing against RoPE (Barbero et al. 2025)"),
    ("rnope-swa", "rope", "longest", "lower", "windowed RoPE + global NoPE layers generalise beyond L better than RoPE "
     "(Yang et al. 2025)"),
    ("irope", "rope", "longest", "lower", "interleaved NoPE layers (iRoPE, Llama 4) extrapolate better than RoPE"),
    ("fox", "rope", "1x", "not higher", "FoX's perplexity is at or below RoPE's (Lin et al. 2025)"),
    ("fox", "rope", "longest", "lower", "FoX extrapolates beyond L better than RoPE (Lin et al. 2025)"),
    ("stickbreaking", "rope", "longest", "lower", "stick-breaking attention extrapolates beyond L better than softmax "
     "with RoPE (Tan et al. 2025)"),
    ("ssmax", "none", "longest", "lower", "SSMax lowers NoPE's extrapolation penalty (Nakanishi 2025)"),
    ("ssmax-rope", "rope", "longest", "lower", "SSMax lowers RoPE's extrapolation penalty, as the paper trains it "
     "(Nakanishi 2025)"),
    ("dape", "alibi", "1x", "not higher", "DAPE's perplexity is at or below that of ALiBi, its base (Zheng et al. "
     "2024)"),
    ("dape", "alibi", "longest", "not higher", "DAPE extrapolates at least as well as ALiBi, its base (Zheng et al. "
     "2024)"),
    ("rope-randomized", "rope", "longest", "lower", "randomized positions lower RoPE's extrapolation penalty (Ruoss "
     "et al. 2023)"),
    ("path", "rope", "1x", "lower", "PaTH's perplexity is below RoPE's (Yang et al. 2025)"),
    ("path", "rope", "longest", "lower", "PaTH extrapolates beyond L better than RoPE (Yang et al. 2025)"),
    ("asentmax", "ssmax", "longest", "lower", "ASEntmax extrapolates beyond L better than Scalable-Softmax "
     "(Vasylenko et al. 2026)"),
    ("asentmax", "none", "longest", "lower", "ASEntmax extrapolates beyond L better than softmax (Vasylenko et al. "
     "2026)"),
    ("pope", "rope", "1x", "lower", "PoPE's perplexity is below RoPE's (Gopalakrishnan et al. 2025)"),
    ("pope", "rope", "longest", "lower", "PoPE extrapolates beyond L better than RoPE (Gopalakrishnan et al. 2025)"),
    ("pope", "rope+yarn", "longest", "lower", "PoPE extrapolates beyond L better than RoPE under YaRN, zero-shot "
     "(Gopalakrishnan et al. 2025)"),
    ("fope", "rope", "longest", "lower", "FoPE extrapolates beyond L better than RoPE (Hua et al. 2025)"),
    ("rope-resonance", "rope", "longest", "lower", "Resonance RoPE extrapolates beyond L better than RoPE (Wang et al. "
     "2024)"),
    ("rope-resonance+resonance", "rope+yarn", "longest", "lower", "Resonance YaRN extrapolates beyond L better than "
     "YaRN (Wang et al. 2024)"),
    ("swan", "rope", "longest", "lower", "global NoPE layers between windowed RoPE ones (SWAN-GPT) generalise beyond L "
     "better than RoPE (Puvvada et al. 2025)"),
    ("recipe-gated", "rope", "1x", "lower", "the output gate lowers perplexity (Qiu et al. 2025)"),
    ("recipe-gated", "rope", "longest", "lower", "the output gate improves extrapolation beyond L (Qiu et al. 2025)"),
    ("recipe-gemma3", "recipe-qwen3", "1x", "not higher", "5 local layers per global one cost no perplexity against "
     "global attention everywhere (Gemma Team 2025)"),
    ("recipe-gemma3", "recipe-qwen3", "longest", "lower", "Gemma 3's local layers lose less beyond L than global "
     "RoPE layers everywhere (harm only: use is measured apart)"),
    ("recipe-llama4+temperature", "recipe-llama4", "longest", "lower", "Llama 4's query temperature in the NoPE layers "
     "improves extrapolation (Meta 2025, attn_temperature_tuning)"),
    ("recipe-llama4", "rope", "longest", "lower", "iRoPE with chunked RoPE layers (Llama 4) loses less beyond L than "
     "RoPE (harm only)"),
    ("recipe-smollm3", "rope", "longest", "lower", "NoPE in every 4th layer (SmolLM3) loses less beyond L than RoPE"),
    ("recipe-mla", "rope", "longest", "lower", "decoupled RoPE (MLA) loses less beyond L than RoPE"),
]


def newer_claim_findings(variants: dict[str, Variant], lengths: list[int], trained: int) -> list[str]:
    """Each claim of NEWER_CLAIMS whose two variants were compared, and whether the data agree with the paper,
    disagree (the intervals separate the other way), or cannot tell. A claim about extrapolation compares the two
    extrapolation penalties at the longest length (t intervals over seeds and windows; they do not mix in how good each model is
    at 1x, which varies much between seeds here); a claim at 1x uses the perplexity ratio paired by seed."""
    lines = []
    for name, baseline, where, expected, claim in NEWER_CLAIMS:
        if name not in variants or baseline not in variants:
            continue
        if where == "1x":
            length = min(lengths)
            change = paired_change(variants[name], variants[baseline], length)
            if change is None or change.low is None:
                continue
            limit = 1.0 if expected == "lower" else math.exp(FLAT)  # "not higher" tolerates the flat band
            outcome = ("agrees" if change.high < limit or (expected == "not higher" and change.high <= limit) else
                       "disagrees (the interval excludes what the paper claims)" if change.low >= limit else
                       "cannot tell (within noise)")
            evidence = f"{name} / {baseline} perplexity at 1x = {change.format(3)}x"
        else:
            length = max(lengths)
            mine, theirs = variants[name].penalty_estimate(length), variants[baseline].penalty_estimate(length)
            difference = variants[name].penalty_difference(variants[baseline], length)
            if mine is None or theirs is None or difference is None or not difference.has_interval:
                continue
            if difference.high < 0:
                outcome = "agrees"
            elif difference.low > 0 and not (expected == "not higher" and difference.high <= FLAT):
                outcome = "disagrees (the paired difference excludes 0 the other way)"
            elif expected == "not higher" and difference.high <= FLAT:
                outcome = "agrees (at most the 0.01-nat flat band higher)"
            else:
                outcome = "cannot tell (the paired difference's interval holds 0)"
            change = paired_change(variants[name], variants[baseline], length)
            evidence = (f"penalty at {length / trained:g}x {name} {mine.format(3, True)} vs {baseline} "
                        f"{theirs.format(3, True)} nats, difference paired by seed and window "
                        f"{difference.format(3, True)}" + (f"; perplexity ratio paired by seed {change.format(3)}x"
                                                          if change is not None and change.low is not None else ""))
        lines.append(f"  - {claim}: {evidence}; {outcome}.")
    if not lines:
        return []
    return ["- Claims of the newer encodings' papers, tested here (95% intervals):", *lines]


def verdict_word(ratio: Estimate) -> str:
    """'better' / 'worse' where the interval excludes 1 and leaves +-1% (the report's flat band, 0.01 nats);
    'the same within 1%' where the whole interval lies inside it; else 'within noise'."""
    if ratio.low is None or ratio.high is None:
        return "one seed, no interval"
    if ratio.low >= math.exp(-FLAT) and ratio.high <= math.exp(FLAT):
        return "the same within 1%"
    if ratio.high < 1:
        return "better"
    if ratio.low > 1:
        return "worse"
    return "within noise"


def probe_findings(variants: dict[str, Variant], offsets: list[int], trained: int) -> list[str]:
    if not offsets:
        return []
    invariant, moved = [], []
    for variant in variants.values():
        base = variant.probe_estimate(0)
        if base is None:
            continue
        changes = [variant.probe_estimate(offset) for offset in offsets[1:]]
        if any(change is None for change in changes):
            moved.append(f"{variant.label} (no number past its table)")
            continue
        largest = max(abs(change.mean / base.mean - 1) for change in changes)
        if largest < 1e-3:
            invariant.append(variant.label)
        else:
            shown = ", ".join(f"+{offset // trained}L: {change.mean:.1f}" for offset, change in zip(offsets[1:], changes))
            moved.append(f"{variant.label} ({base.mean:.1f} at offset 0; {shown})")
    lines = [f"- Position-shift probe (the same L-token windows with positions offset by "
             f"{', '.join(f'{o // trained}L' for o in offsets[1:])}): unchanged (< 0.1%) for "
             f"{', '.join(invariant) or 'none'}, as a relative encoding must be"]
    if moved:
        lines[-1] += "; changed for " + "; ".join(moved)
    lines[-1] += "."
    return lines
