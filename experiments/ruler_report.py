"""The report of experiments.ruler: the grid as k of n with Wilson intervals, the parity with lm-eval's hf model, and
the ranking held against same-weights use (experiments.method_grid's results) by Spearman's rank correlation."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from commands import results_json
from eval.stats import wilson_interval
from experiments.method_grid_report import name
from experiments.real_model import machine

PARITY = {"hf": "none", "hf-yarn": "yarn"}  # lm-eval's hf model -> the pelab method it is compared with


def load_cells(out: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((out / "cells").glob("*/*@*.json"))]


def full(cell: dict) -> tuple[int, int]:
    """(samples answered in full, samples)."""
    return sum(s["score"] == 1.0 for s in cell["samples"]), len(cell["samples"])


def score_text(cell: dict) -> str:
    k, n = full(cell)
    rate = wilson_interval(k, n)
    return f"{k}/{n} [{rate.low:.2f}, {rate.high:.2f}]"


def seconds_text(cell: dict) -> str:
    """The cell's seconds, and how many of its samples an earlier invocation had already answered."""
    earlier = cell.get("from_cache", 0)
    return f"{cell['seconds']:.0f} s" + (f"; {earlier} samples from an earlier run" if earlier else "")


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    values = np.asarray(values, dtype=float)
    order = values.argsort(kind="stable")
    ranked = np.empty(len(values))
    ranked[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks, ties at their mean rank); None when either is constant."""
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def parity_rows(cells: list[dict]) -> list[dict]:
    found = {(c["method"], c["task"], c["length"]): c for c in cells}
    rows = []
    for hf, method in PARITY.items():
        for (model, task, length), cell in found.items():
            ours = found.get((method, task, length))
            if model != hf or ours is None:
                continue
            theirs = {s["doc_id"]: s for s in cell["samples"]}
            pairs = [(s, theirs[s["doc_id"]]) for s in ours["samples"] if s["doc_id"] in theirs]
            rows.append({"method": method, "task": task, "length": length, "compared": len(pairs),
                         "identical": sum(a["response"] == b["response"] for a, b in pairs),
                         "differing": [{"doc_id": a["doc_id"], "pelab": a["response"], "hf": b["response"]}
                                       for a, b in pairs if a["response"] != b["response"]],
                         "pelab": score_text(ours), "hf": score_text(cell),
                         "seconds": {"pelab": seconds_text(ours), "hf": seconds_text(cell)}})
    return rows


def use_by_method(use_results: Path | None) -> dict[str, dict[str, float]]:
    """method -> {text: use at the largest distance} from experiments.method_grid's results.json."""
    if use_results is None or not use_results.exists():
        return {}
    summary = json.loads(use_results.read_text())["summary"]
    found: dict[str, dict[str, float]] = {}
    for text, entry in summary["texts"].items():
        farthest = str(max(entry["settings"]["distances"]))
        for method, cells in entry["methods"].items():
            use = cells.get(farthest, {}).get("use", {})
            if "mean" in use:
                found.setdefault(method, {})[text] = use["mean"]
    return found


def by_distance(cells: list[dict], trained: int) -> list[str]:
    """Lines of a table: each needle cell's samples answered in full, k of n, by how far back their needle stands,
    in bins of L / 2 (where same-weights use sees reach; a bin with no sample is left empty)."""
    cells = [c for c in cells if all("needle_back" in sample for sample in c["samples"]) and c["samples"]]
    if not cells or trained <= 0:
        return []
    half = max(1, trained // 2)
    top = max(sample["needle_back"] for c in cells for sample in c["samples"]) // half + 1
    bins = [(b * half, (b + 1) * half) for b in range(top)]
    lines = ["## By how far back the needle stands", "",
             "Each sample's needle (where its answer stands in the prompt), in tokens before the prompt's end; samples "
             "answered in full, k of n, in bins of L / 2 = " + f"{half:,} tokens.", "",
             "| method | task @ length | " + " | ".join(f"{lo:,}-{hi:,} back" for lo, hi in bins) + " |",
             "|---|---|" + "---:|" * len(bins)]
    for cell in sorted(cells, key=lambda c: (c["task"], c["length"])):
        counts = []
        for lo, hi in bins:
            inside = [s for s in cell["samples"] if lo <= s["needle_back"] < hi]
            counts.append(f"{sum(s['score'] == 1 for s in inside)}/{len(inside)}" if inside else "")
        lines.append(f"| {name(cell['method'])} | {cell['task']} @ {cell['length']:,} | " + " | ".join(counts) + " |")
    return lines + [""]


def write_report(out: Path, use_results: Path | None = None, length: int | None = None,
                 trained: int = 0) -> dict[str, Any]:
    cells = [c for c in load_cells(out) if c["method"] not in PARITY]
    parity = parity_rows(load_cells(out))
    lines = ["# RULER through lm-evaluation-harness (experiments.ruler)", ""]
    if cells:
        first = cells[0]
        lines += [f"Machine: {machine()}. Methods set for {first['set_for']:,} tokens; {first['dtype']}; RULER's "
                  "own task files (lm-eval's), samples generated from the checkpoint's tokenizer (the same for every "
                  "method). Score: samples answered in full, k of n, Wilson 95% interval; seconds per cell.", ""]
        columns = sorted({(c["task"], c["length"]) for c in cells}, key=lambda key: (key[1], key[0]))
        by = {(c["method"], c["task"], c["length"]): c for c in cells}
        lines += ["| method | " + " | ".join(f"{task} @ {length:,}" for task, length in columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        for method in dict.fromkeys(c["method"] for c in cells):
            lines.append(f"| {name(method)} | " + " | ".join(
                f"{score_text(by[(method, *col)])} ({seconds_text(by[(method, *col)])})" if (method, *col) in by
                else "" for col in columns) + " |")
        lines.append("")
        lines += by_distance(cells, trained)
    if parity:
        lines += ["## Parity with lm-eval's hf model on the same weights", "",
                  "| method | task | length | samples compared | identical responses | pelab | hf | seconds pelab / hf |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in parity:
            lines.append(f"| {name(row['method'])} | {row['task']} | {row['length']:,} | {row['compared']} | "
                         f"{row['identical']} | {row['pelab']} | {row['hf']} | {row['seconds']['pelab']} / "
                         f"{row['seconds']['hf']} |")
        for row in parity:
            for sample in row["differing"]:
                lines.append(f"- {row['method']} {row['task']}@{row['length']} sample {sample['doc_id']}: pelab "
                             f"{sample['pelab']!r}, hf {sample['hf']!r}")
        lines.append("")
    use = use_by_method(use_results)
    correlation = None
    if use and cells:
        longest = length or max(c["length"] for c in cells)
        rates: dict[str, list[float]] = {}
        for cell in cells:
            if cell["length"] == longest and cell["task"].startswith("niah"):
                k, n = full(cell)
                rates.setdefault(cell["method"], []).append(k / n)
        shared = [m for m in rates if m in use]
        if len(shared) >= 3:
            ruler = [float(np.mean(rates[m])) for m in shared]
            reading = [float(np.mean(list(use[m].values()))) for m in shared]
            correlation = {"methods": shared, "ruler": ruler, "use": reading, "spearman": spearman(ruler, reading)}
    if correlation:
        rho = correlation["spearman"]
        lines += ["## RULER against same-weights use", "",
                  f"Across the {len(correlation['methods'])} methods with both: the share of needle samples answered "
                  f"in full at {longest:,} tokens (niah tasks, mean over tasks) against use at the largest distance "
                  "of experiments.method_grid (mean over its texts). Spearman's rank correlation: "
                  + ("undefined (one of them constant)" if rho is None else f"{rho:+.2f}") + ".", "",
                  "| method | RULER (share answered in full) | use at the largest distance (nats) |", "|---|---:|---:|"]
        lines += [f"| {name(m)} | {r:.2f} | {u:+.3f} |" for m, r, u in zip(correlation["methods"], correlation["ruler"],
                                                                           correlation["use"])]
        lines.append("")
    results = {"cells": cells, "parity": parity, "correlation": correlation}
    (out / "results.json").write_text(results_json(results))
    (out / "report.md").write_text("\n".join(lines))
    return results
