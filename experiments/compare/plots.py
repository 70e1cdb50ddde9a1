"""The comparison's figures: perplexity and penalty against length, the penalty by position, training curves and
snapshots.

A comparison with inference-time methods has many rows (the newer preset: 84), too many lines for one axis. Its
length and position figures are then small multiples on shared axes: the first panel holds every encoding as
trained, and each encoding that has methods gets a panel of its own with the model as trained beside each method.
A comparison without methods keeps one panel.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Callable

import numpy as np

from eval import figures
from eval.figures import colour
from eval.stats import Estimate
from experiments.compare.results import ComparisonResults, Snapshots, Variant
from model.methods import NONE

COLUMNS = 4  # panels per row of small multiples
AS_TRAINED = "every encoding as trained"


def panel_groups(variants: dict[str, Variant]) -> list[tuple[str, dict[str, Variant]]]:
    """[(panel title, {label: variant})]: one untitled panel when no variant has a method; else every encoding as
    trained first, then one panel per encoding that has methods (as trained, then its methods in order)."""
    plain = {name: v for name, v in variants.items() if v.method == NONE}
    encodings = list(dict.fromkeys(v.encoding for v in variants.values()))
    with_methods = [e for e in encodings if any(v.encoding == e and v.method != NONE for v in variants.values())]
    if not with_methods:
        return [("", dict(variants))]
    groups = [(AS_TRAINED, plain)] if plain else []
    for encoding in with_methods:
        members = {name: v for name, v in variants.items() if v.encoding == encoding}
        ordered = {name: v for name, v in members.items() if v.method == NONE}
        ordered.update({name: v for name, v in members.items() if v.method != NONE})
        groups.append((f"{encoding} under each method", ordered))
    return groups


def _by_method(groups: list[tuple[str, dict[str, Variant]]], title: str) -> bool:
    """Whether the panel `title` of `groups` holds one encoding under its methods (coloured by method)."""
    return len(groups) > 1 and title != AS_TRAINED


def _style(variant: Variant, by_method: bool) -> dict[str, Any]:
    """A line's colour, marker and style: the encoding's colour, or in a panel of one encoding's methods the
    method's colour (black as trained), so that the methods stand apart and match across panels."""
    style = figures.style(variant.encoding, variant.method)
    if by_method:
        style["color"] = figures.method_colour(variant.method)
    return style


def panels(count: int) -> tuple[Any, list[Any]]:
    """A figure with `count` axes sharing x and y (a grid of COLUMNS when more than one), and the list of them."""
    if count == 1:
        figure, axis = figures.new()
        return figure, [axis]
    columns = min(COLUMNS, count)
    rows = math.ceil(count / columns)
    figure, grid = figures.grid(rows, columns, panel_width=4.4, panel_height=3.3)
    axes = list(np.ravel(grid))
    for spare in axes[count:]:
        spare.set_visible(False)
    return figure, axes[:count]


def finish(figure: Any, axes: list[Any], titles: list[str], path: Path, xlabel: str, ylabel: str,
           title: str) -> None:
    """Labels, one legend per panel (beside the only panel, inside each of several) and the figure's title."""
    if len(axes) == 1:
        axes[0].set_xlabel(xlabel)
        axes[0].set_ylabel(ylabel)
        axes[0].set_title(title, fontsize=10)
        figures.save(figure, path, axes[0])
        return
    columns = min(COLUMNS, len(axes))
    for index, (axis, panel_title) in enumerate(zip(axes, titles)):
        axis.set_title(panel_title, fontsize=9)
        if index % columns == 0:
            axis.set_ylabel(ylabel, fontsize=8)
        handles = axis.get_legend_handles_labels()[0]
        if handles:
            axis.legend(fontsize=6, loc="upper left", ncol=1 if len(handles) <= 6 else 2)
    figure.supxlabel(xlabel, fontsize=9)
    figure.suptitle(title + "; shared axes", fontsize=10)
    figures.save(figure, path)


def plot_with_bands(variants: dict[str, Variant], lengths: list[int], value: Callable[[Variant, int], Estimate | None],
                    path: Path, labels: tuple[str, str], trained: int, log_y: bool = False,
                    zero_line: bool = False) -> None:
    """`value(variant, length)` (an Estimate or None) against length, a band where it has an interval; `labels`:
    the y axis's and the figure's title."""
    ylabel, title = labels
    groups = panel_groups(variants)
    figure, axes = panels(len(groups))
    for axis, (panel_title, members) in zip(axes, groups):
        by_method = _by_method(groups, panel_title)
        for name, variant in members.items():
            points = [(length, value(variant, length)) for length in lengths]
            points = [(length, estimate) for length, estimate in points if estimate is not None]
            if not points:
                continue
            xs = [length for length, _ in points]
            means = [estimate.mean for _, estimate in points]
            line, = axis.plot(xs, means, **_style(variant, by_method), markersize=3,
                              label=name, linewidth=1.3)
            if all(estimate.has_interval for _, estimate in points):
                axis.fill_between(xs, [e.low for _, e in points], [e.high for _, e in points],
                                  color=line.get_color(), alpha=0.15, linewidth=0)
        axis.axvline(trained, color="grey", linestyle=":", linewidth=1)
        if zero_line:
            axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xscale("log", base=2)
        if log_y:
            axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
    finish(figure, axes, [t for t, _ in groups], path,
            "evaluation length (tokens, log scale); dotted = trained length L", ylabel, title)


def plot_position_penalty(variants: dict[str, Variant], longest: int, trained: int, path: Path) -> None:
    """Penalty by position in the longest windows (window loss minus reference loss of the same tokens)."""
    groups = [(t, {n: v for n, v in members.items() if v.curves}) for t, members in panel_groups(variants)]
    groups = [(t, members) for t, members in groups if members] or [("", {})]
    figure, axes = panels(len(groups))
    bucket = max(1, longest // 64)
    for axis, (panel_title, members) in zip(axes, groups):
        by_method = _by_method(groups, panel_title)
        for name, variant in members.items():
            curves = np.stack([variant.curves[s] for s in sorted(variant.curves)])[:, : (longest // bucket) * bucket]
            binned = curves.reshape(len(curves), -1, bucket).mean(axis=2)
            xs = bucket * (np.arange(binned.shape[1]) + 0.5)
            style = _style(variant, by_method)
            line, = axis.plot(xs, binned.mean(axis=0), linestyle=style["linestyle"], color=style["color"],
                              label=name, linewidth=1.2)
            if len(binned) > 1:
                axis.fill_between(xs, binned.min(axis=0), binned.max(axis=0), color=line.get_color(), alpha=0.12,
                                  linewidth=0)
        axis.axvline(trained, color="grey", linestyle=":", linewidth=1)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.grid(True, alpha=0.3)
    finish(figure, axes, [t for t, _ in groups], path,
            f"position in a {longest}-token window, in bins of {bucket} positions (each bin: every scored "
            "window's tokens there); dotted = L; band: range over seeds",
            "loss in the window minus L-window reference (nats)",
            "Where a model breaks: per-position penalty at the longest length (< L: early-token curse)")


def plot_training_curves(training: dict[str, dict[int, dict]], path: Path) -> None:
    figure, axis = figures.new()
    for encoding, by_seed in training.items():
        curves = [summary["curve"] for summary in by_seed.values() if summary and summary.get("curve")]
        if not curves:
            continue
        steps = [step for step, _ in curves[0]]
        mean = [statistics.fmean(curve[i][1] for curve in curves if i < len(curve)) for i in range(len(steps))]
        axis.plot(steps, mean, color=colour(encoding), label=f"{encoding} (train)", linewidth=1)
        val = [summary["val_curve"] for summary in by_seed.values() if summary and summary.get("val_curve")]
        if val:
            val_steps = [step for step, _ in val[0]]
            val_mean = [statistics.fmean(c[i][1] for c in val if i < len(c)) for i in range(len(val_steps))]
            axis.plot(val_steps, val_mean, "o--", color=colour(encoding), markersize=3, linewidth=0.8)
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats/token), mean over seeds; dashed = validation")
    axis.set_title("Training curves (same data, budget, seeds, shape)")
    axis.grid(True, alpha=0.3)
    figures.save(figure, path, axis)


def plot_snapshots(snapshots: Snapshots, tokens_per_step: int, max_steps: int, path: Path, longest_multiple: float) -> None:
    figure, axis = figures.new()
    for name, rows in snapshots.items():
        encoding = name.split("+")[0]
        xs = [fraction * max_steps * tokens_per_step / 1e6 for fraction, *_ in rows]
        means = [penalty.mean for _, penalty, _, _ in rows]
        errors = [[penalty.mean - (penalty.low if penalty.has_interval else penalty.mean) for _, penalty, _, _ in rows],
                  [(penalty.high if penalty.has_interval else penalty.mean) - penalty.mean for _, penalty, _, _ in rows]]
        axis.errorbar(xs, means, yerr=errors, marker=figures.marker(encoding), markersize=4, capsize=3,
                      color=colour(encoding),
                      label=name, linewidth=1.2)
    axis.axhline(0, color="black", linewidth=0.8)
    axis.set_xlabel("training tokens (millions)")
    axis.set_ylabel(f"extrapolation penalty at {longest_multiple:g}x (nats, 95% t interval over seeds and windows)")
    axis.set_title("Extrapolation against training tokens (models kept during training)", fontsize=10)
    axis.grid(True, alpha=0.3)
    figures.save(figure, path, axis)


def write_figures(results: ComparisonResults) -> None:
    """The comparison's figures in OUT: plot.png (perplexity), penalty.png, position_loss.png, train_curves.png and,
    with kept models, snapshots.png."""
    out, variants, trained = results.out, results.variants, results.trained
    if variants:
        plot_with_bands(variants, results.lengths, lambda v, n: v.ppl(n), out / "plot.png",
                        ("perplexity (log scale)", "Perplexity vs evaluation length (mean over seeds, band: 95% t "
                         "interval)"), trained, log_y=True)
        plot_with_bands(variants, results.penalty_lengths, lambda v, n: v.penalty_estimate(n), out / "penalty.png",
                        ("extrapolation penalty (nats)", "Penalty for positions >= L vs the L-window reference "
                         "(band: 95% t interval over seeds and windows)"), trained, zero_line=True)
        plot_position_penalty(variants, results.longest, trained, out / "position_loss.png")
    plot_training_curves(results.training, out / "train_curves.png")
    if results.snapshots:
        plot_snapshots(results.snapshots, results.tokens_per_step, results.max_steps, out / "snapshots.png",
                       results.longest / trained)
