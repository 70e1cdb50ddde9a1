"""The extrapolation map: what an encoding costs beyond L on text (harm) against whether it uses what lies beyond L
(use), on the same weights.

    harm   the text penalty at the longest length: loss of tokens past L less their loss under an L-token window
           (95% t over seeds and windows); 0 is "as good as a window of L", which a model that ignores all past L
           also scores
    use    the same text models' use of their text (experiments/compare/use.py, eval/use.py): repeated passages
           TEXT_USE_DISTANCE apart at the longest length against the control without the first copies, nats (95% t
           over seeds and windows), and how far back use holds
    lookup a second panel, named for what it is: capacity on a synthetic lookup (compare.tasks: mqar,
           niah_multikey) in separately trained task models, answers USE_DISTANCE back in inputs of USE_LENGTH,
           against the same task weights with attention limited to the last L keys

Words, the same in the report, the map and the docs: an encoding "extrapolates" where its text models use their
text past L (a one-sided test at some distance > L) and are flat on text (penalty within the 0.01-nat band, or
below 0); "window-like" where it is flat on text but shows no use past L; "degrades" where its text penalty lies
above 0 and it shows no use past L; "uses the context past L but degrades on text" where both hold. A variant whose
text models show no use even within L (the positive control) gets "no use within L: cannot tell". With a wide text
interval, "(text within noise)" qualifies the first two. Without the use probe the words come from the lookup tasks,
as the map read before it had the text models' own use.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from data.tasks import TASKS
from eval import figures
from eval.stats import Estimate
from experiments.compare.cells import cell
from experiments.compare.findings import FLAT, penalty_side
from experiments.compare.layout import task_path
from experiments.compare.results import ComparisonResults
from experiments.compare.use import UseSummary, positive_control, reads_back_words
from model.methods import NONE

USE_LENGTH, USE_DISTANCE = "8x", "4L"  # the lookup panels' grid cell: answers 4L back in inputs of 8L
TEXT_USE_DISTANCE = 4  # the text panel's y: use of passages 4L apart, in multiples of L
CONTROL = "window"  # the window method: the text's window control, and no variant of the map


@dataclass
class MapPoint:
    label: str
    encoding: str
    method: str
    harm: Estimate | None  # text penalty at the longest length
    text_window: Estimate | None = None  # text: the loss at the longest length less its window control's (paired)
    use: dict[str, Estimate] = field(default_factory=dict)  # task -> exact match at the use cell
    control: dict[str, Estimate] = field(default_factory=dict)  # task -> its window control's
    difference: dict[str, Estimate] = field(default_factory=dict)  # task -> use - control, paired by seed
    text: UseSummary | None = None  # the same text models' use of their text (experiments/compare/use.py)
    text_distance: int = 0  # the distance in tokens the text panel reads (TEXT_USE_DISTANCE x L)
    trained: int = 0  # L

    @property
    def text_use(self) -> Estimate | None:
        found = self.text.at(self.text_distance) if self.text else None
        return found[0] if found else None

    @property
    def uses_far_context(self) -> bool:
        if self.text is not None:
            return any(v == "uses" for d, v in zip(self.text.distances, self.text.verdicts) if d > self.trained)
        return any(d.has_interval and d.low > 0 for d in self.difference.values())

    @property
    def verdict(self) -> str:
        side = penalty_side(self.harm) if self.harm is not None else "single"
        if self.text is not None and positive_control(self.text, self.trained) is False:
            return "no use within L: cannot tell"
        if self.text is None and not self.difference:
            return "no use measured"
        if self.uses_far_context:
            return {"flat": "extrapolates", "below": "extrapolates", "noise": "extrapolates (text within noise)"}.get(
                side, "uses the context past L but degrades on text" if side == "above" else "uses the context "
                "past L (one seed: no text interval)")
        return {"flat": "window-like", "below": "window-like", "noise": "window-like (text within noise)",
                "above": "degrades"}.get(side, "does not beat its window (one seed: no text interval)")


def _estimate(saved: dict | None) -> Estimate | None:
    return None if saved is None else Estimate(saved["mean"], saved["low"], saved["high"], saved["n"])


def retrieval_tasks(results: ComparisonResults) -> list[str]:
    return [name for name in results.compare.tasks if TASKS[name].make_at is not None]


def map_points(results: ComparisonResults, text_use: dict[str, UseSummary] | None = None) -> list[MapPoint]:
    """One point per variant of the comparison (as trained or under a method other than the window control) that
    has a text penalty at the longest length or a retrieval grid; `text_use`: variant label -> its text models'
    use (experiments/compare/probes.py text_use)."""
    text_use = text_use or {}
    grids = {}
    for task in retrieval_tasks(results):
        path = task_path(results.out, task)
        if path.exists():
            grids[task] = json.loads(path.read_text()).get("grid", {})
    longest, points = results.longest, []
    for name, variant in results.variants.items():
        if CONTROL in variant.method.split("+"):
            continue
        point = MapPoint(name, variant.encoding, variant.method, variant.penalty_estimate(longest),
                         text=text_use.get(name), text_distance=TEXT_USE_DISTANCE * results.trained,
                         trained=results.trained)
        window = results.variants.get(name + "+" + CONTROL if variant.method != NONE else
                                      f"{variant.encoding}+{CONTROL}")
        if window is not None:
            point.text_window = variant.nll_difference(window, longest)
        for task, by_label in grids.items():
            found = by_label.get(name, {}).get(USE_LENGTH, {}).get(USE_DISTANCE)
            if found:
                point.use[task] = _estimate(found["full"]["exact_match"])
                point.control[task] = _estimate(found["window"]["exact_match"])
                point.difference[task] = _estimate(found["difference"]["exact_match"])
        if point.harm is not None or point.use or point.text is not None:
            points.append(point)
    return points


def plot_map(points: list[MapPoint], tasks: list[str], longest_multiple: float, path: Path,
             margin: float | None = None) -> Path | None:
    """The text panel first (harm (x) against the same text models' use (y), nats), then one panel per lookup task
    (harm against exact match of the separate task models); interval bars both ways, one colour per encoding and one
    marker style per method; the dotted band: flat on text; in a lookup panel, the grey band: the window controls'."""
    text = any(p.text_use is not None for p in points)
    shown = [task for task in tasks if any(task in p.use for p in points)]
    if not text and not shown:
        return None
    panels = (["text"] if text else []) + shown
    figure, axes = figures.new(columns=len(panels), width=5.2 * len(panels) + 1.8, height=4.6)
    axes = list(axes) if len(panels) > 1 else [axes]
    for axis, panel in zip(axes, panels):
        anchors = []
        if panel != "text":
            controls = [p.control[panel] for p in points if panel in p.control and p.control[panel].has_interval]
            if controls:
                axis.axhspan(max(0.0, min(c.low for c in controls)), max(c.high for c in controls), color="tab:blue",
                             alpha=0.15, linewidth=0, label="window controls (95%)")
        axis.axvspan(-FLAT, FLAT, color="grey", alpha=0.12, linewidth=0, hatch="..", label="flat on text (±0.01)")
        for point in points:
            use, harm = (point.text_use if panel == "text" else point.use.get(panel)), point.harm
            if use is None or harm is None:
                continue
            style = figures.style(point.encoding, point.method)
            xerr = [[harm.mean - harm.low], [harm.high - harm.mean]] if harm.has_interval else None
            yerr = [[use.mean - use.low], [use.high - use.mean]] if use.has_interval else None
            axis.errorbar(harm.mean, use.mean, xerr=xerr, yerr=yerr, color=style["color"], marker=style["marker"],
                          markersize=6, capsize=2, linewidth=1, linestyle="none",
                          markerfacecolor="white" if point.method != NONE else style["color"], label=point.label)
            anchors.append((harm.mean, use.mean, point.label))
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_xlabel(f"harm: text penalty at {longest_multiple:g}x (nats)")
        if panel == "text":
            axis.axhline(0, color="black", linewidth=0.8)
            if margin:
                axis.axhspan(-margin, margin, color="tab:blue", alpha=0.10, linewidth=0,
                             label=f"no use: the equivalence margin (±{margin:g} nats)")
            axis.set_ylabel(f"use of text {TEXT_USE_DISTANCE}L back, same weights (nats, 95% t)")
            axis.set_title(f"the text models: harm against use of passages {TEXT_USE_DISTANCE}L back", fontsize=9)
        else:
            axis.set_ylim(-0.03, 1.03)
            axis.set_ylabel("exact match past L, separate task models")
            axis.set_title(f"capacity on a synthetic lookup ({panel}, separate task models):\nanswers "
                           f"{USE_DISTANCE} back in {USE_LENGTH} L", fontsize=9)
        axis.grid(True, alpha=0.3)
        figures.place_labels(axis, anchors)
    return figures.save(figure, path, axes[-1])


def lookup_reading(point: MapPoint) -> str:
    """The separate task models' reading: whether they beat their window control on some lookup task."""
    if not point.difference:
        return "n/a"
    return "beats its window" if any(d.has_interval and d.low > 0 for d in point.difference.values()) else \
        "does not beat its window"


def map_table(points: list[MapPoint], tasks: list[str], longest_multiple: float) -> list[str]:
    text = any(p.text is not None for p in points)
    columns = [f"text penalty at {longest_multiple:g}x", "text: full - window"]
    if text:
        columns += [f"text use {TEXT_USE_DISTANCE}L back (nats)", "how far back (same weights)"]
    for task in tasks:
        columns += [f"{task} exact match: model", f"{task} exact match: window control",
                    f"{task} exact match: model - control (paired)"]
    if tasks:
        columns.append("lookup (separate task models)")
    lines = ["| variant | " + " | ".join(columns) + " | reading |", "|---|" + "---:|" * len(columns) + "---|"]
    for point in points:
        cells = [cell(point.harm, 3, signed=True), cell(point.text_window, 3, signed=True)]
        if text:
            cells += [cell(point.text_use, 3, signed=True),
                      reads_back_words(point.text, point.trained) if point.text else "n/a"]
        for task in tasks:
            cells += [cell(point.use.get(task)), cell(point.control.get(task)),
                      cell(point.difference.get(task), signed=True)]
        if tasks:
            cells.append(lookup_reading(point))
        lines.append(f"| {point.label} | " + " | ".join(cells) + f" | {point.verdict} |")
    return lines


def map_findings(points: list[MapPoint]) -> list[str]:
    """The variants by reading, in the map's words."""
    if not any(p.difference or p.text is not None for p in points):
        return []
    groups: dict[str, list[str]] = {}
    for point in points:
        groups.setdefault(point.verdict, []).append(point.label)
    order = ["extrapolates", "extrapolates (text within noise)", "uses the context past L but degrades on text",
             "window-like", "window-like (text within noise)", "degrades", "no use within L: cannot tell"]
    shown = [f"{reading}: {', '.join(groups[reading])}" for reading in order if reading in groups]
    shown += [f"{reading}: {', '.join(labels)}" for reading, labels in groups.items() if reading not in order]
    if any(p.text is not None for p in points):
        reach = "; ".join(f"{p.label} {reads_back_words(p.text, p.trained)}" for p in points if p.text is not None)
        return ["- The extrapolation map on the same weights (use: the text models' own repeated passages; harm: "
                "their text penalty at the longest length): " + "; ".join(shown) + ". 'Extrapolates' needs both: "
                "no harm on text and use of the text past L shown by a one-sided test. How far back each reads: "
                + reach + "."]
    return ["- The extrapolation map, each variant against its own window control (retrieval answers "
            f"{USE_DISTANCE} back in inputs of {USE_LENGTH} L; text penalty at the longest length): " + "; ".join(shown)
            + ". 'Extrapolates' needs both: no harm on text and a retrieval score above the same weights' window "
            "control, paired by seed."]


def map_section(results: ComparisonResults, text_use: dict[str, UseSummary] | None = None) -> list[str]:
    """The report's map section (figure, table, readings), or nothing without the use probe or a retrieval task."""
    tasks = retrieval_tasks(results)
    if not tasks and not text_use:
        return []
    points = map_points(results, text_use)
    longest_multiple = results.longest / results.trained
    figure = plot_map(points, tasks, longest_multiple, results.out / "map.png", results.compare.use_margin)
    if figure is None:
        return []
    text = ("Use (y, first panel): the same text models' use of passages repeated "
            f"{TEXT_USE_DISTANCE}L = {TEXT_USE_DISTANCE * results.trained:,} tokens back at the longest length "
            "(experiments/compare/use.py; the table gives how far back use holds). " if text_use else "")
    lookup = ("Lookup panels: capacity on a synthetic lookup in separately trained task models, exact match on a "
              f"retrieval task whose answers lie {USE_DISTANCE} before their queries in inputs of {USE_LENGTH} the "
              "task's L, beside the same task weights with attention limited to the last L keys (the window "
              "control, grey band); stacked layers let that control reach n_layers x (L - 1) tokens back through "
              "relays. " if tasks else "")
    return ["### The extrapolation map: harm against use", "",
            "Harm (x): the text penalty at the longest length, loss past L less the same tokens' loss under an "
            "L-token window; 0 is what a model that ignores everything past L also scores. " + text + lookup +
            "An encoding extrapolates only where it uses what lies past L while it stays flat on text; flat on text "
            "without that is window-like.", "",
            "![the extrapolation map](map.png)", "", *map_table(points, tasks, longest_multiple), "",
            *map_findings(points), ""]
