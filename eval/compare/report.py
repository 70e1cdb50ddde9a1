"""The comparison's report: numbers over seeds with intervals, findings stated only where intervals separate.

Cells (variant x length) come from the cached per-token evaluations (eval/extrapolation.py):
  perplexity         mean over seeds, Student's t 95% interval over seeds
  ratio to own 1x    per-seed ratio, t interval (secondary: it mixes context gain, the early-token curse and
                     positions beyond L)
  penalty            tokens at positions >= L: loss in the k*L window minus loss in the L-window reference, nats;
                     95% Student's t interval over seeds on a standard error that adds the between-seed and the
                     between-window variance (eval.stats.seeds_and_windows); none with one seed
  probe              L-windows with positions offset by 0, L, 3L, 15L: perplexity, t interval over seeds
An ordering or a paper's claim is stated only where the 95% intervals do not overlap; otherwise "within noise".
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from data.batches import read_meta
from eval.compare.cells import cell, estimate_dict, table
from eval.compare.layout import eval_path
from eval.compare.plots import write_figures
from eval.compare.probes import report_sections
from eval.compare.results import ComparisonResults, Snapshots, Variant
from eval.extrapolation import CheckpointEvaluation
from eval.inference_methods import NONE, label, method_spec
from eval.stats import Estimate, separated, t_interval
from model.encodings import POSITION_ENCODINGS
from model.transformer import Transformer
from train.loop import position_group_settings

PAPER = "the ALiBi paper (Press et al. 2022; WikiText-103, 247M parameters, L = 512)"


def order_statement(variants: dict[str, Variant], length: int, multiple: float) -> str | None:
    """Best to worst at one length; '<' where the 95% intervals separate, '≈' (within noise) where they overlap."""
    estimates = sorted(((v.ppl(length), name) for name, v in variants.items() if v.ppl(length)), key=lambda p: p[0].mean)
    if not estimates:
        return None
    parts = [f"{estimates[0][1]} ({estimates[0][0].mean:.1f})"]
    for (previous, _), (current, name) in zip(estimates, estimates[1:]):
        parts.append(("< " if separated(previous, current) else "≈ ") + f"{name} ({current.mean:.1f})")
    return f"Perplexity at {multiple:g}x, best to worst: " + " ".join(parts) + "."


def separated_pairs(variants: dict[str, Variant], length: int) -> str | None:
    """Every pair whose perplexity intervals separate, not only neighbours in the order (overlap is not transitive:
    a chain of '≈' can join two variants whose intervals separate). None when fewer than two have an interval."""
    estimates = [(v.ppl(length), name) for name, v in variants.items()]
    estimates = sorted(((e, name) for e, name in estimates if e and e.has_interval), key=lambda p: p[0].mean)
    if len(estimates) < 2:
        return None
    pairs = []
    for index, (better, name) in enumerate(estimates):
        worse = [other for estimate, other in estimates[index + 1:] if separated(better, estimate)]
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
    the intervals separate in the paper's direction, 'reversed' where they separate the other way, else 'within
    noise'."""
    present = [name for name in PAPER_ORDER if name in variants and variants[name].penalty_estimate(longest)]
    if len(present) < 2:
        return None
    parts = []
    for worse, better in zip(present, present[1:]):
        a, b = variants[worse].penalty_estimate(longest), variants[better].penalty_estimate(longest)
        word = ("agrees" if a.low > b.high else "reversed" if b.low > a.high else "within noise") \
            if a.has_interval and b.has_interval else "undetermined (no interval)"
        parts.append(f"{worse} ({a.mean:+.3f}) > {better} ({b.mean:+.3f}): {word}")
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
                lines.append(f"  Pairs whose intervals separate at {length / trained:g}x (better < worse): {pairs}.")
    lines.append("  ('<': the 95% intervals over seeds separate; '≈': they overlap, so the order is within noise; "
                 "overlap is not transitive, hence the pairs.)")
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
                f"({'within' if abs(ratio - 1) <= 0.10 else 'not within'} 10%; intervals "
                f"{'overlap' if not separated(sinusoidal.ppl(first), rope.ppl(first)) else 'separate'})")
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
        change = "within noise" if not separated(first, last) else ("rises" if last.mean > first.mean else "falls")
        moves.append(f"{name} {first.mean:+.3f} -> {last.mean:+.3f} ({change})")
    if not moves:
        return []
    return [f"- Penalty at {longest_multiple:g}x from the model kept at {rows[0][0]:g} of the {budget:,}-token budget "
            "to the final one: " + "; ".join(moves) + "."]


def paired_change(variant: Variant, baseline: Variant, length: int) -> Estimate | None:
    """Perplexity ratio variant / baseline at `length`, paired by seed (the same trained model under two methods),
    with a t interval over seeds."""
    here, there = variant.nll.get(length, {}), baseline.nll.get(length, {})
    return t_interval([math.exp(here[s] - there[s]) for s in here if s in there])


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
    ("dape", "alibi", "1x", "not higher", "DAPE's perplexity is at or below that of ALiBi, its base (Zheng et al. "
     "2024)"),
    ("dape", "alibi", "longest", "not higher", "DAPE extrapolates at least as well as ALiBi, its base (Zheng et al. "
     "2024)"),
    ("rope-randomized", "rope", "longest", "lower", "randomized positions lower RoPE's extrapolation penalty (Ruoss "
     "et al. 2023)"),
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
            if mine is None or theirs is None or mine.low is None or theirs.low is None:
                continue
            if separated(mine, theirs) and mine.mean < theirs.mean:
                outcome = "agrees"
            elif separated(mine, theirs) and not (expected == "not higher" and mine.mean - theirs.mean <= FLAT):
                outcome = "disagrees (the penalty intervals separate the other way)"
            elif separated(mine, theirs):
                outcome = "agrees (higher by less than the 0.01-nat flat band)"
            else:
                outcome = "cannot tell (the penalty intervals overlap)"
            change = paired_change(variants[name], variants[baseline], length)
            evidence = (f"penalty at {length / trained:g}x {name} {mine.format(3, True)} vs {baseline} "
                        f"{theirs.format(3, True)} nats" + (f"; perplexity ratio paired by seed {change.format(3)}x"
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


def wall_time_line(results: ComparisonResults) -> str:
    """This invocation's wall time, and the total over every invocation recorded in OUT/invocations.jsonl."""
    path = results.out / "invocations.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    line = (f"This invocation: {results.invocation.wall_s / 60:.1f} min wall on this machine "
            f"({results.invocation.machine})")
    if len(records) > 1:
        trained = [r for r in records if set(r.get("jobs", {})) != {"skipped"}]
        idle = [r for r in records if r not in trained]
        line += (f"; all {len(records)} invocations on record (OUT/invocations.jsonl), whatever each trained or "
                 f"reused: {sum(r['wall_s'] for r in records) / 60:.1f} min wall")
        if trained and idle:
            line += (f", of which {sum(r['wall_s'] for r in trained) / 60:.1f} min in the {len(trained)} that "
                     f"trained and {sum(r['wall_s'] for r in idle) / 60:.1f} min in the {len(idle)} that trained "
                     "nothing (they evaluated what was missing, or re-rendered the report from the cache)")
    return line


def tables_markdown(results: ComparisonResults) -> str:
    """table.md: perplexity, penalty and the ratio to each variant's own 1x, with what the intervals are."""
    variants, lengths, trained = results.variants, results.lengths, results.trained
    titles = [f"{length / trained:g}x" for length in lengths]
    ppl_lines = table(variants, lengths, titles, lambda v, n: cell(v.ppl(n)))
    penalty_lines = table(variants, results.penalty_lengths, [f"{n / trained:g}x" for n in results.penalty_lengths],
                          lambda v, n: cell(v.penalty_estimate(n), 3, signed=True))
    ratio_lines = table(variants, lengths, titles, lambda v, n: cell(v.ratio(n, lengths[0])))
    interval_note = (f"Each cell: mean over {len(results.compare.seeds)} seed(s) [95% interval]. Perplexity and "
                     "ratios: Student's t interval over seeds. Penalty: Student's t interval over seeds on a standard "
                     "error that adds the between-seed and the between-window variance (the same windows in every "
                     "seed). With one seed there is no interval: one training run says nothing about the next "
                     "(RoPE's penalty at 16x was +0.72 and +1.01 nats for two trainings of one seed that differed "
                     "only in compiling; docs/results.md).")
    return "\n".join([
        "### Perplexity (nonoverlapping windows)", "", *ppl_lines, "",
        "### Extrapolation penalty (nats): positions >= L, window loss minus L-window reference loss", "",
        *penalty_lines, "",
        "### Perplexity relative to the same variant at 1x (secondary)", "", *ratio_lines, "",
        interval_note, ""])


def probe_table(results: ComparisonResults) -> list[str]:
    """The position-shift probe: perplexity of the L-windows at each offset, for the variants that have it."""
    offsets = results.probe_offsets
    return table(results.probe_variants, offsets, [f"offset {o // results.trained}L" for o in offsets],
                 lambda v, o: cell(v.probe_estimate(o)))


def results_record(results: ComparisonResults) -> dict:
    """results.json: the settings, every job's status, the training summaries and every number of the report."""
    compare, lengths, trained = results.compare, results.lengths, results.trained
    cells = []
    for name, variant in results.variants.items():
        for length in lengths:
            cells.append({"label": name, "encoding": variant.encoding, "method": variant.method, "length": length,
                          "multiple": length / trained,
                          "ppl_per_seed": {str(s): math.exp(v) for s, v in variant.nll.get(length, {}).items()},
                          "ppl": estimate_dict(variant.ppl(length)),
                          "ratio": estimate_dict(variant.ratio(length, lengths[0])),
                          "penalty": estimate_dict(variant.penalty_estimate(length)),
                          "error": variant.errors.get(length)})
    probes = [{"label": name, "offset": offset, "ppl": estimate_dict(v.probe_estimate(offset))}
              for name, v in results.probe_variants.items() for offset in results.probe_offsets]
    snapshot_rows = [{"label": encoding, "fraction": fraction, "penalty": estimate_dict(penalty),
                      "ppl_1x": estimate_dict(short), "ppl_longest": estimate_dict(long)}
                     for encoding, rows in results.snapshots.items() for fraction, penalty, short, long in rows]
    invocation = results.invocation
    return {
        "settings": {"compare": {k: getattr(compare, k) for k in compare.__dataclass_fields__},
                     "shared": results.shared, "trained_length": trained, "lengths": lengths,
                     "wall_s": invocation.wall_s, "workers": invocation.workers, "threads": invocation.threads,
                     "tokens_per_step": results.tokens_per_step, "max_steps": results.max_steps,
                     "machine": invocation.machine,
                     "runtime": vars(results.configs[(compare.encodings[0], compare.seeds[0])].runtime),
                     "parameters": results.parameters},
        "status": dict(results.statuses),
        "training": {e: {str(s): t for s, t in by_seed.items()} for e, by_seed in results.training.items()},
        "attention_paths": attention_paths(results),
        "cells": cells, "probe": probes, "snapshots": snapshot_rows}


def attention_paths(results: ComparisonResults) -> dict[str, dict]:
    """encoding -> the attention path of its first seed's layers in training and at each evaluation length as
    trained (model/attention_path.py), from its trainer state and its cached evaluation."""
    found = {}
    seed = results.compare.seeds[0]
    for encoding in results.compare.encodings:
        summary = results.training.get(encoding, {}).get(seed) or {}
        path = eval_path(results.out, encoding, seed)
        evaluated = CheckpointEvaluation.load(path).paths if path.exists() else {}
        found[encoding] = {"training": summary.get("attention_paths"),
                           "evaluation": {key: paths for key, paths in evaluated.items()
                                          if key.startswith(f"{NONE}@")}}
    return found


def write_outputs(results: ComparisonResults) -> None:
    """table.md, the figures, report.md and results.json in OUT, from whatever finished (failed jobs are listed)."""
    out = results.out
    (out / "table.md").write_text(tables_markdown(results))
    write_figures(results)
    (out / "report.md").write_text(report_markdown(results))
    (out / "results.json").write_text(json.dumps(results_record(results), indent=1) + "\n")


def report_markdown(results: ComparisonResults) -> str:
    """report.md: how it was run, the setup, the tables and figures, the probe and task sections, the findings."""
    compare, configs, training, variants = results.compare, results.configs, results.training, results.variants
    lengths, trained, invocation = results.lengths, results.trained, results.invocation
    max_steps, tokens_per_step, snapshots = results.max_steps, results.tokens_per_step, results.snapshots
    meta = read_meta(results.data_dir)
    train = results.shared.get("train", {})
    model = {key: value for key, value in results.shared.get("model", {}).items() if key != "position_args"}
    params = results.parameters
    longest = results.longest
    methods = [m for m in compare.methods if m != NONE]
    train_minutes = sum(s["wall_s"] for by_seed in training.values() for s in by_seed.values() if s) / 60
    eval_minutes = sum(CheckpointEvaluation.load(path).seconds for path in Path(compare.out, "evals").rglob("*.npz")
                       if not path.name.endswith(".tmp.npz")) / 60
    lines = [
        f"# Position-encoding extrapolation ({invocation.preset} preset)", "",
        f"Reproduce: `{invocation.command}`. {wall_time_line(results)}, {invocation.workers} worker "
        f"process(es) x {invocation.threads} thread(s). Process time summed over all jobs, whenever they ran: "
        f"training {train_minutes:.1f} min, evaluation {eval_minutes:.1f} min. Re-running skips what is done.", "",
        "## Setup", "",
        f"- Data: `{compare.source}`: {meta['train_documents']} training documents ({meta['train_tokens']:,} tokens), "
        f"{meta['val_documents']} held-out documents ({meta['val_tokens']:,} tokens; "
        f"{meta.get('split', 'document hash')}) never trained on; byte-level BPE with {meta['vocab_size']} tokens."
        + (f" Held out: {', '.join(meta['val_names'][:12])}." if meta.get("val_names") else ""),
        f"- Every variant: {json.dumps(model)}; training {json.dumps(train)}; "
        f"{max_steps * tokens_per_step:,} training tokens each; only `model.position` differs"
        + ("" if not (own := {name: settings for name in compare.encodings
                              if len(settings := compare.model_settings(name, results.shared.get("model"))) > 1}) else
           " (and the settings listed here: " + "; ".join(f"{name}: {json.dumps(settings)}"
                                                          for name, settings in own.items()) + ")") + ". "
        f"Seeds {compare.seeds}: each seed sets the initialisation and the data order, shared by all encodings.",
        f"- Evaluation: {compare.eval_tokens:,} held-out tokens requested per cell, in segments of "
        f"{longest:,} tokens spread evenly over all held-out documents; every length "
        f"({', '.join(compare.lengths)} of L = {trained}) scores the same tokens with nonoverlapping windows. "
        f"The L-window reference scores them again with windows of L tokens advancing by "
        f"{compare.reference_stride or max(1, trained // 8)} (context between 7/8 L and L, all positions < L). "
        f"Inference-time methods: {', '.join(f'{m} ({method_spec(m).summary})' for m in methods) or 'none'}.",
        "",
        "| encoding | parameters | position parameters: lr scale, weight decay | training tokens | wall time per run "
        "| tokens/s | val loss (step 0 -> end) | status |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    for encoding in compare.encodings:
        summaries = [s for s in training[encoding].values() if s]
        statuses = sorted({results.statuses.get(f"{encoding}-seed{seed}", {}).get("status", "not run")
                           for seed in compare.seeds})
        config = configs[(encoding, compare.seeds[0])]
        model_ = Transformer(config.model)
        optimiser = "none (no parameters)"
        learned = [e for e in model_.position_encodings() if any(True for _ in e.parameters())]
        if learned:
            settings = position_group_settings(model_, config, learned[0])
            optimiser = f"x{settings['lr_scale']:g}, {settings['weight_decay']:g}"
        if summaries:
            speed = [s["tok_per_s"] for s in summaries if s["tok_per_s"]]
            val = t_interval([s["val_loss"] for s in summaries])
            initial = statistics.fmean(s["initial_val_loss"] for s in summaries)
            lines.append(f"| {encoding} | {params[encoding]:,} | {optimiser} | {summaries[0]['tokens']:,} | "
                         f"{statistics.fmean(s['wall_s'] for s in summaries):.0f} s | "
                         f"{statistics.fmean(speed):,.0f} | {initial:.3f} -> {cell(val, 3)} | {'; '.join(statuses)} |")
        else:
            lines.append(f"| {encoding} | {params[encoding]:,} | {optimiser} | | | | | {'; '.join(statuses)} |")
    probe_lines = probe_table(results)
    lines += ["", "## Results", "", tables_markdown(results), "![perplexity vs length](plot.png)", "",
              "### The extrapolation penalty", "",
              "Nonoverlapping windows of k*L mix three effects: (k-1)/k of their tokens lie beyond L, those tokens "
              "also have more context, and the first tokens of every window have little (the early-token curse). "
              "The penalty isolates the first two for tokens at positions >= L by comparing each with its own loss "
              "under an L-token sliding window: > 0 means the model loses more from the unseen positions than it "
              "gains from the extra context.", "", "![penalty vs length](penalty.png)", "",
              "![penalty by position](position_loss.png)", ""]
    if probe_lines and len(probe_lines) > 2:
        lines += ["### Position-shift probe", "",
                  "The L-token windows of the 1x cell, scored with all positions offset; the context is unchanged, so "
                  "a relative encoding gives identical numbers and an absolute one shows how it treats positions it "
                  "never saw (perplexity, mean [95% t interval] over seeds).", "", *probe_lines, ""]
    if snapshots:
        lines += ["### Extrapolation against training tokens", "",
                  f"Models kept at fractions of the {max_steps}-step schedule (the learning rate was still high at "
                  "the earlier ones), evaluated like the final ones.", "",
                  "| variant | training tokens | ppl at 1x | ppl at longest | penalty at longest (nats) |",
                  "|---|---:|---:|---:|---:|"]
        for encoding, rows in snapshots.items():
            for fraction, penalty, short, long in rows:
                lines.append(f"| {encoding} | {fraction * max_steps * tokens_per_step:,.0f} ({fraction:g}) | "
                             f"{cell(short)} | {cell(long)} | {cell(penalty, 3, signed=True)} |")
        lines += ["", "![penalty against training tokens](snapshots.png)", ""]
    lines += report_sections(results)
    lines += ["## Training curves", "", "![training curves](train_curves.png)", "", "## What this shows", ""]
    lines += findings(variants, lengths, trained, results.probe_offsets)
    lines += snapshot_findings(snapshots, max_steps * tokens_per_step, longest / trained)
    lines += ["", "The paper's setting differs (word-level WikiText-103, 247M parameters, L = 512); these are small "
              "models trained for minutes, so sizes of effects do not transfer, and statements above hold only "
              "within the stated intervals."]
    return "\n".join(lines) + "\n"
