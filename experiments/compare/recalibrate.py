"""The use verdicts of committed comparison reports made again under the calibrated rule, from the intervals they
print (their run folders, which hold the per-window numbers, are not kept), without training.

    python -m experiments.compare.recalibrate docs/compare_quick docs/compare_map docs/compare_frontier \\
        docs/compare_recipes --out docs/use_calibration.md

Each printed use cell 'mean [low, high]' over S seeds (Student's t with S - 1 degrees of freedom over seeds and
windows: experiments.seed_intervals.spread_interval) gives back its standard error, (high - low) / (2 t(0.975,
S - 1)), to the digits printed. Then, as eval.stats.calibrated_verdicts: the cells past the positive control (windows
longer than L) of one report are one family, Holm-corrected; "uses" needs that test and a mean of at least the
variant's margin, a tenth of its positive control's use (windows of L), at least 0.05 nats. A variant's reach: the
largest distance at which it and every nearer one read "uses". The window control (attention limited to the last L
keys) can relay information n_layers x (L - 1) tokens back through its layers, so only distances past that are
impossible for it. Rewritten in report.md: the verdict words and "how far back" of the use table, its caption, the
negative-control lines, and the map's "how far back" and reading columns; --out lists every impossible cell with its
verdict under the former rule and this one.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from eval.stats import Cell, Estimate, calibrated_verdicts, interval_verdict, reach_of, t_quantile_975, use_margin
from experiments.compare.findings import penalty_side

CELL = re.compile(r"(?P<mean>[+\-]\d+\.\d+) \[(?P<low>[+\-]\d+\.\d+), (?P<high>[+\-]\d+\.\d+)\] (?P<verdict>[a-z ]+)")
COLUMN = re.compile(r"d = (?P<d>[\d,]+) \((?P<multiple>[\d.]+)L\) in (?P<length>[\d,]+)")
CONTROL = "window"


@dataclass
class UseCell:
    variant: str
    distance: int
    length: int
    estimate: Estimate
    former: str
    verdict: str = ""

    def cell(self, seeds: int) -> Cell:
        return Cell(self.estimate.mean, (self.estimate.high - self.estimate.low) / (2 * t_quantile_975(seeds - 1)),
                    seeds - 1)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def use_table(lines: list[str]) -> tuple[int, int, list[tuple[int, int]]]:
    """(index of the header, of the last row, the columns' (distance, length)) of the use table."""
    start = next(i for i, line in enumerate(lines) if line.startswith("### Use of the text past L"))
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("| variant |"))
    end = header + 2
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    columns = [(number(m["d"]), number(m["length"])) for m in COLUMN.finditer(lines[header])]
    return header, end, columns


def cells_of(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def recalibrate(folder: Path) -> dict:
    """Rewrite `folder`/report.md; returns its cells, margins, reaches and impossible cells."""
    settings = json.loads((folder / "results.json").read_text())["settings"]
    trained, seeds = settings["trained_length"], len(settings["compare"]["seeds"])
    layers = settings["shared"]["model"]["n_layers"]
    relay = layers * (trained - 1)
    path = folder / "report.md"
    lines = path.read_text().split("\n")
    header, end, columns = use_table(lines)
    found: list[UseCell] = []
    rows: dict[str, list[str]] = {}
    for index in range(header + 2, end):
        cells = cells_of(lines[index])
        rows[cells[0]] = cells
        for (distance, length), text in zip(columns, cells[1:]):
            match = CELL.fullmatch(text.strip())
            if match:
                estimate = Estimate(float(match["mean"]), float(match["low"]), float(match["high"]), seeds)
                found.append(UseCell(cells[0], distance, length, estimate, match["verdict"].strip()))
    margins = {}
    for variant in rows:
        positive = [c.estimate.mean for c in found if c.variant == variant and c.length <= trained]
        margins[variant] = use_margin(sum(positive) / len(positive) if positive else None)
    family = [c for c in found if c.length > trained]
    for c, word in zip(family, calibrated_verdicts([c.cell(seeds) for c in family], [margins[c.variant]
                                                                                       for c in family])):
        c.verdict = word
    for c in found:
        if c.length <= trained:  # the positive control: use shown at all (the former per-cell test)
            c.verdict = interval_verdict(c.estimate.low, c.estimate.high, 0.05)
    longest = max(length for _, length in columns)
    # the "max" distance's first copies lie at the window's start in every window: shown, not counted in the reach
    pinned = max(d for d, n in columns if n == longest) if "max" in settings["compare"].get("use_distances", []) else None
    reaches = {}
    for variant in rows:
        chosen = [c for c in family if c.variant == variant and c.length == longest and c.distance != pinned]
        reaches[variant] = reach_of([c.distance for c in chosen], [c.verdict for c in chosen])
    for index in range(header + 2, end):
        cells = cells_of(lines[index])
        for column, (distance, length) in enumerate(columns, 1):
            c = next((c for c in found if (c.variant, c.distance, c.length) == (cells[0], distance, length)), None)
            if c is not None:
                cells[column] = f"{c.estimate.format(3, signed=True)} {c.verdict}"
        cells[-1] = reach_words(reaches[cells[0]], found, cells[0], longest, trained)
        lines[index] = "| " + " | ".join(cells) + " |"
    lines = rewrite_caption(lines, header, seeds)
    impossible = [c for c in family if c.variant.endswith("+" + CONTROL) and c.distance > relay]
    lines = rewrite_negative_lines(lines, found, trained, relay, rows)
    lines = rewrite_map(lines, found, reaches, longest, trained)
    path.write_text("\n".join(lines))
    return {"report": str(path), "seeds": seeds, "family": len(family), "relay": relay, "margins": margins,
            "reaches": reaches, "cells": found, "impossible": impossible,
            "uses_past_L": sum(c.verdict == "uses" and c.distance > trained for c in family),
            "former_uses_past_L": sum(c.former == "uses" and c.distance > trained for c in family)}


def reach_words(reach: int | None, found: list[UseCell], variant: str, longest: int, trained: int) -> str:
    if reach is None:
        nearest = min(c.distance for c in found if c.variant == variant and c.length == longest)
        return f"no reach: use not shown at the nearest distance ({nearest:,} tokens)"
    use = next(c for c in found if (c.variant, c.distance, c.length) == (variant, reach, longest)).estimate.mean
    return f"reads back to about {reach:,} tokens ({reach / trained:.3g}L; use there {use:+.3f} nats)"


def rewrite_caption(lines: list[str], header: int, seeds: int) -> list[str]:
    for index in range(header - 1, max(0, header - 6), -1):
        if lines[index].startswith("Repeated passages in held-out windows"):
            lines[index] = re.sub(
                r"Verdict: 'uses' \(the 95% interval above 0\), 'none' \(the interval within \+-[\d.]+ nats\), "
                r"'negligible' \(both\), else 'cannot tell'\.",
                "Verdicts calibrated (experiments/compare/recalibrate.py): the cells past the positive control are "
                "one family; 'uses' needs the one-sided t test over seeds and windows (" + f"{seeds - 1}"
                + " degrees of freedom), Holm-corrected over the family, and a mean of at least the variant's "
                "margin (a tenth of its positive control's use, at least 0.05 nats); 'negligible': shown above 0 "
                "but below it; 'none': the interval within +-margin; else 'cannot tell'. How far back: the largest "
                "distance at which it and every nearer one read 'uses'. The last column's first copies lie at "
                "the window's start in every window (the longest distance it holds).", lines[index])
            lines[index] = lines[index].replace(
                "at the window's start in every window (the longest distance it holds).",
                "at the window's start in every window (the longest distance it holds): it is shown, and not "
                "counted in how far back.")
    return lines


def rewrite_negative_lines(lines: list[str], found: list[UseCell], trained: int, relay: int,
                           rows: dict[str, list[str]]) -> list[str]:
    """The negative control's lines: only distances past n_layers x (L - 1), which relays cannot span."""
    out = []
    for line in lines:
        match = re.match(r"- Negative control \((?P<variant>[\w+\-]+), attention limited to (?P<keys>\d+) keys\)", line)
        if not match:
            out.append(line)
            continue
        variant = match["variant"]
        beyond = [c for c in found if c.variant == variant and c.distance > relay and c.length > trained]
        words = ", ".join(f"d = {c.distance:,} {c.verdict}" for c in beyond) or "no distance measured"
        state = "FAILS: the measure reads use where none is possible" if any(c.verdict == "uses" for c in beyond) \
            else "passes" if beyond and all(c.verdict in ("none", "negligible") for c in beyond) \
            else "reads no use (not shown within the margin everywhere)"
        out.append(f"- Negative control ({variant}, attention limited to {match['keys']} keys, which its layers can "
                   f"relay about {relay:,} tokens back): past that, {words} ({state}).")
    return out


def rewrite_map(lines: list[str], found: list[UseCell], reaches: dict, longest: int, trained: int) -> list[str]:
    """The map table's "how far back" and reading columns, from the new verdicts (experiments/compare/
    extrapolation_map.py's words)."""
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("### The extrapolation map"))
        header = next(i for i in range(start, len(lines)) if lines[i].startswith("| variant |"))
    except StopIteration:
        return lines
    titles = cells_of(lines[header])
    if "how far back (same weights)" not in titles:
        return lines
    far, reading, penalty = (titles.index("how far back (same weights)"), titles.index("reading"),
                             next(i for i, t in enumerate(titles) if t.startswith("text penalty")))
    index = header + 2
    readings: dict[str, list[str]] = {}
    while index < len(lines) and lines[index].startswith("|"):
        cells = cells_of(lines[index])
        variant = cells[0]
        if variant in reaches:
            cells[far] = reach_words(reaches[variant], found, variant, longest, trained)
            cells[reading] = map_reading(cells[penalty], found, variant, trained)
            readings.setdefault(cells[reading], []).append(variant)
        lines[index] = "| " + " | ".join(cells) + " |"
        index += 1
    bullet = ("- The extrapolation map on the same weights (use: the text models' own repeated passages; harm: their "
              "text penalty at the longest length): " + "; ".join(f"{word}: {', '.join(names)}" for word, names in
                                                                readings.items())
              + ". 'Extrapolates' needs both: no harm on text and use of the text past L shown by the calibrated "
              "rule (Holm over the report's cells, a mean of at least the margin); how far back each reads is the "
              "largest distance at which it and every nearer one read 'uses'.")
    return [bullet if line.startswith("- The extrapolation map on the same weights") else line for line in lines]


def map_reading(penalty_text: str, found: list[UseCell], variant: str, trained: int) -> str:
    match = re.fullmatch(r"(?P<mean>[+\-]\d+\.\d+) \[(?P<low>[+\-]\d+\.\d+), (?P<high>[+\-]\d+\.\d+)\]",
                         penalty_text.strip())
    side = penalty_side(Estimate(float(match["mean"]), float(match["low"]), float(match["high"]), 3)) if match \
        else "single"
    positive = [c.verdict for c in found if c.variant == variant and c.length <= trained]
    if positive and "uses" not in positive:
        return "no use within L: cannot tell"
    uses = any(c.verdict == "uses" for c in found if c.variant == variant and c.distance > trained)
    if uses:
        return {"flat": "extrapolates", "below": "extrapolates", "noise": "extrapolates (text within noise)"}.get(
            side, "uses the context past L but degrades on text")
    return {"flat": "window-like", "below": "window-like", "noise": "window-like (text within noise)",
            "above": "degrades"}.get(side, "does not beat its window (one seed: no text interval)")


def calibration_markdown(reports: list[dict]) -> str:
    lines = ["# Calibration of the use verdicts", "",
             "Written by `python -m experiments.compare.recalibrate` (the comparison reports' cells) and "
             "`experiments.method_grid` (the real model's). A cell where use is impossible: the window control "
             "(attention limited to the last L keys) at a distance its layers cannot relay, n_layers x (L - 1) tokens "
             "back. 'Former': the rule before (the 95% interval above 0 in each cell, no correction, no margin on "
             "the mean); 'calibrated': Holm over the report's cells past the positive control and a mean of at least "
             "the margin.", "",
             "| report | seeds | cells in the family | relay reach | impossible cells | 'uses' there, former | "
             "'uses' there, calibrated | 'uses' past L, former | 'uses' past L, calibrated |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in reports:
        lines.append(f"| {r['report']} | {r['seeds']} | {r['family']} | {r['relay']:,} | {len(r['impossible'])} | "
                     f"{sum(c.former == 'uses' for c in r['impossible'])} | "
                     f"{sum(c.verdict == 'uses' for c in r['impossible'])} | {r['former_uses_past_L']} | "
                     f"{r['uses_past_L']} |")
    total = sum(len(r["impossible"]) for r in reports)
    lines += ["", f"In all: {total} impossible cells; former rule {sum(c.former == 'uses' for r in reports for c in r['impossible'])} "
                  f"read 'uses', calibrated rule {sum(c.verdict == 'uses' for r in reports for c in r['impossible'])}.",
              "", "| report | variant | distance | use [95% t] | former | calibrated |", "|---|---|---:|---:|---|---|"]
    for r in reports:
        for c in r["impossible"]:
            lines.append(f"| {r['report']} | {c.variant} | {c.distance:,} | {c.estimate.format(3, signed=True)} | "
                         f"{c.former} | {c.verdict} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.compare.recalibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, help="comparison folders (report.md, results.json)")
    parser.add_argument("--out", type=Path, help="a markdown file for the calibration table")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.folders:
        parser.error("give one or more comparison folders (each with report.md and results.json)")
    reports = []
    for folder in args.folders:
        reports.append(recalibrate(folder))
        r = reports[-1]
        print(f"{folder}: {r['family']} cells; 'uses' past L {r['former_uses_past_L']} -> {r['uses_past_L']}; "
              f"impossible cells {len(r['impossible'])}")
    if args.out:
        args.out.write_text(calibration_markdown(reports))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
