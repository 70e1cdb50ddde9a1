"""The report of experiments.method_grid: per-window values from its cache, intervals over windows, calibrated
verdicts, the priming control, paired comparisons, the calibration on cells where use is impossible, and the ranking.

Verdicts (eval.stats.calibrated_verdicts): every use cell past L of the report is one family; "uses" needs the
one-sided t test over windows, Holm-corrected over the family, and a mean of at least the margin, a tenth of the
text's positive control (eval.stats.use_margin). Reach: the largest distance at which it and every nearer one read
"uses" (eval.stats.reach_of). Impossible cells: a method whose attention does not reach the distance (sinks + window
past its window), and a method collapsed there (its control's NLL on the second copies at least COLLAPSE nats above
what the model gives them within L, the positive control's control NLL).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from commands import portable_command, results_json
from eval import figures
from eval.stats import (
    Cell,
    Estimate,
    bounded_t_interval,
    calibrated_verdicts,
    holm,
    interval_verdict,
    reach_of,
    t_interval,
    t_sf,
    use_margin,
)
from eval.use import MIN_WINDOWS, Placement
from experiments.real_model import machine
from model.methods import NONE

COLLAPSE = 2.0  # nats above the positive control's NLL on the same kind of copies: the method predicts no text there
# compared paired by window past L: the four said to read the whole window, YaRN, and the window baseline
PAIRED = ("rerope", "selfextend", "string", "dca", "yarn", "sinks")
KINDS = ("use", "presence", "order")
NAMES = {"none": "plain RoPE", "linear": "PI (linear)", "ntk": "NTK", "dynamic": "dynamic NTK", "yarn": "YaRN",
         "selfextend": "SelfExtend", "rerope": "ReRoPE", "string": "STRING", "dca": "DCA", "sinks": "sinks + window",
         "logn": "log-n"}


def name(method: str) -> str:
    return NAMES.get(method, method)


def window_entry(record: dict, placements: list[Placement], distances: list[int]) -> dict:
    """One cached cell's numbers: harm on the natural window, and per distance use, presence and order (the mean
    over the window's passages) and the control's and the probe's NLL on the second copies."""
    found = {kind: np.asarray(record["passages"][kind]) for kind in ("probe", "control", "shuffled")}
    entry: dict[str, Any] = {"seconds": record["seconds"], "reach": record["reach"], "dtype": record["dtype"],
                             "paths": record["paths"]}
    if "natural" in record:
        entry["within"], entry["past"] = record["natural"]["within"], record["natural"]["past"]
    at = {d: [i for i, p in enumerate(placements) if p.distance == d] for d in distances}
    for d, chosen in at.items():
        probe, control, shuffled = (found[k][chosen] for k in ("probe", "control", "shuffled"))
        entry[d] = {"use": float((control - probe).mean()), "presence": float((control - shuffled).mean()),
                    "order": float((shuffled - probe).mean()), "control_nll": float(control.mean()),
                    "probe_nll": float(probe.mean()), "passage_use": (control - probe).tolist(),
                    "second": [placements[i].second for i in chosen]}
    return entry


def load_cells(out: Path) -> dict[str, dict]:
    """text -> {"layout", "windows": {method: [entry per window, in window order; None where not cached]}}."""
    texts = {}
    for layout_path in sorted((out / "cache").glob("*/layout.json")):
        layout = json.loads(layout_path.read_text())
        settings = layout["settings"]
        methods: dict[str, list] = {}
        for window in range(settings["windows"]):
            for path in sorted((layout_path.parent / f"w{window}").glob("*.json")):
                positive = path.stem == "positive"
                placements = [Placement(*p) for p in layout["positive" if positive else "placements"][window]]
                entry = window_entry(json.loads(path.read_text()), placements,
                                     settings["within"] if positive else settings["distances"])
                methods.setdefault(path.stem, [None] * settings["windows"])[window] = entry
        texts[layout_path.parent.name] = {"layout": layout, "methods": methods}
    return texts


def estimate(values: list[float], low: float | None = None) -> dict:
    """Mean with Student's t 95% over windows (from MIN_WINDOWS), the values themselves, and the standard error."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"n": 0, "values": []}
    if len(values) < MIN_WINDOWS:
        return {"n": len(values), "mean": float(np.mean(values)), "values": values}
    found = bounded_t_interval(values, low) if low is not None else t_interval(values)
    se = float(np.std(values, ddof=1) / math.sqrt(len(values)))
    return {"n": len(values), "mean": found.mean, "low": found.low, "high": found.high, "se": se, "values": values}


def shown(entry: dict, signed: bool = True, digits: int = 3) -> str:
    """'mean [low, high]', or the values themselves with no interval below MIN_WINDOWS windows."""
    if not entry.get("n"):
        return "n/a"
    sign = "+" if signed else ""
    if "low" not in entry:
        return ", ".join(f"{v:{sign}.{digits}f}" for v in entry["values"]) + f" ({entry['n']} window{'s' * (entry['n'] > 1)}: no interval)"
    if len(set(entry["values"])) == 1:  # the same value in every window (plain RoPE against itself): no spread
        return f"{entry['values'][0]:{sign}.{digits}f} in every window"
    return Estimate(entry["mean"], entry["low"], entry["high"], entry["n"]).format(digits, signed)


def summarise(texts: dict[str, dict]) -> dict[str, Any]:
    """Every number of the report: per text and method, harm and use with intervals; the verdicts of the family."""
    summary: dict[str, Any] = {"texts": {}}
    family: list[tuple[str, str, int]] = []
    for text, found in texts.items():
        settings = found["layout"]["settings"]
        cells = found["methods"]
        plain = cells.get(NONE, [])
        positive = cells.get("positive", [])
        control = {d: estimate([w[d]["use"] for w in positive if w]) for d in settings["within"]}
        positive_nll = np.mean([w[d]["control_nll"] for w in positive if w for d in settings["within"]]) \
            if any(positive) else None
        margin = use_margin(float(np.mean([c["mean"] for c in control.values() if c.get("n")]))
                            if any(c.get("n") for c in control.values()) else None)
        methods = {}
        order = [m for m in NAMES if m in cells] + sorted(m for m in cells if m not in NAMES and m != "positive")
        for method in order:
            windows = cells[method]
            entry: dict[str, Any] = {"windows": sum(w is not None for w in windows)}
            pairs = [(w, p) for w, p in zip(windows, plain + [None] * len(windows)) if w is not None and "within" in w]
            entry["within"] = estimate([w["within"] for w, _ in pairs], 0.0)
            entry["past"] = estimate([w["past"] for w, _ in pairs], 0.0)
            entry["cost_within"] = estimate([w["within"] - p["within"] for w, p in pairs if p])
            entry["penalty"] = estimate([w["past"] - p["within"] for w, p in pairs if p])
            for d in settings["distances"]:
                entry[d] = {kind: estimate([w[d][kind] for w in windows if w]) for kind in KINDS}
                entry[d]["control_nll"] = float(np.mean([w[d]["control_nll"] for w in windows if w])) \
                    if any(windows) else None
                family.append((text, method, d))
            reaches = {w["reach"] for w in windows if w} - {None}
            entry["attention_reach"] = max(reaches) if reaches else None
            entry["seconds_all"] = {kind: [w["seconds"][kind] for w in windows if w and kind in w["seconds"]]
                                    for kind in ("natural", "probe", "control", "shuffled")}
            entry["cell_minutes"] = {i: sum(w["seconds"].values()) / 60 for i, w in enumerate(windows) if w}
            entry["dtype"] = sorted({w["dtype"] for w in windows if w})
            methods[method] = entry
        summary["texts"][text] = {"settings": settings, "starts": found["layout"]["starts"], "margin": margin,
                                  "positive": control, "positive_control_nll": positive_nll, "methods": methods}
    cells = []
    for text, method, d in family:
        use = summary["texts"][text]["methods"][method][d]["use"]
        cells.append(Cell(use["mean"], use["se"], use["n"] - 1) if "se" in use else None)
    margins = [summary["texts"][text]["margin"] for text, _, _ in family]
    # one family, each cell against its own text's margin: Holm over all, the margin per text
    verdicts = calibrated_verdicts(cells, margins)
    for (text, method, d), word, cell in zip(family, verdicts, cells):
        use = summary["texts"][text]["methods"][method][d]["use"]
        use["verdict"] = word
        use["uncorrected"] = "cannot tell" if cell is None else interval_verdict(*cell.bounds(), 0.05)
    for text, found in summary["texts"].items():
        distances = found["settings"]["distances"]
        for method, entry in found["methods"].items():
            entry["reach"] = reach_of(distances, [entry[d]["use"].get("verdict", "cannot tell") for d in distances])
    summary["family"] = len(family)
    summary["calibration"] = calibration(summary)
    summary["pairs"] = paired(texts, summary)
    summary["position"] = position_split(texts)
    return summary


def position_split(texts: dict[str, dict]) -> dict[str, Any]:
    """Distance or position? The largest distance is measured only where its second copies can lie, near the window's
    end: use at every distance split by where the second copy lies, before or from the first place a second copy of
    the largest distance lies (each window's mean over its passages in that part; intervals over the windows of
    every text together)."""
    cut = min((p[2] for found in texts.values() for window in found["layout"]["placements"] for p in window
               if p[0] == max(found["layout"]["settings"]["distances"])), default=None)
    if cut is None:
        return {}
    rows = {}
    for found in texts.values():
        for method, windows in found["methods"].items():
            if method == "positive":
                continue
            for w in windows:
                for d in found["layout"]["settings"]["distances"]:
                    if w is None:
                        continue
                    use, second = np.asarray(w[d]["passage_use"]), np.asarray(w[d]["second"])
                    parts = rows.setdefault(method, {}).setdefault(d, {"before": [], "from": []})
                    for part, chosen in (("before", second < cut), ("from", second >= cut)):
                        if chosen.any():
                            parts[part].append(float(use[chosen].mean()))
    order = [m for m in NAMES if m in rows] + sorted(m for m in rows if m not in NAMES)
    return {"cut": cut, "methods": {method: {d: {part: estimate(values) for part, values in rows[method][d].items()}
                                             for d in sorted(rows[method])}
                                    for method in order}}


def calibration(summary: dict) -> list[dict]:
    """The cells where use is impossible: past the attention's reach, or where the method has collapsed (its
    control's NLL on the second copies COLLAPSE nats above the positive control's)."""
    found = []
    for text, entry in summary["texts"].items():
        floor = entry["positive_control_nll"]
        for method, cells in entry["methods"].items():
            for d in entry["settings"]["distances"]:
                reach, control = cells["attention_reach"], cells[d]["control_nll"]
                why = None
                if reach is not None and d > reach:
                    why = f"past its attention's reach ({reach:,} tokens)"
                elif floor is not None and control is not None and control >= floor + COLLAPSE:
                    why = f"collapsed: the control's NLL on the copies {control:.2f} against {floor:.2f} within L"
                if why:
                    use = cells[d]["use"]
                    found.append({"text": text, "method": method, "distance": d, "why": why, "use": use,
                                  "verdict": use.get("verdict"), "uncorrected": use.get("uncorrected")})
    return found


def paired(texts: dict[str, dict], summary: dict) -> list[dict]:
    """PAIRED methods against each other, paired by window: use at every distance past L, and the NLL past L."""
    rows = []
    for text, found in texts.items():
        settings = found["layout"]["settings"]
        past = [d for d in settings["distances"] if d > settings["trained"]]
        cells = found["methods"]
        present = [m for m in PAIRED if m in cells]
        for i, a in enumerate(present):
            for b in present[i + 1:]:
                both = [(x, y) for x, y in zip(cells[a], cells[b]) if x and y]
                rows.append({"text": text, "a": a, "b": b, "windows": len(both),
                             "use": {d: estimate([x[d]["use"] - y[d]["use"] for x, y in both]) for d in past},
                             "past": estimate([x["past"] - y["past"] for x, y in both if "past" in x and "past" in y])})
    # the report's every paired difference is one family: two-sided t tests over windows, Holm-corrected at 5%
    family = [e for row in rows for e in (*row["use"].values(), row["past"])]
    p_values = [2 * t_sf(abs(e["mean"]) / e["se"], e["n"] - 1) if e.get("se") else None for e in family]
    for entry, separated in zip(family, holm(p_values, alpha=0.05)):
        entry["holm"] = separated
    return rows


def markdown(summary: dict, meta: dict) -> str:
    lines = [f"# {meta['title']}", "", meta["setup"], "",
             "![use against the distance between the copies, one line per method, one panel per text](use.png)", ""]
    for text, found in summary["texts"].items():
        settings, distances = found["settings"], found["settings"]["distances"]
        trained, length = settings["trained"], settings["length"]
        control = "; ".join(f"d = {d:,}: {shown(c)}" for d, c in found["positive"].items())
        lines += [f"## {text}", "",
                  f"Windows start at tokens {', '.join(f'{s:,}' for s in found['starts'])} of {settings['tokens']:,}. "
                  f"Positive control (the checkpoint as trained, windows of L = {trained:,}): use {control}; the "
                  f"margin of the verdicts: {found['margin']:.3f} nats (a tenth of the positive control's mean use, at least 0.05).", "",
                  f"| method | windows | NLL 0-L minus plain | NLL L-{length / trained:g}L | {length / trained:g}x penalty "
                  f"(NLL L-{length / trained:g}L minus plain's 0-L) | "
                  + " | ".join(f"use d = {d:,} ({d / trained:g}L)" for d in distances) + " | reach |",
                  "|---|---:|---:|---:|---:|" + "---:|" * len(distances) + "---|"]
        for method, entry in found["methods"].items():
            uses = [f"{shown(entry[d]['use'])} {entry[d]['use'].get('verdict', '')}" for d in distances]
            reach = entry["reach"]
            lines.append(f"| {name(method)} | {entry['windows']} | {shown(entry['cost_within'])} | "
                         f"{shown(entry['past'], signed=False)} | {shown(entry['penalty'])} | " + " | ".join(uses)
                         + f" | {'none' if reach is None else f'{reach:,} ({reach / trained:g}L)'} |")
        lines += ["", f"In order against present (the priming control), {text}: use = NLL(control) - NLL(probe); "
                      "presence = NLL(control) - NLL(shuffled), the first copy's tokens in context in another order; "
                      "order = NLL(shuffled) - NLL(probe), what reading them in order adds. Mean [95% t over windows].",
                  "", "| method | distance | use | presence | order |", "|---|---:|---:|---:|---:|"]
        for method, entry in found["methods"].items():
            for d in distances:
                lines.append(f"| {name(method)} | {d:,} | {shown(entry[d]['use'])} | {shown(entry[d]['presence'])} | "
                             f"{shown(entry[d]['order'])} |")
        lines.append("")
    if summary["pairs"]:
        distances = list(summary["pairs"][0]["use"])
        settings = next(iter(summary["texts"].values()))["settings"]
        lines += ["## Paired by window", "",
                  "A minus B, each window's difference, then the mean [95% t over windows]: use at each distance past "
                  f"L, and the NLL at L-{settings['length'] / settings['trained']:g}L of the natural windows (negative: "
                  "A predicts the text better). The four methods said to read the whole window, YaRN, and sinks + "
                  "window (the baseline that reads nothing past its window). \"separated\": the difference is shown "
                  "not 0 by the two-sided t test over windows, Holm-corrected over every paired difference of the "
                  "table at 5%.", "",
                  "| text | A - B | windows | " + " | ".join(f"use d = {d:,}, A minus B" for d in distances)
                  + " | NLL past L, A minus B |", "|---|---|---:|" + "---:|" * (len(distances) + 1)]
        for row in summary["pairs"]:
            lines.append(f"| {row['text']} | {name(row['a'])} - {name(row['b'])} | {row['windows']} | "
                         + " | ".join(paired_cell(row["use"][d]) for d in distances) + f" | {paired_cell(row['past'])} |")
        lines.append("")
    lines += calibration_markdown(summary)
    lines += position_markdown(summary)
    lines += texts_side_by_side(summary)
    lines += ranking_markdown(summary)
    lines += ["## Cost", "", meta["cost"], "", *cost_table(summary)]
    return "\n".join(lines)


def paired_cell(entry: dict) -> str:
    return shown(entry) + (" separated" if entry.get("holm") else "")


def position_markdown(summary: dict) -> list[str]:
    found = summary.get("position")
    if not found:
        return []
    cut, methods = found["cut"], found["methods"]
    distances = sorted({d for by_distance in methods.values() for d in by_distance})
    lines = ["## Distance or position?", "",
             f"The largest distance's second copies can only lie from token {cut:,} on, so a method that fails there may "
             "fail at the distance or at the place. Use at each distance, its passages split by where the second copy "
             f"lies: before token {cut:,} | from it (each window's mean over its passages in that part, mean [95% t "
             "over the windows of every text together]; empty where no window has such passages).", "",
             "| method | " + " | ".join(f"d = {d:,}: before \\| from" for d in distances) + " |",
             "|---|" + "---:|" * len(distances)]
    for method, by_distance in methods.items():
        cells = []
        for d in distances:
            parts = by_distance.get(d, {})
            cells.append(" \\| ".join(shown(parts[part], digits=2) if parts.get(part, {}).get("n") else "-"
                                        for part in ("before", "from")))
        lines.append(f"| {name(method)} | " + " | ".join(cells) + " |")
    return lines + [""]


def texts_side_by_side(summary: dict) -> list[str]:
    """One row per method: each quantity on every text, "first / second", mean [95% t over windows] (for more than
    one text)."""
    texts = summary["texts"]
    if len(texts) < 2:
        return []
    first = next(iter(texts.values()))["settings"]
    past = [d for d in first["distances"] if d > first["trained"]]
    methods = list(dict.fromkeys(m for found in texts.values() for m in found["methods"]))
    ratio = f"{first['length'] / first['trained']:g}x"

    def across(method: str, pick) -> str:
        return " / ".join(shown(pick(found["methods"][method])) if method in found["methods"] else "n/a"
                          for found in texts.values())

    lines = [f"## The texts side by side: {' / '.join(texts)}", "",
             "Each cell: the texts in this order, mean [95% t over windows]; use in nats, NLL differences in nats.", "",
             "| method | windows | " + " | ".join(f"use {d:,} back" for d in past) + f" | cost within L | {ratio} penalty |",
             "|---|---|" + "---:|" * (len(past) + 2)]
    for method in methods:
        windows = " / ".join(str(found["methods"][method]["windows"]) if method in found["methods"] else "0"
                             for found in texts.values())
        lines.append(f"| {name(method)} | {windows} | "
                     + " | ".join(across(method, lambda entry, d=d: entry[d]["use"]) for d in past)
                     + f" | {across(method, lambda entry: entry['cost_within'])}"
                     + f" | {across(method, lambda entry: entry['penalty'])} |")
    return lines + [""]


def ranking(summary: dict) -> list[dict]:
    """Per text, the methods by reach (farther first), then by their penalty past L (lower first)."""
    rows = []
    for text, found in summary["texts"].items():
        for method, entry in found["methods"].items():
            rows.append({"text": text, "method": method, "reach": entry["reach"], "penalty": entry["penalty"],
                         "cost_within": entry["cost_within"],
                         "farthest": entry[max(found["settings"]["distances"])]["use"]})
    return sorted(rows, key=lambda r: (r["text"], -(r["reach"] or 0), r["penalty"].get("mean", float("inf"))))


def ranking_markdown(summary: dict) -> list[str]:
    lines = ["## Harm x use", "",
             "Each text's methods by reach (the largest distance at which it and every nearer one read 'uses'), "
             "then by the penalty past L (lower first); every number with its interval over windows. Adjacent "
             "methods are ordered only where the paired comparisons above (or their intervals) separate them.", "",
             "| text | method | reach | use at the largest distance | penalty past L | cost within L |",
             "|---|---|---|---:|---:|---:|"]
    for row in ranking(summary):
        reach = "none" if row["reach"] is None else f"{row['reach']:,}"
        lines.append(f"| {row['text']} | {name(row['method'])} | {reach} | {shown(row['farthest'])} | "
                     f"{shown(row['penalty'])} | {shown(row['cost_within'])} |")
    return lines + [""]


def cost_table(summary: dict) -> list[str]:
    """Seconds per forward, the median over a method's windows and texts, and a cell's four forwards together."""
    seconds: dict[str, dict[str, list[float]]] = {}
    for found in summary["texts"].values():
        for method, entry in found["methods"].items():
            for kind, values in entry["seconds_all"].items():
                seconds.setdefault(method, {}).setdefault(kind, []).extend(values)
    kinds = ("natural", "probe", "control", "shuffled")
    lines = ["Seconds per forward (median over the cells; one thread, the CPU shared by the grid's processes):", "",
             "| method | " + " | ".join(kinds) + " | cell (four forwards) | cells |", "|---|" + "---:|" * 6]
    for method, by_kind in seconds.items():
        medians = [float(np.median(by_kind[k])) if by_kind.get(k) else None for k in kinds]
        lines.append(f"| {name(method)} | " + " | ".join("" if m is None else f"{m:.0f}" for m in medians)
                     + f" | {sum(m for m in medians if m is not None):.0f} | {len(by_kind.get('probe', []))} |")
    lines.append("")
    for text, found in summary["texts"].items():
        count = found["settings"]["windows"]
        lines += [f"Minutes per cell (its four forwards), {text}, by window:", "",
                  "| method | " + " | ".join(f"w{w}" for w in range(count)) + " |", "|---|" + "---:|" * count]
        for method, entry in found["methods"].items():
            minutes = entry["cell_minutes"]
            lines.append(f"| {name(method)} | " + " | ".join(f"{minutes[w]:.1f}" if w in minutes else ""
                                                               for w in range(count)) + " |")
        lines.append("")
    return lines


def calibration_markdown(summary: dict) -> list[str]:
    rows = summary["calibration"]
    if not rows:
        return []
    uses = sum(row["verdict"] == "uses" for row in rows)
    before = sum(row["uncorrected"] == "uses" for row in rows)
    lines = ["## Calibration: cells where use is impossible", "",
             f"{len(rows)} cells where the method cannot read the first copy; **{uses} read \"uses\"** under the "
             f"calibrated rule (Holm over the report's {summary['family']} use cells, mean at least the margin), "
             f"against {before} under the former rule (the 95% interval above 0 and not within +-0.05).", "",
             "| text | method | distance | why impossible | use | verdict | former rule |", "|---|---|---:|---|---:|---|---|"]
    for row in rows:
        lines.append(f"| {row['text']} | {name(row['method'])} | {row['distance']:,} | {row['why']} | "
                     f"{shown(row['use'])} | {row['verdict']} | {row['uncorrected']} |")
    return lines + [""]


def plot(summary: dict, path: Path) -> Path:
    """Use against the distance between the copies, one panel per text, one line per method (mean over windows with
    its 95% t interval where there is one); the dotted band: the text's margin."""
    texts = summary["texts"]
    figure, axes = figures.new(columns=len(texts), width=6.0 * len(texts), height=4.6)
    axes = np.atleast_1d(axes)
    for axis, (text, found) in zip(axes, texts.items()):
        distances = found["settings"]["distances"]
        for method, entry in found["methods"].items():
            cells = [entry[d]["use"] for d in distances]
            means = [c.get("mean", np.nan) for c in cells]
            errors = [[c["mean"] - c["low"] for c in cells], [c["high"] - c["mean"] for c in cells]] \
                if all("low" in c for c in cells) else None
            axis.errorbar(distances, means, yerr=errors, marker="o", markersize=3, capsize=2, linewidth=1.2,
                          color=figures.method_colour(method), label=name(method))
        axis.axhspan(-found["margin"], found["margin"], color="grey", alpha=0.15, linewidth=0,
                     label=f"within the margin (+-{found['margin']:.2f})")
        axis.axvline(found["settings"]["trained"], color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel("distance between the copies (tokens; dotted: L)")
        axis.set_ylabel("use: NLL(control) - NLL(probe), nats")
        counts = [entry["windows"] for entry in found["methods"].values()]
        axis.set_title(f"{text}: {min(counts)}-{max(counts)} windows per method" if min(counts) != max(counts)
                       else f"{text}: {max(counts)} windows per method")
        axis.grid(True, alpha=0.3)
    return figures.save(figure, path, axes[-1])


def write_report(out: Path, checkpoint: str | Path) -> dict:
    texts = load_cells(out)
    if not texts:
        return {}
    summary = summarise(texts)
    invocations_path = out / "cache" / "invocations.json"
    invocations = json.loads(invocations_path.read_text()) if invocations_path.exists() else []
    first = next(iter(summary["texts"].values()))["settings"]
    meta = {"title": f"Harm and use by window: inference-time methods on {Path(checkpoint).name} at "
                     f"{first['length'] / first['trained']:g}x",
            "setup": (f"Checkpoint `{Path(checkpoint).name}` (L = {first['trained']:,}); windows of T = "
                      f"{first['length']:,} tokens, {first['windows']} per text, spread with equal gaps; in each, "
                      f"its own draw of {first['passages']} passages of {first['span']} tokens per distance, second "
                      f"copies at random places past L; four forwards per (window, method): natural, probe, control, "
                      "shuffled (experiments/method_grid.py). Intervals: Student's t 95% over windows; verdicts "
                      "calibrated (experiments/method_grid_report.py)."),
            "cost": (f"Machine: {machine()}. Invocations on this cache (single-thread processes, at most one per core; processes on one text share its cells):"
                     "\n\n" + "\n".join(f"- `{portable_command(item['command'])}`: "
                                        + (f"{item['cells']} cells, " if "cells" in item else "")
                                        + f"{item['minutes']:.1f} min, last recorded at {item['ended']}"
                                        + (f" ({item['machine']})" if "machine" in item else "")
                                        for item in invocations))}
    results = {"meta": meta, "summary": summary}
    (out / "results.json").write_text(results_json(results))
    (out / "report.md").write_text(markdown(summary, meta))
    plot(summary, out / "use.png")
    return results
