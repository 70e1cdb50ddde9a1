"""The comparison's use axis: each trained text model's own use of its text past L (eval/use.py), on the same
weights the penalty is measured on.

    [compare]
    probes = ["use"]
    use_distances = ["0.5x", "2x", "4x", "8x", "max"]   # 0.5x: the positive control, within L
    use_windows = 64                                    # held-out windows per model at the longest length

Each model is probed in windows of L tokens as trained (the positive control: distances within L, every position
one it trained at; as many windows as hold the tokens of use_windows windows at the longest length, which costs one
pass at that length and leaves the control's interval no wider than the columns it vouches for) and at the
comparison's longest length, as trained and under each of compare.methods that
applies to it (the window control included): repeated passages at each distance against the control without the
first copies. Over seeds and windows: the mean use with the interval of experiments.seed_intervals.spread_interval, the verdict
of eval.stats.verdict ("uses" by a one-sided test, "none" by an equivalence test with compare.use_margin,
"negligible" where both hold, else "cannot tell"), and how far back use holds ("reads back to about N tokens": the farthest distance whose verdict is
"uses"). A variant whose positive control fails (no use at the distance within L) says nothing about use past L.
With compare.use_priming, a third forward per window (the first copies' tokens shuffled) splits each use past L into
presence and order: a use that is presence is priming, not reading.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from errors import ConfigError
from eval import figures
from eval.extrapolation import resolve_length
from eval.figures import colour
from eval.stats import Estimate, calibrated_verdicts, reach_of, spread, use_margin, verdict
from eval.use import default_span, measure_checkpoint
from experiments.compare.cells import cell
from experiments.compare.config import CompareConfig
from experiments.seed_intervals import spread_interval
from model.methods import NONE, applies, label
from model.transformer import Transformer

PER_DISTANCE = 4  # passages per distance in each window
NGRAM = 4  # the second view's n-grams
NEGATIVE_CONTROL = "window"  # attention limited to the last L keys


def probe_use(model: Transformer, ids: np.ndarray, trained: int, compare: CompareConfig,
              separator: int | None = None) -> dict[str, Any]:
    """The use probe of one trained model: in windows of L tokens as trained (the positive control, distances within
    L), and at the comparison's longest length as trained and under each method of compare.methods that applies to
    it and under the window control (every distance that fits). The per-window and per-passage numbers are the probe's
    cached rows; with `separator` (the token that ends a document) each result also counts, per distance, the
    passages whose two copies lie in different documents."""
    windows = probe_windows(compare, trained, len(ids))
    # the window control is always probed: the negative control (no use past its window)
    methods = [m for m in dict.fromkeys([*compare.methods, NEGATIVE_CONTROL])
               if applies(m, model.config.position, model.config.layer_encodings)]
    span = default_span(trained)
    found, errors = measure_checkpoint(model, ids, trained, sorted(windows), list(compare.use_distances), span,
                                       PER_DISTANCE, windows, 0, methods, None, NGRAM, separator,
                                       priming=compare.use_priming)
    return {"span": span, "per_distance": PER_DISTANCE, "errors": errors,
            "results": [{"method": r.method, "length": r.length, "distances": r.distances,
                         "passages": r.passages.tolist(), "reach": r.reach, "recurrence": r.recurrence,
                         **({} if r.apart is None else {"across_documents": r.apart.sum(axis=(0, 2)).tolist()}),
                         **({} if r.presence is None else {"presence": r.presence.tolist()})}
                        for r in found]}


def probe_windows(compare: CompareConfig, trained: int, tokens: int) -> dict[int, int]:
    """Windows per length: compare.use_windows at the longest length; in windows of L (the positive control, one
    passage per distance where a long window holds many) the tokens of those windows, as many as the `tokens` of
    held-out text hold."""
    longest = max(resolve_length(item, trained) for item in compare.lengths)
    many = compare.use_windows * (longest + 1) // (trained + 1)
    return {trained: max(compare.use_windows, min(many, tokens // (trained + 1))), longest: compare.use_windows}


def check_use_windows(compare: CompareConfig, trained: int, tokens: int) -> None:
    """Before any training: the use probe's longest windows must fit compare.use_windows times in the held-out text
    (`tokens`), or the probe would fail after every model is trained."""
    if "use" not in (*compare.probes, *compare.snapshot_probes):
        return
    longest = max(resolve_length(item, trained) for item in compare.lengths)
    fits = max(0, (tokens - 1) // (longest + 1))
    if fits < compare.use_windows:
        raise ConfigError(
            f"the use probe needs compare.use_windows = {compare.use_windows} windows of {longest + 1:,} tokens (the "
            f"longest length, {longest // trained}x of L = {trained}), and the held-out text ({tokens:,} tokens) holds "
            f"{fits}: lower compare.use_windows to {fits} or less, shorten compare.lengths, or hold out more text "
            "(compare.val_fraction)")


@dataclass
class UseSummary:
    """One variant's use over seeds and windows at each (window length, distance) it was probed at."""

    label: str
    distances: list[int]
    estimates: list[Estimate | None]
    verdicts: list[str]
    reach: int | None  # how far its attention sees (a window control), None: everything
    lengths: list[int] = field(default_factory=list)  # the window length of each column (empty: all the longest)
    # per column: (passages whose copies lie in different documents, passages) in one seed's windows; None: not counted
    across: list[tuple[int, int] | None] = field(default_factory=list)
    spreads: list = field(default_factory=list)  # per column: eval.stats.Spread (mean, se, df), what the tests read
    # the longest length's "max" distance, whose first copies lie at the window's start in every window: shown, not
    # counted in how far back (None: no such column)
    pinned: int | None = None
    # per column, with the priming control (compare.use_priming): presence and order over seeds and windows
    presence: list = field(default_factory=list)
    order: list = field(default_factory=list)

    def longest_columns(self) -> list[int]:
        """The columns measured at the longest length."""
        if not self.lengths:
            return list(range(len(self.distances)))
        return [i for i, n in enumerate(self.lengths) if n == max(self.lengths)]

    def reads_back(self) -> int | None:
        """The largest distance at the longest length at which it and every nearer one read 'uses' (None: not even
        the nearest)."""
        columns = [i for i in self.longest_columns() if self.distances[i] != self.pinned]
        return reach_of([self.distances[i] for i in columns], [self.verdicts[i] for i in columns])

    def at(self, distance: int) -> tuple[Estimate | None, str] | None:
        """(estimate, verdict) at `distance` at the longest length."""
        for i in self.longest_columns():
            if self.distances[i] == distance:
                return self.estimates[i], self.verdicts[i]
        return None


def summarise_use(found: dict[str, dict[int, dict]], margin: float, pinned: bool = False) -> dict[str, UseSummary]:
    """encoding -> seed -> probe rows  =>  variant label -> its summary over seeds and windows. A method's variant
    takes its encoding's windows of at most L (measured as trained) as its own: its positive control. `pinned`: the
    distances hold "max", whose column (the longest distance at the longest length) is not counted in the reach."""
    summaries: dict[str, UseSummary] = {}
    for encoding, by_seed in found.items():
        entries: dict[tuple[str, int], list[dict]] = {}
        for rows in by_seed.values():
            for entry in rows.get("results", []):
                entries.setdefault((entry["method"], entry["length"]), []).append(entry)
        if not entries:
            continue
        longest = max(length for _, length in entries)
        short = [key for key in entries if key[1] < longest and key[0] == NONE]
        for method in dict.fromkeys(m for m, length in entries if length == longest):
            columns: list[tuple[int, int, np.ndarray]] = []  # (length, distance, (seeds, windows or passages))
            across: list[tuple[int, int] | None] = []
            primed: list[tuple[Estimate, Estimate] | None] = []  # per column: (presence, order)
            for key in [*short, (method, longest)]:
                per_seed = entries[key]
                distances = per_seed[0]["distances"]
                if any(entry["distances"] != distances for entry in per_seed):
                    continue  # probed with other settings: not comparable
                passages = np.stack([np.asarray(entry["passages"]) for entry in per_seed])  # (seeds, w, d, k)
                counts = per_seed[0].get("across_documents")  # the same windows in every seed and method
                presence = np.stack([np.asarray(entry["presence"]) for entry in per_seed]) \
                    if all("presence" in entry for entry in per_seed) else None
                for i, distance in enumerate(distances):
                    columns.append((key[1], distance, unit_values(passages[:, :, i, :])))
                    across.append(None if counts is None else (counts[i], passages[0, :, i, :].size))
                    primed.append(None if presence is None else (
                        spread_interval(unit_values(presence[:, :, i, :])),
                        spread_interval(unit_values(passages[:, :, i, :] - presence[:, :, i, :]))))
            summaries[label(encoding, method)] = UseSummary(
                label(encoding, method), [d for _, d, _ in columns],
                [spread_interval(m) for _, _, m in columns],
                [verdict(spread(m), margin) for _, _, m in columns],
                entries[(method, longest)][0]["reach"], [n for n, _, _ in columns], across,
                [spread(m) for _, _, m in columns], presence=[None if p is None else p[0] for p in primed],
                order=[None if p is None else p[1] for p in primed])
    if pinned:
        for summary in summaries.values():
            summary.pinned = max(summary.distances[i] for i in summary.longest_columns())
    calibrate_summaries(summaries, margin)
    return summaries


def calibrate_summaries(summaries: dict[str, UseSummary], floor: float) -> None:
    """The comparison's use cells as one family (eval.stats.calibrated_verdicts): the columns past the positive
    control (windows longer than the shortest) of every variant Holm-corrected together, each against its variant's
    margin, a tenth of its positive control's use (at least `floor`); the positive control keeps its own test."""
    family, margins = [], []
    for summary in summaries.values():
        lengths = summary.lengths or [0] * len(summary.distances)
        shortest = min(lengths)
        positive = [e.mean for e, n in zip(summary.estimates, lengths) if e is not None and n == shortest < max(lengths)]
        margin = use_margin(sum(positive) / len(positive) if positive else None, floor)
        for index, length in enumerate(lengths):
            if length > shortest or shortest == max(lengths):
                family.append((summary, index))
                margins.append(margin)
    words = calibrated_verdicts([summary.spreads[index] if summary.spreads else None for summary, index in family],
                                margins)
    for (summary, index), word in zip(family, words):
        summary.verdicts[index] = word


def unit_values(passages: np.ndarray) -> np.ndarray:
    """(seeds, windows, passages) -> (seeds, windows): each window's mean over its passages (the passages of one
    window are not independent draws; eval/use.py's rule)."""
    return passages.mean(axis=2)


def reads_back_words(summary: UseSummary, trained: int) -> str:
    farthest = summary.reads_back()
    if farthest is None:
        return "no use shown"
    estimate = summary.at(farthest)[0]
    size = f"; use there {estimate.mean:+.3f} nats" if estimate is not None else ""
    return f"reads back to about {farthest:,} tokens ({farthest / trained:.3g}L{size})"


def positive_control(summary: UseSummary, trained: int) -> bool | None:
    """Whether use is shown at some distance within L in windows of at most L (None: no such column)."""
    lengths = summary.lengths or [trained + 1] * len(summary.distances)
    within = [v for d, n, v in zip(summary.distances, lengths, summary.verdicts) if d < trained and n <= trained]
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


def use_section(summaries: dict[str, UseSummary], trained: int, length: int, margin: float,
                layers: int = 1) -> list[str]:
    """The report's table of use by window length and distance, with the self-checks."""
    if not summaries:
        return []
    widest = max(summaries.values(), key=lambda s: len(s.distances))
    columns = list(zip(widest.lengths or [length] * len(widest.distances), widest.distances))
    lines = ["### Use of the text past L, on the same weights", "",
             "Repeated passages in held-out windows (eval/use.py): each second copy d tokens after its first, against "
             "the same window with other text in place of the first copies; use = the control's NLL minus the "
             "probe's on the second copies (tokens 2..S), nats, mean [95% t over seeds and windows]. Verdicts "
             "calibrated: the cells past the positive control are one family; 'uses' needs the one-sided t test over "
             "seeds and windows, Holm-corrected over the family, and a mean of at least the variant's margin (a "
             f"tenth of its positive control's use, at least {margin:g} nats); 'negligible': shown above 0 but below "
             "it; 'none': the interval within +-margin; else 'cannot tell'. How far back: the largest distance at "
             "which it and every nearer one read 'uses'. The longest distance's first copies lie at the window's "
             "start in every window: where the distances hold \"max\" that column is shown and not counted in how "
             "far back. "
             f"Windows of L = {trained} tokens (the model as trained, every position one it trained at) give the "
             f"positive control; windows of {length:,} tokens give use past L, as trained and under each method.", "",
             "| variant | " + " | ".join(f"d = {d:,} ({d / trained:.3g}L) in {n:,}" for n, d in columns)
             + " | how far back |", "|---|" + "---:|" * len(columns) + "---|"]
    for name, summary in summaries.items():
        found = dict(zip(zip(summary.lengths or [length] * len(summary.distances), summary.distances),
                         zip(summary.estimates, summary.verdicts)))
        cells = [f"{cell(found[c][0], 3, signed=True)} {found[c][1]}" if c in found else "n/a" for c in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {reads_back_words(summary, trained)} |")
    checks = [] if not any(widest.across) else [
        "Copies in different documents (a document's end between them; the same windows for every variant): "
        + ", ".join(f"d = {d:,} in {n:,}: {c[0]} of {c[1]}" for (n, d), c in zip(columns, widest.across) if c)
        + ". Use across a document's end is reading the previous document, which a model trained on packed "
          "documents does less (docs/evaluation.md)."]
    failed = [n for n, s in summaries.items() if positive_control(s, trained) is False]
    passed = [n for n, s in summaries.items() if positive_control(s, trained)]
    checks.append(f"Positive control (use within L in windows of L): passes for {', '.join(passed) or 'no variant'}"
                  + (f"; FAILS for {', '.join(failed)}: within L their copying is not shown above the margin "
                     f"({margin:g} nats), so their columns past L cannot show use" if failed else "") + ".")
    for name, summary in summaries.items():
        if summary.reach is not None:  # its layers can relay layers x (window - 1) tokens back
            relay = layers * (summary.reach - 1)
            beyond = [(summary.distances[i], summary.verdicts[i]) for i in summary.longest_columns()
                      if summary.distances[i] > relay]
            checks.append(f"Negative control ({name}, attention limited to {summary.reach} keys, which its {layers} "
                          f"layers can relay about {relay:,} tokens back): past that, "
                          + (", ".join(f"d = {d:,} {v}" for d, v in beyond) or "no distance measured")
                          + f" ({negative_word(v for _, v in beyond)}).")
    return lines + [""] + [f"- {c}" for c in checks] + [""] + priming_table(summaries, trained, length)


def priming_table(summaries: dict[str, UseSummary], trained: int, length: int) -> list[str]:
    """Use beside presence and order (compare.use_priming) in every column: the positive control's (windows of L)
    and every distance at the longest length."""
    rows = []
    for name, summary in summaries.items():
        lengths = summary.lengths or [length] * len(summary.distances)
        for i, window in enumerate(lengths):
            if i < len(summary.presence) and summary.presence[i] is not None:
                rows.append(f"| {name} | {summary.distances[i]:,} ({summary.distances[i] / trained:.3g}L) in {window:,} | "
                            f"{cell(summary.estimates[i], 3, signed=True)} {summary.verdicts[i]} | "
                            f"{cell(summary.presence[i], 3, signed=True)} | {cell(summary.order[i], 3, signed=True)} |")
    if not rows:
        return []
    return ["In order or merely present (the priming control: each first copy holds its passage's tokens shuffled; "
            "presence = NLL(control) - NLL(shuffled), order = NLL(shuffled) - NLL(probe) = use - presence; mean "
            "[95% t over seeds and windows]). A use that is presence is priming, not reading; within L (windows of L) "
            "it says how much of the positive control is copying in order.",
            "", "| variant | distance | use | presence | order |", "|---|---:|---:|---:|---:|", *rows, ""]


def budget_columns(summary: UseSummary, trained: int, multiples: tuple[int, ...]) -> list[tuple[str, int]]:
    """The columns of use against the tokens trained: the positive control's farthest distance within L (windows of
    L), then each multiple of L back at the longest length: (title, column index); a distance not probed is left
    out."""
    lengths = summary.lengths or [0] * len(summary.distances)
    shortest, longest = min(lengths), max(lengths)
    within = [i for i, n in enumerate(lengths) if n == shortest < longest and summary.distances[i] < trained]
    columns = [] if not within else [("within L", max(within, key=lambda i: summary.distances[i]))]
    for multiple in multiples:
        found = [i for i, n in enumerate(lengths) if n == longest and summary.distances[i] == multiple * trained]
        columns += [(f"{multiple}L back", found[0])] if found else []
    return columns


BUDGET_MULTIPLES = (2, 4, 8)  # the distances, in multiples of L, of use against the tokens trained


def budget_section(by_step: dict[int, dict[str, UseSummary]], tokens_per_step: int, trained: int,
                   penalties: dict[str, dict[int, Estimate]], longest: int) -> list[str]:
    """Use against the tokens trained: each variant's use within L and at 2L, 4L and 8L back, for every model kept
    during training (compare.snapshot_probes) and the final one, with verdicts as in the use table (each model's
    cells one family), beside its penalty at the longest length (`penalties`: label -> step -> estimate, where the
    kept models were scored)."""
    if len(by_step) < 2:
        return []
    labels = list(dict.fromkeys(name for summaries in by_step.values() for name in summaries))
    titles = ["within L", *(f"{m}L back" for m in BUDGET_MULTIPLES)]
    multiple = f"{longest // trained}x"
    primed = any(any(p is not None for p in summary.presence) for summaries in by_step.values()
                 for summary in summaries.values())
    lines = ["### Use against the tokens trained", "",
             "The use probe above on every model kept during training (compare.snapshots) and on the final one, on "
             "the same held-out windows: use within L (the positive control, its farthest distance within L) and "
             "2L, 4L and 8L back at the longest length, nats, mean [95% t over seeds and windows], with the "
             "calibrated verdict (Holm over each model's cells, margin a tenth of its own use within L); beside "
             f"them the same model's {multiple} penalty (nats over its L-window reference, 95% t over seeds and "
             "windows; n/a: a window control, or a variant compare.snapshot_methods leaves out).", "",
             *(["Order within L: the part of the within-L use that reading the copy in order adds over its shuffled "
                "tokens (the priming control), the same windows.", ""] if primed else []),
             "| variant | tokens trained | " + " | ".join(titles) + (" | order within L" if primed else "")
             + f" | {multiple} penalty |", "|---|---:|" + "---:|" * (len(titles) + 1 + primed)]
    for name in labels:
        for step in sorted(by_step):
            summary = by_step[step].get(name)
            if summary is None:
                continue
            found = dict(budget_columns(summary, trained, BUDGET_MULTIPLES))
            cells = [f"{cell(summary.estimates[found[t]], 3, signed=True)} {summary.verdicts[found[t]]}"
                     if t in found else "n/a" for t in titles]
            if primed:
                index = found.get("within L")
                order = summary.order[index] if index is not None and index < len(summary.order) else None
                cells.append("n/a" if order is None else cell(order, 3, signed=True))
            penalty = penalties.get(name, {}).get(step)
            cells.append("n/a" if penalty is None else cell(penalty, 3, signed=True))
            lines.append(f"| {name} | {step * tokens_per_step:,} | " + " | ".join(cells) + " |")
    return lines + ["", "![use against the tokens trained](use_budget.png)", ""]


def plot_use_budget(by_step: dict[int, dict[str, UseSummary]], tokens_per_step: int, trained: int,
                    path: Path) -> None:
    """use_budget.png: use within L, 2L and 4L back against the tokens trained, a line per variant (not the window
    controls), bars the 95% t interval over seeds and windows; with the priming control, a panel of order within L
    (what reading the copy in order adds over its shuffled tokens) beside use within L."""
    primed = any(any(p is not None for p in summary.presence) for summaries in by_step.values()
                 for summary in summaries.values())
    titles = ["within L", *(["order within L"] if primed else []), "2L back", "4L back"]
    figure, axes = figures.new(len(titles), width=5 * len(titles), height=4.2)
    # the window controls stay in the table (a negative control), not in the figure
    labels = list(dict.fromkeys(name for summaries in by_step.values() for name in summaries
                                if not name.endswith(f"+{NEGATIVE_CONTROL}")))
    for axis, title in zip(axes, titles):
        for name in labels:
            points = []
            for step in sorted(by_step):
                summary = by_step[step].get(name)
                found = dict(budget_columns(summary, trained, BUDGET_MULTIPLES)) if summary else {}
                if title == "order within L":
                    index = found.get("within L")
                    estimate = summary.order[index] if index is not None and index < len(summary.order) else None
                else:
                    estimate = summary.estimates[found[title]] if title in found else None
                if estimate is not None:
                    points.append((step * tokens_per_step / 1e6, estimate))
            if points:
                xs = [x for x, _ in points]
                means = [e.mean for _, e in points]
                below = [e.mean - (e.low if e.has_interval else e.mean) for _, e in points]
                above = [(e.high if e.has_interval else e.mean) - e.mean for _, e in points]
                encoding = name.split("+")[0]
                axis.errorbar(xs, means, yerr=[below, above], marker=figures.marker(encoding), markersize=4,
                              capsize=3, color=colour(encoding), linestyle=figures.method_style(
                                  name.split("+", 1)[1] if "+" in name else NONE), linewidth=1.2, label=name)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xscale("log")
        axis.set_title(f"{title} (L = {trained})" if title.startswith("order") else f"use {title} (L = {trained})",
                       fontsize=10)
        axis.set_xlabel("training tokens (millions)")
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("use (nats, 95% t over seeds and windows)")
    figure.suptitle("Use of a repeated passage against the tokens trained (models kept during training)")
    figures.save(figure, path, axes[0], below=True)
