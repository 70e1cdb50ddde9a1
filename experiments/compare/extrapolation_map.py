"""The extrapolation map: what an encoding costs beyond L on text (harm) against whether it uses what lies beyond L
(use), each against the same model's own L-window.

    harm   the text penalty at the longest length: loss of tokens past L less their loss under an L-token window
           (95% t over seeds and windows); 0 is "as good as a window of L", which a model that ignores all past L
           also scores
    use    exact match on a retrieval task (compare.tasks: mqar, niah_multikey) whose answers lie USE_DISTANCE
           before their queries in inputs of USE_LENGTH, against the same weights with attention limited to the last
           L keys (the window control): the difference paired by seed says whether the model uses what lies past L

Words, the same in the report, the map and the docs: an encoding "extrapolates" where it beats its window control on
a retrieval task (the difference excludes 0) and is flat on text (penalty within the 0.01-nat band, or below 0);
"window-like" where it is flat on text but beats its window on no retrieval task; "degrades" where its text penalty
lies above 0 and it does not beat its window; "uses the context past L but degrades on text" where both hold. With a
wide text interval, "(text within noise)" qualifies the first two.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from eval import figures
from eval.inference_methods import NONE
from eval.stats import Estimate
from eval.task_generators import TASKS
from experiments.compare.cells import cell
from experiments.compare.findings import FLAT, penalty_side
from experiments.compare.layout import task_path
from experiments.compare.results import ComparisonResults

USE_LENGTH, USE_DISTANCE = "8x", "4L"  # the grid cell of the use axis: answers 4L back in inputs of 8L
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

    @property
    def uses_far_context(self) -> bool:
        return any(d.has_interval and d.low > 0 for d in self.difference.values())

    @property
    def verdict(self) -> str:
        side = penalty_side(self.harm) if self.harm is not None else "single"
        if not self.difference:
            return "no retrieval task"
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


def map_points(results: ComparisonResults) -> list[MapPoint]:
    """One point per variant of the comparison (as trained or under a method other than the window control) that
    has a text penalty at the longest length or a retrieval grid."""
    grids = {}
    for task in retrieval_tasks(results):
        path = task_path(results.out, task)
        if path.exists():
            grids[task] = json.loads(path.read_text()).get("grid", {})
    longest, points = results.longest, []
    for name, variant in results.variants.items():
        if CONTROL in variant.method.split("+"):
            continue
        point = MapPoint(name, variant.encoding, variant.method, variant.penalty_estimate(longest))
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
        if point.harm is not None or point.use:
            points.append(point)
    return points


def plot_map(points: list[MapPoint], tasks: list[str], longest_multiple: float, path: Path) -> Path | None:
    """One panel per retrieval task: harm (x) against use (y), interval bars both ways, one colour per encoding and
    one marker style per method; the grey band: the window controls' intervals; the dotted band: flat on text."""
    shown = [task for task in tasks if any(task in p.use for p in points)]
    if not shown:
        return None
    figure, axes = figures.new(columns=len(shown), width=5.2 * len(shown) + 1.8, height=4.6)
    axes = list(axes) if len(shown) > 1 else [axes]
    for axis, task in zip(axes, shown):
        anchors = []
        controls = [p.control[task] for p in points if task in p.control and p.control[task].has_interval]
        if controls:
            axis.axhspan(max(0.0, min(c.low for c in controls)), max(c.high for c in controls), color="tab:blue",
                         alpha=0.15, linewidth=0, label="window controls (95% t)")
        axis.axvspan(-FLAT, FLAT, color="grey", alpha=0.12, linewidth=0, hatch="..", label="flat on text (±0.01)")
        for point in points:
            use, harm = point.use.get(task), point.harm
            if use is None or harm is None:
                continue
            style = figures.style(point.encoding, point.method)
            xerr = [[harm.mean - harm.low], [harm.high - harm.mean]] if harm.has_interval else None
            yerr = [[use.mean - max(0.0, use.low)], [min(1.0, use.high) - use.mean]] if use.has_interval else None
            axis.errorbar(harm.mean, use.mean, xerr=xerr, yerr=yerr, color=style["color"], marker=style["marker"],
                          markersize=6, capsize=2, linewidth=1, linestyle="none",
                          markerfacecolor="white" if point.method != NONE else style["color"], label=point.label)
            anchors.append((harm.mean, use.mean, point.label))
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_ylim(-0.03, 1.03)
        axis.set_xlabel(f"harm: text penalty at {longest_multiple:g}x (nats)")
        axis.set_title(f"{task}: answers {USE_DISTANCE} back in {USE_LENGTH} L", fontsize=9)
        axis.grid(True, alpha=0.3)
        figures.place_labels(axis, anchors)
    axes[0].set_ylabel("use: exact match past L (95% t over seeds)")
    return figures.save(figure, path, axes[-1])


def map_table(points: list[MapPoint], tasks: list[str], longest_multiple: float) -> list[str]:
    columns = [f"text penalty at {longest_multiple:g}x", "text: full - window"]
    for task in tasks:
        columns += [f"{task}: model", f"{task}: window control", f"{task}: model - control (paired)"]
    lines = ["| variant | " + " | ".join(columns) + " | reading |", "|---|" + "---:|" * len(columns) + "---|"]
    for point in points:
        cells = [cell(point.harm, 3, signed=True), cell(point.text_window, 3, signed=True)]
        for task in tasks:
            cells += [cell(point.use.get(task)), cell(point.control.get(task)),
                      cell(point.difference.get(task), signed=True)]
        lines.append(f"| {point.label} | " + " | ".join(cells) + f" | {point.verdict} |")
    return lines


def map_findings(points: list[MapPoint]) -> list[str]:
    """The variants by reading, in the map's words."""
    if not any(p.difference for p in points):
        return []
    groups: dict[str, list[str]] = {}
    for point in points:
        groups.setdefault(point.verdict, []).append(point.label)
    order = ["extrapolates", "extrapolates (text within noise)", "uses the context past L but degrades on text",
             "window-like", "window-like (text within noise)", "degrades"]
    shown = [f"{reading}: {', '.join(groups[reading])}" for reading in order if reading in groups]
    shown += [f"{reading}: {', '.join(labels)}" for reading, labels in groups.items() if reading not in order]
    return ["- The extrapolation map, each variant against its own window control (retrieval answers "
            f"{USE_DISTANCE} back in inputs of {USE_LENGTH} L; text penalty at the longest length): " + "; ".join(shown)
            + ". 'Extrapolates' needs both: no harm on text and a retrieval score above the same weights' window "
            "control, paired by seed."]


def map_section(results: ComparisonResults) -> list[str]:
    """The report's map section (figure, table, readings), or nothing without a retrieval task in compare.tasks."""
    tasks = retrieval_tasks(results)
    if not tasks:
        return []
    points = map_points(results)
    longest_multiple = results.longest / results.trained
    figure = plot_map(points, tasks, longest_multiple, results.out / "map.png")
    if figure is None:
        return []
    return ["### The extrapolation map: harm against use", "",
            "Harm (x): the text penalty at the longest length, loss past L less the same tokens' loss under an "
            "L-token window; 0 is what a model that ignores everything past L also scores. Use (y): exact match on "
            f"a retrieval task whose answers lie {USE_DISTANCE} before their queries in inputs of {USE_LENGTH} the "
            "task's L, beside the same weights with attention limited to the last L keys (the window control, grey "
            "band). An encoding extrapolates only where its retrieval beats its window control (the paired "
            "difference excludes 0) while it stays flat on text; flat on text without that is window-like. "
            "Stacked layers let the window control reach n_layers x (L - 1) tokens back through relays, less "
            "than the use distance here.", "",
            "![the extrapolation map](map.png)", "", *map_table(points, tasks, longest_multiple), "",
            *map_findings(points), ""]
