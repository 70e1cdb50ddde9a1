"""Does a ranking of methods transfer from one model to another? This use grid beside another grid on another model
(use_grid's --beside), over the methods both measured: per method its harm (the penalty past L, at each grid's own
length), its reach and its use at the farthest distance both grids measured as a multiple of each model's L, pooled
over the texts' windows; Spearman's rank correlation of the two models' use there and of their penalties, with a
95% bootstrap interval over windows (resampled within each text, each model on its own) and a one-sided
permutation p; and every pair of the shared methods, paired by window in each model, two-sided t, Holm over every
difference of the table: the same order in both, reversed, separated in one only, or in neither (or not tested in
a model with fewer than MIN_WINDOWS windows of the pair).
"""
from __future__ import annotations

import numpy as np

from eval.stats import spearman, spearman_p
from eval.use import GRID_POSITIVE, MIN_WINDOWS, grid_estimate
from eval.verdicts import separated_by_windows
from experiments.render import p_text
from model.methods import EVERY_LAYER, NONE

BOOTSTRAP = 2000  # resamples of the windows for the correlation's interval
QUANTITIES = ("use", "penalty")
MIN_METHODS = 3  # a rank correlation of fewer says nothing


def per_window(texts: dict, multiple: float) -> dict[str, dict[tuple[str, int], dict[str, float]]]:
    """method -> (text, window) -> its use `multiple` L back and its penalty past L (NLL past L less plain RoPE's
    within L, the same window), for every window measured under the method and plain RoPE."""
    found: dict[str, dict] = {}
    for text, grid in texts.items():
        at = [d for d in grid["distances"] if round(d / grid["trained"], 6) == multiple]
        plain = grid["methods"].get(NONE, [])
        for method, windows in grid["methods"].items():
            for window, (entry, base) in enumerate(zip(windows, plain)):
                if method != GRID_POSITIVE and at and entry and base:
                    found.setdefault(method, {})[(text, window)] = {"use": entry[at[0]]["use"],
                                                                    "penalty": entry["past"] - base["within"]}
    return found


def multiples_past(texts: dict) -> set[float]:
    return {round(d / g["trained"], 6) for g in texts.values() for d in g["distances"] if d > g["trained"]}


def bootstrap(models: list[dict], methods: list[str], quantity: str,
              seed: int = 0) -> tuple[list[list[float]], list[int], list[float]] | None:
    """Over each model's windows that every method has: the per-method means (the correlation's estimate), how many
    windows, and Spearman's correlation between the two models' means in each of BOOTSTRAP draws, the windows
    resampled with replacement within each text; None where a text has fewer than MIN_WINDOWS of them (2 windows
    resample to 3 distinct means: no interval worth the name)."""
    rng, draws = np.random.default_rng(seed), []
    matrices, groups = [], []
    for windows in models:
        keys = sorted(set.intersection(*(set(windows[m]) for m in methods)))
        if len(keys) < MIN_WINDOWS:
            return None
        matrices.append(np.array([[windows[m][k][quantity] for k in keys] for m in methods]))
        groups.append([np.array([i for i, k in enumerate(keys) if k[0] == text]) for text in dict.fromkeys(k[0] for k in keys)])
        if min(len(group) for group in groups[-1]) < MIN_WINDOWS:
            return None
    for _ in range(BOOTSTRAP):
        means = [matrix[:, np.concatenate([rng.choice(g, len(g)) for g in group])].mean(axis=1)
                 for matrix, group in zip(matrices, groups)]
        rho = spearman(list(means[0]), list(means[1]))
        if rho is not None:
            draws.append(rho)
    return [list(m.mean(axis=1)) for m in matrices], [m.shape[1] for m in matrices], draws


def spread(rho: float, draws: list[float]) -> str:
    """The bootstrap's 95% percentile interval, or, where it is a point (the resampled windows reorder neither
    model's methods in 95% of draws), how many draws give the estimate: the interval would hide that the rank
    correlation's uncertainty is then the few methods', which the permutation p states."""
    low, high = np.percentile(draws, 2.5), np.percentile(draws, 97.5)
    if low < high:
        return f"[{low:+.2f}, {high:+.2f}] (95% bootstrap over windows, {len(draws):,} draws)"
    same = sum(1 for d in draws if d == rho)
    return (f"in {same:,} of {len(draws):,} bootstrap draws over windows (at least 95% of them: the windows' noise "
            "leaves it there, no interval to show)")


def reach_text(grid: dict, method: str) -> str:
    if method not in grid["methods"]:
        return "n/a"
    found = grid["methods"][method]["reach"]
    return "none" if found is None else f"{found / grid['trained']:g}L"


def section(grids: list[dict], summaries: list[dict], names: tuple[str, str], beside: str, shown, title) -> list[str]:
    """The transfer table: grids (use_grid_report.load's) and their summaries, this grid's first, named by their
    checkpoints; `beside` the other's folder; `shown` and `title` render an estimate and a method."""
    common = multiples_past(grids[0]) & multiples_past(grids[1])
    if not common:
        return ["## Beside another model", "", f"{beside} measures no distance past L (as a multiple of L) that this "
                "grid measures: no transfer table.", ""]
    multiple = max(common)
    models = [per_window(g, multiple) for g in grids]
    methods = [m for m in models[0] if m in models[1]]
    lengths = " and ".join(f"{n} {next(iter(g.values()))['length'] / next(iter(g.values()))['trained']:g}L"
                           for n, g in zip(names, grids))
    lines = [f"## Beside {names[1]}: does the ranking transfer?", "",
             f"The {len(methods)} methods both grids measured ({beside}). Use {multiple:g}L back (the farthest distance "
             f"both measured, each model's own L) and the penalty past L (at each grid's window length: {lengths}), "
             "mean [95% t over every text's windows pooled]; reach per text (" + ", ".join(grids[0])
             + f"), in multiples of L. Each cell: {names[0]} / {names[1]}.", "",
             f"| method | use {multiple:g}L back | penalty past L | reach | rank by use |", "|---|---:|---:|---|---|"]
    uses = [[float(np.mean([v["use"] for v in model[m].values()])) for m in methods] for model in models]
    rank = [{m: i + 1 for i, (m, _) in enumerate(sorted(zip(methods, found), key=lambda pair: -pair[1]))}
            for found in uses]  # per model, by each method's mean use over all its windows
    for method in methods:
        cells = [" / ".join(shown(grid_estimate([v[q] for v in model[method].values()])) for model in models)
                 for q in QUANTITIES]
        reach = " / ".join(",".join(reach_text(g, method) for g in s["texts"].values()) for s in summaries)
        lines.append(f"| {title(method)} | {cells[0]} | {cells[1]} | {reach} | {rank[0][method]} / {rank[1][method]} |")
    lines.append("")
    for quantity in QUANTITIES:
        what = f"{quantity} {multiple:g}L back" if quantity == "use" else "penalty past L"
        if len(methods) < MIN_METHODS:
            lines.append(f"- Spearman's rank correlation of the {what}: not computed, {len(methods)} methods.")
            continue
        found = bootstrap(models, methods, quantity)
        if found is None:  # the means of fewer windows carry no measure of their noise: no correlation is read
            lines.append(f"- Spearman's rank correlation of the {what}: not computed, fewer than {MIN_WINDOWS} windows "
                         "that every method has in a text of a model.")
            continue
        values, counts, draws = found
        rho = spearman(*values)
        lines.append(f"- Spearman's rank correlation of the two models' {what}, {len(methods)} methods, over the "
                     f"windows every method has ({', '.join(f'{n} {c}' for n, c in zip(names, counts))}): "
                     + ("undefined (a constant)" if rho is None or not draws else f"{rho:+.2f} {spread(rho, draws)}, "
                        f"one-sided p {p_text(spearman_p(*values))} by permutation of the methods") + ".")
    return lines + [""] + pair_lines(models, methods, names, multiple, shown, title)


def mark_holm(family: list[dict]) -> None:
    """Each estimate of one family gets "holm": shown not 0 by the two-sided t over windows, Holm over the family."""
    for entry, separated in zip(family, separated_by_windows([(e.get("mean"), e.get("se"), e["n"]) for e in family])):
        entry["holm"] = separated


def pair_lines(models: list[dict], methods: list[str], names: tuple[str, str], multiple: float, shown, title) -> list[str]:
    rows = []
    for i, a in enumerate(methods):
        for b in methods[i + 1:]:
            for quantity in QUANTITIES:
                rows.append((a, b, quantity, [grid_estimate([model[a][k][quantity] - model[b][k][quantity]
                                                             for k in model[a] if k in model[b]]) for model in models]))
    family = [e for *_, pair in rows for e in pair]
    mark_holm(family)
    lines = ["Every pair of these methods, A minus B paired by window in each model (two-sided t over windows, Holm "
             f"over the table's {len(family)} differences at 5%; \"separated\": shown not 0). Use: more is A reading "
             "farther; penalty: more is A harmed more.", "",
             f"| A - B | quantity | {names[0]} | {names[1]} | the two models |", "|---|---|---:|---:|---|"]
    for a, b, quantity, pair in rows:
        separated = [e.get("holm", False) for e in pair]
        untested = [name for name, e in zip(names, pair) if e.get("se") is None]  # too few windows for a test
        if all(separated):
            word = "the same order" if (pair[0]["mean"] > 0) == (pair[1]["mean"] > 0) else "reversed"
        elif untested:
            word = f"not tested in {' and '.join(untested)} (fewer than {MIN_WINDOWS} windows)"
        else:
            word = f"separated in {names[separated.index(True)]} only" if any(separated) else "separated in neither"
        what = f"use {multiple:g}L back" if quantity == "use" else "penalty past L"
        lines.append(f"| {title(a)} - {title(b)} | {what} | "
                     + " | ".join(shown(e) + (" separated" if e.get("holm") else "") for e in pair) + f" | {word} |")
    return lines + [""]


def layers_lines(texts: dict, shown, title) -> list[str]:
    """A hybrid's decisive cells: each method set on every layer (`@all`) less the same method on its default layers,
    paired by window over every text's windows, the use at this grid's farthest distance and the penalty past L;
    Holm over the table. Nothing where no method is set both ways."""
    multiple = max(multiples_past(texts), default=None)
    model = per_window(texts, multiple) if multiple else {}
    pairs = [(m, m.removesuffix(EVERY_LAYER)) for m in model if m.endswith(EVERY_LAYER) and m != EVERY_LAYER
             and m.removesuffix(EVERY_LAYER) in model]
    rows = [(base, quantity, grid_estimate([model[every][k][quantity] - model[base][k][quantity]
                                            for k in model[every] if k in model[base]]))
            for every, base in pairs for quantity in QUANTITIES]
    if not rows:
        return []
    mark_holm([entry for *_, entry in rows])
    return ["## On every layer or on the default layers", "", "Each method set on every layer (`@all`) less the same "
            f"method on its default layers (a hybrid's global ones), paired by window, every text's windows pooled: use "
            f"{multiple:g}L back and the penalty past L (more: the method on every layer reads farther, or is harmed "
            "more); 95% t over windows; \"separated\": shown not 0, two-sided, Holm over the table at 5%.", "",
            "| method | quantity | on every layer less on the default layers | windows |", "|---|---|---:|---:|",
            *[f"| {title(base)} | {f'use {multiple:g}L back' if quantity == 'use' else 'penalty past L'} | {shown(e)}"
              f"{' separated' if e.get('holm') else ''} | {e['n']} |" for base, quantity, e in rows], ""]
