"""The use grid's report from its records: harm and use per text and method with intervals over windows, calibrated
verdicts, the priming control, paired comparisons, the cells where use is impossible, distance or position, the texts
side by side, the ranking and the cost; report.md and use.png (experiments/render.py writes them).

Verdicts (eval/verdicts.py use_verdicts): every use cell of the report is one family; "uses" needs a one-sided t
test over windows, Holm-corrected over the family, to show use above the margin, a tenth of the text's positive
control (use_margin, its standard error carried); beside them, the same rule against a fixed 0.05. Reach: the largest
distance at which it and every nearer one read "uses" (reach_of). Impossible cells (impossible_use): past the layers'
relay reach plus a passage.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from eval import figures
from eval.stats import Estimate
from eval.use import GRID_FORWARDS, GRID_KINDS, GRID_POSITIVE, grid_entry, summarise_grid
from experiments.engine import Records
from experiments.render import bars, cell, header, panels, provenance, write
from experiments.use_transfer import layers_lines, section

NAMES = {"none": "plain RoPE", "linear": "PI (linear)", "ntk": "NTK", "dynamic": "dynamic NTK", "yarn": "YaRN",
         "selfextend": "SelfExtend", "rerope": "ReRoPE", "string": "STRING", "dca": "DCA", "sinks": "sinks + window",
         "logn": "log-n"}


def name(method: str) -> str:
    return NAMES.get(method, method)


def ordered(methods) -> list[str]:
    return [m for m in NAMES if m in methods] + sorted(m for m in methods if m not in NAMES and m != GRID_POSITIVE)


def load(records: Records) -> dict[str, dict]:
    """text -> what eval.use.summarise_grid reads: its facts (from the cells: window starts and placements, L, T, the
    distances) and per method (in NAMES' order) its windows' entries (None: no record yet)."""
    texts: dict[str, dict] = {}
    for c in records.cells:
        found = texts.setdefault(c["text"], {"starts": {}, "placements": {}, "methods": {}, "tokens": c["tokens"],
                                             "trained": c["trained"], "span": c["span"]})
        found["starts"][c["window"]] = c["start"]
        if c["method"] == GRID_POSITIVE:
            found["within"] = sorted({p[0] for p in c["placements"]})
        else:
            found["placements"][c["window"]], found["length"] = c["placements"], c["length"]
            found["distances"] = sorted({p[0] for p in c["placements"]})
    done = records.done()
    for text, found in texts.items():
        methods = {c["method"] for c, _ in done if c["text"] == text}
        found["methods"] = {m: [None] * len(found["starts"]) for m in [GRID_POSITIVE, *ordered(methods)] if m in methods}
    for c, record in done:
        found = texts[c["text"]]
        found["methods"][c["method"]][c["window"]] = grid_entry(
            record, c["placements"], found["within" if c["method"] == GRID_POSITIVE else "distances"])
    return dict(sorted(texts.items()))


def shown(entry: dict, signed: bool = True, digits: int = 3) -> str:
    """'mean [low, high]', or the values themselves with no interval below MIN_WINDOWS windows."""
    sign = "+" if signed else ""
    if not entry.get("n"):
        return "n/a"
    if "low" not in entry:
        return ", ".join(f"{v:{sign}.{digits}f}" for v in entry["values"]) + (
            f" ({entry['n']} window{'s' * (entry['n'] > 1)}: no interval)")
    if len(set(entry["values"])) == 1:  # the same value in every window (plain RoPE against itself): no spread
        return f"{entry['values'][0]:{sign}.{digits}f} in every window"
    return cell(Estimate(entry["mean"], entry["low"], entry["high"], entry["n"]), digits, signed)


def text_lines(text: str, found: dict) -> list[str]:
    """A text's table of harm and use per method, then its priming control."""
    distances, trained, ratio = found["distances"], found["trained"], f"{found['length'] / found['trained']:g}"
    control = "; ".join(f"d = {d:,}: {shown(c)}" for d, c in found["positive"].items())
    lines = [f"## {text}", "", f"Windows start at tokens {', '.join(f'{s:,}' for s in found['starts'].values())} of "
             f"{found['tokens']:,}. Positive control (the checkpoint as trained, windows of L = {trained:,}): use "
             f"{control}; the margin of the verdicts: {found['margin']:.3f} nats, standard error "
             f"{found['margin_se']:.3f} (a tenth of the positive control's mean use, at least 0.05; its error carried "
             "into the tests).", "",
             f"| method | windows | NLL 0-L minus plain | NLL L-{ratio}L | {ratio}x penalty (NLL L-{ratio}L minus "
             "plain's 0-L) | " + " | ".join(f"use d = {d:,} ({d / trained:g}L)" for d in distances) + " | reach |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(distances) + "---|"]
    for method, entry in found["methods"].items():
        reach = "none" if entry["reach"] is None else f"{entry['reach']:,} ({entry['reach'] / trained:g}L)"
        lines.append(f"| {name(method)} | {entry['windows']} | {shown(entry['cost_within'])} | "
                     f"{shown(entry['past'], signed=False)} | {shown(entry['penalty'])} | "
                     + " | ".join(f"{shown(entry[d]['use'])} {entry[d]['use']['verdict']}" for d in distances)
                     + f" | {reach} |")
    lines += ["", f"In order against present (the priming control), {text}: use = NLL(control) - NLL(probe); "
              "presence = NLL(control) - NLL(shuffled), the first copy's tokens in context in another order; order = "
              "NLL(shuffled) - NLL(probe), what reading them in order adds. Mean [95% t over windows].", "",
              "| method | distance | use | presence | order |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {name(method)} | {d:,} | " + " | ".join(shown(entry[d][kind]) for kind in GRID_KINDS) + " |"
              for method, entry in found["methods"].items() for d in distances]
    return lines + [""]


def paired_lines(summary: dict) -> list[str]:
    if not summary["pairs"]:
        return []
    distances, first = list(summary["pairs"][0]["use"]), next(iter(summary["texts"].values()))

    def with_word(entry: dict) -> str:
        return shown(entry) + (" separated" if entry.get("holm") else "")

    return ["## Paired by window", "", "A minus B, each window's difference, then the mean [95% t over windows]: use at "
            f"each distance past L, and the NLL at L-{first['length'] / first['trained']:g}L of the natural windows "
            "(negative: A predicts the text better). The four methods said to read the whole window, YaRN, and sinks "
            "+ window (the baseline that reads nothing past its window). \"separated\": the difference is shown not 0 "
            "by the two-sided t test over windows, Holm-corrected over every paired difference of the table at 5%.", "",
            "| text | A - B | windows | " + " | ".join(f"use d = {d:,}, A minus B" for d in distances)
            + " | NLL past L, A minus B |", "|---|---|---:|" + "---:|" * (len(distances) + 1),
            *[f"| {row['text']} | {name(row['a'])} - {name(row['b'])} | {row['windows']} | "
              + " | ".join(with_word(row["use"][d]) for d in distances) + f" | {with_word(row['past'])} |"
              for row in summary["pairs"]], ""]


def calibration_lines(summary: dict) -> list[str]:
    """The verdicts against a margin fixed before the data (the floor) beside the text's own, and the cells where use
    is impossible by construction (past the layers' relay reach), with their verdicts."""
    cells = [(text, method, d, entry[d]["use"]) for text, found in summary["texts"].items()
             for method, entry in found["methods"].items() for d in found["distances"]]
    changed = [c for c in cells if c[3].get("verdict") != c[3].get("fixed_margin")]
    lines = ["## The margin: the verdicts against a fixed 0.05 nats", "",
             f"The same rule over the same family of {summary['family']} cells, against a margin fixed before the data "
             f"(0.05 nats, the floor) instead of each text's own: {len(changed)} of {len(cells)} verdicts change."]
    if changed:
        lines += ["", "| text | method | distance | use | verdict, the text's margin | verdict, 0.05 |",
                  "|---|---|---:|---:|---|---|",
                  *[f"| {text} | {name(method)} | {d:,} | {shown(use)} | {use['verdict']} | {use['fixed_margin']} |"
                    for text, method, d, use in changed]]
    rows = summary["impossible"]
    lines += ["", "## Cells where use is impossible by construction", ""]
    if not rows:
        return lines + ["None: every method here either sees every key or relays its window through its layers "
                        "past the farthest distance (eval/verdicts.py impossible_use). The rule's false-positive rate "
                        "is measured on true nulls instead (experiments/use_null.py).", ""]
    uses = sum(row["use"]["verdict"] == "uses" for row in rows)
    return lines + [f"{len(rows)} cells past the relay reach plus a passage; **{uses} read \"uses\"**.", "",
                    "| text | method | distance | why impossible | use | verdict |", "|---|---|---:|---|---:|---|",
                    *[f"| {row['text']} | {name(row['method'])} | {row['distance']:,} | {row['why']} | "
                      f"{shown(row['use'])} | {row['use']['verdict']} |" for row in rows], ""]


def position_lines(summary: dict) -> list[str]:
    if not summary["position"]:
        return []
    cut, methods = summary["position"]["cut"], summary["position"]["methods"]
    distances = sorted({d for by_distance in methods.values() for d in by_distance})
    return ["## Distance or position?", "",
            f"The largest distance's second copies can only lie from token {cut:,} on, so a method that fails there "
            "may fail at the distance or at the place. Use at each distance, its passages split by where the second "
            f"copy lies: before token {cut:,} | from it (each window's mean over its passages in that part, mean [95% "
            "t over the windows of every text together]; empty where no window has such passages).", "",
            "| method | " + " | ".join(f"d = {d:,}: before \\| from" for d in distances) + " |",
            "|---|" + "---:|" * len(distances),
            *[f"| {name(method)} | " + " | ".join(" \\| ".join(
                shown(by[d][part], digits=2) if by.get(d, {}).get(part, {}).get("n") else "-"
                for part in ("before", "from")) for d in distances) + " |" for method, by in methods.items()], ""]


def side_by_side_lines(summary: dict) -> list[str]:
    """One row per method: each quantity on every text, "first / second", mean [95% t over windows]."""
    texts = summary["texts"]
    if len(texts) < 2:
        return []
    first = next(iter(texts.values()))
    past = [d for d in first["distances"] if d > first["trained"]]

    def across(method: str, pick) -> str:
        return " / ".join(shown(pick(found["methods"][method])) if method in found["methods"] else "n/a"
                          for found in texts.values())

    lines = [f"## The texts side by side: {' / '.join(texts)}", "",
             "Each cell: the texts in this order, mean [95% t over windows]; use in nats, NLL differences in nats.", "",
             "| method | windows | " + " | ".join(f"use {d:,} back" for d in past) + " | cost within L | "
             f"{first['length'] / first['trained']:g}x penalty |", "|---|---|" + "---:|" * (len(past) + 2)]
    for method in dict.fromkeys(m for found in texts.values() for m in found["methods"]):
        windows = " / ".join(str(found["methods"][method]["windows"]) if method in found["methods"] else "0"
                             for found in texts.values())
        lines.append(f"| {name(method)} | {windows} | " + " | ".join(across(method, lambda e, d=d: e[d]["use"])
                                                                     for d in past)
                     + f" | {across(method, lambda e: e['cost_within'])} | {across(method, lambda e: e['penalty'])} |")
    return lines + [""]


def ranking_lines(summary: dict) -> list[str]:
    """Per text, the methods by reach (farther first), then by their penalty past L (lower first)."""
    rows = sorted(((text, method, entry, entry[max(found["distances"])]["use"])
                   for text, found in summary["texts"].items() for method, entry in found["methods"].items()),
                  key=lambda r: (r[0], -(r[2]["reach"] or 0), r[2]["penalty"].get("mean", float("inf"))))
    return ["## Harm x use", "", "Each text's methods by reach (the largest distance at which it and every nearer one "
            "read 'uses'), then by the penalty past L (lower first); every number with its interval over windows. "
            "Adjacent methods are ordered only where the paired comparisons above (or their intervals) separate "
            "them.", "", "| text | method | reach | use at the largest distance | penalty past L | cost within L |",
            "|---|---|---|---:|---:|---:|",
            *[f"| {text} | {name(method)} | {'none' if e['reach'] is None else format(e['reach'], ',')} | "
              f"{shown(farthest)} | {shown(e['penalty'])} | {shown(e['cost_within'])} |"
              for text, method, e, farthest in rows], ""]


def cost_lines(summary: dict, records: Records) -> list[str]:
    """The invocations, seconds per forward (the median over a method's cells) and minutes per cell by window."""
    lines = ["## Cost", "", provenance(records.invocations, [records.seconds(c) for c, _ in records.done()]), "",
             *[f"- `{item['command']}`: {item.get('measured', 0)} cells, {item['wall_s'] / 60:.1f} min, finished "
               f"{item['finished']} ({item['machine']})" for item in records.invocations], "",
             "Seconds per forward (median over the cells):", "", *header("method", [*GRID_FORWARDS, "cell (four forwards)",
                                                                                   "cells"])]
    seconds: dict[str, dict[str, list[float]]] = {}
    for found in summary["texts"].values():
        for method, entry in found["methods"].items():
            for kind, values in entry["seconds"].items():
                seconds.setdefault(method, {}).setdefault(kind, []).extend(values)
    for method, by_kind in seconds.items():
        medians = [float(np.median(by_kind[k])) if by_kind.get(k) else None for k in GRID_FORWARDS]
        lines.append(f"| {name(method)} | " + " | ".join("" if m is None else f"{m:.0f}" for m in medians)
                     + f" | {sum(m for m in medians if m is not None):.0f} | {len(by_kind.get('probe', []))} |")
    for text, found in summary["texts"].items():
        count = len(found["starts"])
        lines += ["", f"Minutes per cell (its four forwards), {text}, by window:", "",
                  *header("method", [f"w{w}" for w in range(count)])]
        lines += [f"| {name(method)} | " + " | ".join(f"{entry['cell_minutes'][w]:.1f}" if w in entry["cell_minutes"]
                                                      else "" for w in range(count)) + " |"
                  for method, entry in found["methods"].items()]
    return lines + [""]


def plot(summary: dict, path: Path) -> None:
    """Use against the distance between the copies, one panel per text, one line per method (mean over windows with
    its 95% t interval where there is one); the grey band: the text's margin; dotted: L; the legend beside the last."""
    figure, axes = panels(len(summary["texts"]))
    for axis, (text, found) in zip(axes, summary["texts"].items()):
        for method, entry in found["methods"].items():
            points = [(d, Estimate(u["mean"], u.get("low"), u.get("high"), u["n"])) for d in found["distances"]
                      if (u := entry[d]["use"]).get("n")]
            bars(axis, [(name(method), {"marker": "o", "color": figures.method_colour(method)}, points)])
        axis.axhspan(-found["margin"], found["margin"], color="grey", alpha=0.15, linewidth=0,
                     label=f"within the margin (+-{found['margin']:.2f})")
        axis.axvline(found["trained"], color="grey", linestyle=":", linewidth=1)
        axis.grid(True, alpha=0.3)
        counts = [entry["windows"] for entry in found["methods"].values()] or [0]  # a study stopped early: none yet
        axis.set_title(f"{text}: {min(counts)}-{max(counts)} windows per method" if min(counts) != max(counts)
                       else f"{text}: {max(counts)} windows per method", fontsize=10)
        axis.set_xlabel("distance between the copies (tokens; dotted: L)")
    axes[0].set_ylabel("use: NLL(control) - NLL(probe), nats")
    figures.save(figure, path, axes[-1])


def precision(records: Records) -> str:
    """Which precision the cells computed in, with how many cells each (autocast "auto" follows the machine); where
    they mix, the cells of each precision but the commonest are named (up to 8), so a reader sees which pairs mix."""
    cells: dict[str, list[str]] = {}
    for done, record in records.done():
        cells.setdefault(record.get("dtype", "not recorded"), []).append(done["name"])
    commonest = max(cells, key=lambda dtype: len(cells[dtype]), default=None)
    return "Precision: " + ", ".join(
        f"{dtype} in {len(names)} cell{'s' * (len(names) > 1)}"
        + (f" ({', '.join(sorted(names))})" if dtype != commonest and len(names) <= 8 else "")
        for dtype, names in sorted(cells.items())) + "."


def report(records: Records, beside: Records | None = None) -> None:
    """report.md and use.png; with `beside` (another model's use grid, use_grid's --beside) the transfer table."""
    texts = load(records)
    summary = summarise_grid(texts)
    first = next(iter(summary["texts"].values()))
    checkpoint = Path(records.settings.checkpoint).name
    lines = [f"# Harm and use by window: inference-time methods on {checkpoint} at "
             f"{first['length'] / first['trained']:g}x", "",
             f"Checkpoint `{checkpoint}` (L = {first['trained']:,}); windows of T = {first['length']:,} tokens, "
             f"{len(first['starts'])} per text, spread with equal gaps; in each, its own draw of "
             f"{records.settings.passages} passages of {first['span']} tokens per distance, second copies at random "
             "places past L; four forwards per (window, method): natural, probe, control, shuffled "
             "(experiments/use_grid.py, eval/use.py). Intervals: Student's t 95% over windows; verdicts calibrated "
             f"(experiments/use_grid_report.py, eval/verdicts.py). {precision(records)}", "",
             "![use against the distance between the copies, one line per method, one panel per text](use.png)", ""]
    for text, found in summary["texts"].items():
        lines += text_lines(text, found)
    lines += paired_lines(summary) + calibration_lines(summary) + position_lines(summary)
    lines += side_by_side_lines(summary) + ranking_lines(summary) + layers_lines(texts, shown, name)
    if beside is not None:
        other = load(beside)
        lines += section([texts, other], [summary, summarise_grid(other)],
                         (checkpoint, Path(beside.settings.checkpoint).name), str(beside.out), shown, name)
    lines += cost_lines(summary, records)
    write(records.out, "report.md", "\n".join(lines))
    plot(summary, records.out / "use.png")
