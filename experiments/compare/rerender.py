"""Re-render the interval cells of committed reports from the per-seed numbers their results files keep, without
the run folders (which hold the per-window evaluations) and without training.

    python -m experiments.compare.rerender docs/compare_quick docs/compare_gpu docs/tasks docs/compare_map/tasks

A comparison folder (results.json, table.md, report.md): each cell's perplexity and ratio to its own 1x are made
again from `ppl_per_seed` (the seeds' mean NLL is its log) by Variant.ppl and Variant.ratio, as a fresh run of the
report would make them; so are the final snapshot rows (fraction 1), which are the final models' 1x and longest
cells. The penalty, the probe and the earlier snapshots keep their numbers: results.json holds no per-seed values of
them. In table.md and report.md only the perplexity and ratio rows of those tables, the final snapshot rows, the
paired perplexity ratios of the findings (recomputed from the same per-seed NLL) and the sentence that says what
the intervals are change, and the findings' orders at the first and longest length (ranked by the new perplexity
estimates, '<' from the paired loss differences, which do not change) are made again; the findings' other words are
not derived again.

A task folder (tasks.md with TASK.json or TASK/results.json files; also a comparison's tasks/ folder): every exact
match and token accuracy over seeds is made again from its seeds' `values` by experiments.tasks.rate_record, and
tasks.md is written again by the suite's own table code, after checking that the old records give the committed
tasks.md back. A comparison's report.md that shows those tasks gets the new cells in place.

A cell whose committed text is not what the old numbers give is left alone and listed.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from commands import results_json
from eval.stats import Estimate, t_interval
from experiments.compare.cells import estimate_dict
from experiments.compare.findings import order_statement, paired_change, separated_pairs
from experiments.compare.report import PPL_NOTE
from experiments.compare.results import Variant
from experiments.tasks import DEFAULT_UNTIL, GRID_COUNT, difference_record, estimate, grid_table, rate_record, table

OLD_PPL_NOTE = re.compile(r"Each cell: mean over (\d+) seed\(s\) \[95% interval\]\. Perplexity and ratios: "
                          r"Student's t interval over seeds\. Penalty: Student's t")


def _old(saved: dict | None) -> Estimate | None:
    return None if saved is None else Estimate(saved["mean"], saved.get("low"), saved.get("high"), saved.get("n", 1))


def _text(estimate: Estimate | None, digits: int = 2) -> str:
    return "n/a" if estimate is None else estimate.format(digits)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _row(cells: list[str], indent: str = "") -> str:
    return indent + "| " + " | ".join(cells) + " |"


class Rewrites:
    """What changed and what was left alone, for the summary."""

    def __init__(self) -> None:
        self.changed: dict[str, set[str]] = {}  # old text -> the new texts it became
        self.left: list[str] = []

    def note(self, old: str, new: str) -> None:
        if old != new:
            self.changed.setdefault(old, set()).add(new)


# ------------------------------------------------------------------------------------------------- comparisons

def variants_of(record: dict) -> dict[str, Variant]:
    """label -> Variant holding each length's per-seed mean NLL (log of ppl_per_seed)."""
    variants: dict[str, Variant] = {}
    for cell in record["cells"]:
        variant = variants.setdefault(cell["label"], Variant(cell["encoding"], cell["method"], cell["label"]))
        if cell.get("ppl_per_seed"):
            variant.nll[cell["length"]] = {int(s): math.log(p) for s, p in cell["ppl_per_seed"].items()}
    return variants


def rerender_comparison(folder: Path, rewrites: Rewrites) -> None:
    path = folder / "results.json"
    text = path.read_text()
    record = json.loads(text)
    if results_json(record) != text:
        raise SystemExit(f"{path} is not as report.py writes it; not rewritten")
    lengths = record["settings"]["lengths"]
    first, longest = min(lengths), max(lengths)
    variants = variants_of(record)
    new_cells: dict[tuple[str, str, int], tuple[Estimate | None, Estimate | None]] = {}  # (table, label, length)
    for cell in record["cells"]:
        variant = variants[cell["label"]]
        ppl, ratio = variant.ppl(cell["length"]), variant.ratio(cell["length"], first)
        for key, new in (("ppl", ppl), ("ratio", ratio)):
            new_cells[(key, cell["label"], cell["length"])] = (_old(cell[key]), new)
            rewrites.note(_text(_old(cell[key])), _text(new))
            cell[key] = estimate_dict(new)
    snapshot_cells = {}
    for row in record.get("snapshots", []):
        if row["fraction"] != 1.0:
            continue
        for key, length in (("ppl_1x", first), ("ppl_longest", longest)):
            old_cell, new = new_cells.get(("ppl", row["label"], length), (None, None))
            if old_cell is None or _text(_old(row[key])) != _text(old_cell):
                rewrites.left.append(f"{path}: snapshot {row['label']} {key} is not the final cell; kept")
                continue
            snapshot_cells[(row["label"], key)] = (_old(row[key]), new)
            row[key] = estimate_dict(new)
    pairs = paired_ratio_texts(variants, lengths)
    orders = order_lines(variants, lengths, record["settings"]["trained_length"])
    for name in ("table.md", "report.md"):
        markdown = folder / name
        if markdown.exists():
            markdown.write_text(rerender_comparison_markdown(markdown.read_text(), lengths, new_cells, snapshot_cells,
                                                             pairs, orders, rewrites, f"{markdown}"))
    path.write_text(results_json(record))


def paired_ratio_texts(variants: dict[str, Variant], lengths: list[int]) -> dict[str, str]:
    """Old -> new text of every paired perplexity ratio the findings can quote (findings.paired_change, three
    digits): the t interval of exp(NLL differences) before, the exponentiated t interval of the differences now.
    A text that two pairs give differently is left out (ambiguous)."""
    found: dict[str, set[str]] = {}
    for length in lengths:
        for a in variants.values():
            for b in variants.values():
                here, there = a.nll.get(length, {}), b.nll.get(length, {})
                seeds = [s for s in here if s in there]
                if a is b or len(seeds) < 2:
                    continue
                old = t_interval([math.exp(here[s] - there[s]) for s in seeds])
                found.setdefault(old.format(3), set()).add(paired_change(a, b, length).format(3))
    return {old: next(iter(new)) for old, new in found.items() if len(new) == 1}


def order_lines(variants: dict[str, Variant], lengths: list[int], trained: int) -> dict[str, str]:
    """The findings' order lines (findings.findings: best to worst at the first and the longest length, ranked by
    the perplexity estimate, and the pairs that differ), keyed by how each line starts."""
    as_trained = {name: v for name, v in variants.items() if v.method == "none"}
    ordered = as_trained if as_trained and len(as_trained) < len(variants) else variants
    found = {}
    for length in sorted({min(lengths), max(lengths)}):
        multiple = length / trained
        statement = order_statement(ordered, length, multiple)
        if statement:
            found[f"- Perplexity at {multiple:g}x, best to worst:"] = f"- {statement}"
            pairs = separated_pairs(ordered, length)
            if pairs:
                found[f"  Pairs that differ at {multiple:g}x (better < worse):"] = (
                    f"  Pairs that differ at {multiple:g}x (better < worse): {pairs}.")
    return found


def rerender_comparison_markdown(text: str, lengths: list[int], new_cells: dict, snapshot_cells: dict,
                                 pairs: dict[str, str], orders: dict[str, str], rewrites: Rewrites,
                                 where: str) -> str:
    lines, kind, header = text.split("\n"), None, None
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            kind = ("ppl" if stripped.startswith("### Perplexity (nonoverlapping windows)") else
                    "ratio" if stripped.startswith("### Perplexity relative to the same variant at 1x") else
                    "snapshot" if stripped.startswith("### Extrapolation against training tokens") else None)
            header = None
            continue
        if not stripped.startswith("|"):
            header = None
            if OLD_PPL_NOTE.search(line):
                lines[index] = OLD_PPL_NOTE.sub(lambda m: f"Each cell: {m[1]} seed(s), estimate [95% interval]. "
                                                f"{PPL_NOTE} Penalty: Student's t", line)
            for start, new in orders.items():  # the findings' orders, made again as findings.py makes them
                if line.startswith(start):
                    lines[index] = new
            for old, new in pairs.items():  # the findings' paired ratios ("... {ratio}x")
                if f"{old}x" in lines[index]:
                    lines[index] = lines[index].replace(f"{old}x", f"{new}x")
                    rewrites.note(old, new)
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if kind in ("ppl", "ratio") and header[0] == "variant" and len(cells) == len(lengths) + 1:
            for column, length in enumerate(lengths, 1):
                old, new = new_cells.get((kind, cells[0], length), (None, None))
                if old is None and new is None:
                    continue
                if cells[column] != _text(old):
                    rewrites.left.append(f"{where}:{index + 1}: {kind} {cells[0]} at {length}: {cells[column]!r} is "
                                         f"not {_text(old)!r}; kept")
                    continue
                cells[column] = _text(new)
            lines[index] = _row(cells)
        elif kind == "snapshot" and header[:4] == ["variant", "training tokens", "ppl at 1x", "ppl at longest"]:
            if cells[1].endswith("(1)"):
                for column, key in ((2, "ppl_1x"), (3, "ppl_longest")):
                    old, new = snapshot_cells.get((cells[0], key), (None, None))
                    if old is not None and cells[column] == _text(old):
                        cells[column] = _text(new)
                lines[index] = _row(cells)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- tasks

def task_files(folder: Path) -> dict[str, Path]:
    """task -> its results file in a task folder (TASK.json, or TASK/results.json as write_suite writes it)."""
    found = {}
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*/results.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "task" in data and "results" in data:
            found[data["task"]] = path
    return found


def rerender_task_record(data: dict, mapping: dict, rewrites: Rewrites) -> dict:
    """Every rate of one task's results file made again (in place); `mapping` gets (encoding, key[, label]) ->
    (old record, new record) of exact match."""
    settings = data.get("settings") or {}
    count = settings.get("count") or 256  # the suite's and the comparison's default, which they leave unrecorded
    threshold = settings.get("until") or DEFAULT_UNTIL
    task = data["task"]
    for encoding, by_length in data["results"].items():
        for key, metrics in by_length.items():
            for metric, saved in metrics.items():
                new = rate_record(metric, saved["values"], count, threshold)
                if metric == "exact_match":
                    mapping[(task, encoding, key)] = (dict(saved), new)
                    rewrites.note(estimate(saved).format(2), estimate(new).format(2))
                metrics[metric] = new
    for encoding, grid in (data.get("grid") or {}).items():
        for key, cells in grid.items():
            for label, cell in cells.items():
                for part in ("full", "window"):
                    for metric, saved in cell[part].items():
                        new = rate_record(metric, saved["values"], min(count, GRID_COUNT), threshold)
                        if metric == "exact_match":
                            mapping[(task, encoding, key, label, part)] = (dict(saved), new)
                        cell[part][metric] = new
                for metric, saved in cell.get("difference", {}).items():
                    new = difference_record(saved["values"], cell["full"][metric], cell["window"][metric])
                    if metric == "exact_match":
                        mapping[(task, encoding, key, label, "difference")] = (dict(saved), new)
                    cell["difference"][metric] = new
    return data


def tasks_markdown(records: dict[str, dict], order: list[str]) -> str:
    """tasks.md as experiments.tasks.write_suite writes it, from the tasks' results files."""
    first = records[order[0]]
    results = {task: records[task]["results"] for task in order}
    training = {task: records[task].get("training", {}) for task in order}
    text = table(results, first["length"], first["seeds"], training)
    for task in order:
        if records[task].get("grid"):
            text += "\n".join([f"### {task}: answer distance past L", "",
                               "Each model on test sequences whose answers lie d tokens before their queries, and the "
                               f"same weights with attention limited to the last L = {first['length']} keys (its "
                               "window control). A difference whose interval excludes 0 at d > L: the model uses what "
                               "lies past L.", "", *grid_table(records[task]["grid"])]) + "\n"
    return text


def rerender_tasks(folder: Path, rewrites: Rewrites) -> dict:
    files = task_files(folder)
    markdown = folder / "tasks.md"
    committed = markdown.read_text()
    order = [task for task in re.findall(r"^\| (\w+) \| 1x", committed, re.M) if task in files]
    records = {task: json.loads(path.read_text()) for task, path in files.items()}
    if tasks_markdown(records, order) != committed:
        raise SystemExit(f"{markdown} is not what its results files give with the code that wrote it; not rewritten")
    mapping: dict = {}
    for task, path in files.items():
        rerender_task_record(records[task], mapping, rewrites)
        path.write_text(results_json(records[task]))
    markdown.write_text(tasks_markdown(records, order))
    return mapping


def rerender_task_section(path: Path, mapping: dict, rewrites: Rewrites) -> None:
    """A comparison's report.md: its task tables (### Task: NAME) with the new exact-match cells in place."""
    lines, task, header, caption = path.read_text().split("\n"), None, None, ""
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            found = re.match(r"### Task: (\w+)", stripped)
            task, header = (found[1] if found else None), None
            continue
        if not stripped.startswith("|"):
            header = None
            if stripped:
                caption = stripped
            if task and "mean [95% t interval] over seeds" in line:
                lines[index] = line.replace("mean [95% t interval] over seeds",
                                            "mean over seeds [95% interval inside 0..1: the t interval over seeds cut "
                                            "to 0..1, with the pooled Wilson interval of the sequences scored]")
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if task is None or set(cells[0]) <= set("-:"):
            continue
        grid = header[1:2] and ", d = " in header[1]
        part = "difference" if "minus" in caption else "full"
        if not grid and part == "difference":
            continue
        for column in range(1, min(len(cells), len(header))):
            if grid:
                found = re.match(r"(\w+), d = \d+ \((.+)\)", header[column])
                key = (task, cells[0], found[1], found[2], part) if found else None
            else:
                key = (task, cells[0], header[column])
            if key not in mapping:
                continue
            old, new = mapping[key]
            signed = part == "difference"
            if cells[column] != estimate(old).format(2, signed):
                rewrites.left.append(f"{path}:{index + 1}: {key}: {cells[column]!r} is not "
                                     f"{estimate(old).format(2, signed)!r}; kept")
                continue
            cells[column] = estimate(new).format(2, signed)
        lines[index] = _row(cells)
    path.write_text("\n".join(lines))


def rerender_map(folder: Path, mapping: dict, rewrites: Rewrites) -> None:
    """A comparison's extrapolation map (report.md's table and results.json's "map"): each lookup task's model,
    window control and paired difference at the map's cell, from the task records made again."""
    from experiments.compare.extrapolation_map import USE_DISTANCE, USE_LENGTH

    parts = {"model": ("full", False), "window control": ("window", False), "model - control (paired)": ("difference", True)}
    report = folder / "report.md"
    lines, header, in_map = report.read_text().split("\n"), None, False
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            in_map, header = stripped.startswith("### The extrapolation map"), None
            continue
        if not in_map or not stripped.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:  # "TASK: model" as the map named it before: "TASK exact match: model"
            header = [re.sub(r"^(\w+): (model|window control)", r"\1 exact match: \2", title) for title in cells]
            lines[index] = _row(header)
            continue
        if set(cells[0]) <= set("-:"):
            continue
        for column in range(1, min(len(cells), len(header))):
            task, _, what = header[column].partition(" exact match: ")
            key = (task, cells[0], USE_LENGTH, USE_DISTANCE, parts.get(what, (None,))[0])
            if key in mapping:
                new = estimate(mapping[key][1]).format(2, parts[what][1])
                rewrites.note(cells[column], new)
                cells[column] = new
        lines[index] = _row(cells)
    report.write_text("\n".join(lines))
    results = folder / "results.json"
    data = json.loads(results.read_text())
    for point in data.get("map") or []:
        for field, part in (("use", "full"), ("control", "window"), ("difference", "difference")):
            for task in point.get(field) or {}:
                key = (task, point["label"], USE_LENGTH, USE_DISTANCE, part)
                if key in mapping:
                    point[field][task] = {k: mapping[key][1][k] for k in ("mean", "low", "high", "n")}
    results.write_text(results_json(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.compare.rerender", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path,
                        help="comparison folders (results.json) and task folders (tasks.md); a comparison's tasks/ "
                             "folder also rewrites the comparison's report.md task section")
    args = parser.parse_args(argv)
    rewrites = Rewrites()
    for folder in args.folders:
        if (folder / "tasks.md").exists():
            mapping = rerender_tasks(folder, rewrites)
            if folder.name == "tasks" and (folder.parent / "report.md").exists():
                rerender_task_section(folder.parent / "report.md", mapping, rewrites)
                if (folder.parent / "results.json").exists():
                    rerender_map(folder.parent, mapping, rewrites)
        elif (folder / "results.json").exists():
            rerender_comparison(folder, rewrites)
        else:
            raise SystemExit(f"{folder}: neither a comparison (results.json) nor a task folder (tasks.md)")
        print(f"re-rendered {folder}")
    for line in rewrites.left:
        print(f"left: {line}")
    print(f"{len(rewrites.changed)} distinct interval texts changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
