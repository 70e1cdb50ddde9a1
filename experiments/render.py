"""The one renderer: how every study's report writes a number, a table, a figure and its provenance.

A study's report function (its spec's `report`) reads its records (experiments/engine.py Records) and says what to
show; everything shown is written here: estimates as 'mean [low, high]' (cell), markdown tables (table, header),
figures with interval bands or bars (bands, bars), the invocations that made the records (provenance), and the
published numbers a report sets beside its own (published: experiments/published/NAME.toml, each entry with its
source). The words a report says of its numbers are eval/verdicts.py's.
"""
from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from eval import figures
from eval.stats import PERMUTATION_DRAWS, Estimate

PUBLISHED = Path(__file__).resolve().parent / "published"
COLUMNS = 4  # panels per row of small multiples


# ------------------------------------------------------------------------------------------------------ numbers

def cell(estimate: Estimate | None, digits: int = 2, signed: bool = False) -> str:
    """'mean [low, high]' with `digits` decimals (a sign when `signed`), the mean alone without an interval, 'n/a'
    without a number."""
    return "n/a" if estimate is None else estimate.format(digits, signed)


def p_text(p: float) -> str:
    """'0.012', or for a share of random orders of which none reached the observed value, '< 1 / draws'."""
    return f"< {1 / PERMUTATION_DRAWS:.0e}" if p == 0 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def estimate_of(saved: dict | None) -> Estimate | None:
    """An estimate as a record keeps it ({"mean", "low", "high", "n"})."""
    return None if saved is None else Estimate(saved["mean"], saved.get("low"), saved.get("high"), saved.get("n", 1))


def saved(estimate: Estimate | None) -> dict | None:
    return None if estimate is None else {"mean": estimate.mean, "low": estimate.low, "high": estimate.high,
                                          "n": estimate.n}


def header(first: str, columns: list[str]) -> list[str]:
    """A markdown table's header row and its alignment row (numbers right-aligned)."""
    return [f"| {first} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]


def table(rows: dict[str, Any], columns: Iterable[Any], titles: list[str], value: Callable[[Any, Any], str],
          first: str = "variant") -> list[str]:
    """A table with one row per entry of `rows` (name -> row) and one column per entry of `columns`, headed
    `titles`: value(row, column) in each cell."""
    columns = list(columns)
    return header(first, titles) + [f"| {name} | " + " | ".join(value(row, column) for column in columns) + " |"
                                    for name, row in rows.items()]


def write(out: Path, name: str, text: str) -> Path:
    """OUT/NAME written whole (a reader never sees half a report)."""
    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text)
    staging.replace(path)
    return path


# -------------------------------------------------------------------------------------------------- provenance

def provenance(invocations: list[dict], seconds: list[float]) -> str:
    """How the records were made: the last invocation's command, machine and wall time, the invocations on record,
    and the compute time its cells took (summed over cells, whichever invocation measured them)."""
    if not invocations:
        return "No invocation on record."
    last = invocations[-1]
    line = (f"Reproduce: `{last['command']}`. This invocation: {last['wall_s'] / 60:.1f} min wall on "
            f"{last['machine']} ({last['where']})")
    if len(invocations) > 1:
        line += (f"; all {len(invocations)} invocations on record (invocations.jsonl): "
                 f"{sum(item['wall_s'] for item in invocations) / 60:.1f} min wall")
    return line + f". Compute summed over the {len(seconds)} cells: {sum(seconds) / 60:.1f} min."


# ---------------------------------------------------------------------------------------------------- published

def published(name: str) -> list[dict]:
    """The entries of experiments/published/NAME.toml ([[claim]] or [[order]] tables), each with its source."""
    path = PUBLISHED / f"{name}.toml"
    loaded = tomllib.loads(path.read_text())
    entries = [entry for kind in loaded.values() if isinstance(kind, list) for entry in kind]
    missing = [entry for entry in entries if "source" not in entry]
    if missing:
        raise ValueError(f"{path}: every entry names its source; these do not: {missing}")
    return entries


# ------------------------------------------------------------------------------------------------------ figures

def panels(count: int) -> tuple[Any, list[Any]]:
    """A figure with `count` axes sharing x and y (a grid of COLUMNS when more than one), and the list of them."""
    if count == 1:
        figure, axis = figures.new()
        return figure, [axis]
    columns = min(COLUMNS, count)
    figure, grid = figures.grid(math.ceil(count / columns), columns, panel_width=4.4, panel_height=3.3)
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


Line = tuple[str, dict, list[tuple[float, Estimate]]]  # (label, matplotlib style, [(x, estimate)])


def bands(groups: list[tuple[str, list[Line]]], path: Path, xlabel: str, ylabel: str, title: str,
          vline: float | None = None, log_x: bool = False, log_y: bool = False, zero_line: bool = False) -> None:
    """One panel per group, one line per series, a band where every point has an interval."""
    figure, axes = panels(len(groups))
    for axis, (_, lines) in zip(axes, groups):
        for name, style, points in lines:
            points = [(x, e) for x, e in points if e is not None]
            if not points:
                continue
            line, = axis.plot([x for x, _ in points], [e.mean for _, e in points], **style, markersize=3, label=name,
                              linewidth=1.3)
            if all(e.has_interval for _, e in points):
                axis.fill_between([x for x, _ in points], [e.low for _, e in points], [e.high for _, e in points],
                                  color=line.get_color(), alpha=0.15, linewidth=0)
        if vline is not None:
            axis.axvline(vline, color="grey", linestyle=":", linewidth=1)
        if zero_line:
            axis.axhline(0, color="black", linewidth=0.8)
        if log_x:
            axis.set_xscale("log", base=2)
        if log_y:
            axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
    finish(figure, axes, [name for name, _ in groups], path, xlabel, ylabel, title)


def bars(axis: Any, lines: list[Line]) -> None:
    """Points with 95% interval bars, one series per line (training budgets, kept models)."""
    for name, style, points in lines:
        points = [(x, e) for x, e in points if e is not None]
        if not points:
            continue
        below = [e.mean - (e.low if e.has_interval else e.mean) for _, e in points]
        above = [(e.high if e.has_interval else e.mean) - e.mean for _, e in points]
        axis.errorbar([x for x, _ in points], [e.mean for _, e in points], yerr=[below, above], markersize=4,
                      capsize=3, linewidth=1.2, label=name, **style)
