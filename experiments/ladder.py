"""The scale ladder: does what a small comparison shows still hold for a bigger or a longer-trained model?

    python -m experiments.ladder --config configs/ladder.toml
    python -m experiments.ladder --config configs/ladder.toml --rungs=d64,d128 --compare.seeds=1,2    # a part of it

One comparison (experiments.compare) per rung: every rung starts from the same preset of the compare config (data,
encodings, methods, seeds, token budget, context length L) and changes only what its line in [ladder] rungs says
(the model's size, say). Each keeps its models at fractions of training (compare.snapshots), so every rung gives
each variant's extrapolation penalty at the longest length and its perplexity at 1x at four training budgets.
Rungs run one after another, each on every worker (a rung's jobs as experiments.compare runs them); re-running resumes
(trainings and evaluations already done are reused), and the aggregate is rebuilt from whatever rungs finished.

Writes OUT/RUNG/ (each rung's own comparison report), and OUT/report.md, results.json, table.md, penalty.png and
ppl.png: one panel per rung, the penalty (or the 1x perplexity) against training tokens, one line per variant with
its 95% interval as a band. The report says, per variant, whether its penalty grows, shrinks or stays within noise
as the model trains (first kept model against the final one, at each rung) and as it grows (smallest rung against
the largest, at the full budget), and whether the order of the variants at the smallest rung is the order at the
largest.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from commands import add_out, command_parser, results_json
from errors import ConfigError, cli_command
from eval import figures
from eval.stats import Estimate
from experiments.compare.cells import cell, estimate_dict
from experiments.compare.cli import experiment_arguments, run_comparison
from experiments.compare.config import load_compare_config
from experiments.compare.findings import movement, order_chain
from experiments.compare.layout import invocations, record_invocation
from experiments.compare.plots import finish, panels
from experiments.jobs import machine_description
from experiments.seed_intervals import separated
from model.folder_lock import FolderLock


@dataclass
class LadderConfig:
    compare_config: Path  # the compare config every rung starts from (relative paths: to the ladder config's folder)
    preset: str  # the [presets.NAME] of compare_config that every rung starts from
    out: Path
    rungs: dict[str, dict]  # name -> {"section.key": value}: what makes the rung differ from the others
    every_rung: dict = field(default_factory=dict)  # {"section.key": value}: what every rung changes in the preset

    def rung_overrides(self, name: str, command_line: list[str] = ()) -> list[str]:
        """experiments.compare overrides for the rung: every_rung's settings, then the command line's, then the rung's own
        (which no other setting overrides); values written as TOML, which JSON scalars and lists are."""
        return [*(f"--{key}={json.dumps(value)}" for key, value in self.every_rung.items()), *command_line,
                *(f"--{key}={json.dumps(value)}" for key, value in self.rungs[name].items())]


def load_ladder_config(path: Path, rungs: list[str] | None = None) -> LadderConfig:
    """[ladder] of `path`: compare_config, preset, out, every_rung (section.key settings) and rungs (a list of
    inline tables, each a name and its section.key settings); `rungs` keeps only those named, in the config's
    order."""
    if not path.exists():
        raise ConfigError(f"ladder config {path} not found")
    try:
        values = tomllib.loads(path.read_text()).get("ladder")
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: invalid TOML ({error})") from error
    if not isinstance(values, dict):
        raise ConfigError(f"{path} has no [ladder] table")
    unknown = sorted(set(values) - {"compare_config", "preset", "out", "every_rung", "rungs"})
    if unknown:
        raise ConfigError(f"{path} [ladder]: unknown keys {unknown}; the keys are compare_config, preset, out, "
                          "every_rung, rungs")
    every_rung = values.get("every_rung", {})
    if not isinstance(every_rung, dict) or [k for k, v in every_rung.items() if "." not in k or isinstance(v, dict)]:
        raise ConfigError(f"{path} [ladder] every_rung: a table of \"section.key\" = value, got {every_rung!r}")
    table: dict[str, dict] = {}
    for index, rung in enumerate(values.get("rungs", [])):
        if not isinstance(rung, dict) or not isinstance(rung.get("name"), str) or not rung["name"]:
            raise ConfigError(f"{path} [ladder] rungs[{index}]: each rung is an inline table with a name, e.g. "
                              '{ name = "d64", "model.dim" = 64 }')
        settings = {key: value for key, value in rung.items() if key != "name"}
        bad = [key for key, value in settings.items() if "." not in key or isinstance(value, dict)]
        if bad:
            raise ConfigError(f"{path} [ladder] rung {rung['name']!r}: {bad} must be \"section.key\" = value "
                              "(a number, string, boolean or list)")
        if rung["name"] in table:
            raise ConfigError(f"{path} [ladder]: two rungs are named {rung['name']!r}")
        table[rung["name"]] = settings
    if len(table) < 2:
        raise ConfigError(f"{path} [ladder]: a ladder needs at least two rungs, got {list(table)}")
    if rungs:
        missing = [name for name in rungs if name not in table]
        if missing:
            raise ConfigError(f"--rungs: {missing} are not rungs of {path}; its rungs are {list(table)}")
        table = {name: settings for name, settings in table.items() if name in rungs}
    compare_config = Path(values.get("compare_config", "compare.toml"))
    if not compare_config.is_absolute():
        compare_config = path.parent / compare_config
    return LadderConfig(compare_config, str(values.get("preset", "quick")), Path(values.get("out", "runs/ladder")),
                        table, every_rung)


# ---------------------------------------------------------------------------------------------------------------
# Aggregation: every rung's results.json -> one point per (rung, variant, training budget)


@dataclass(frozen=True)
class Point:
    rung: str
    label: str  # the variant: an encoding, or encoding+method
    fraction: float  # of the rung's training steps
    tokens: int  # training tokens the model had seen
    penalty: Estimate | None  # at the longest length, nats
    ppl: Estimate | None  # at 1x


@dataclass
class Ladder:
    rungs: list[str]  # in the config's order (smallest first, by convention)
    points: list[Point]
    longest_multiple: float
    parameters: dict[str, dict[str, int]] = field(default_factory=dict)  # rung -> encoding -> parameters
    settings: dict[str, dict] = field(default_factory=dict)  # rung -> its results.json settings

    def labels(self) -> list[str]:
        return list(dict.fromkeys(point.label for point in self.points))

    def series(self, rung: str, label: str) -> list[Point]:
        return sorted((p for p in self.points if p.rung == rung and p.label == label), key=lambda p: p.fraction)

    def distinct_at_1x(self) -> list[str]:
        """The variants whose 1x perplexity is not their base model's at every rung and budget (a context-matched
        RoPE scaling is the identity at 1x, so rope+yarn repeats rope there)."""
        def values(label: str) -> list:
            return [(p.rung, p.fraction, p.ppl and p.ppl.mean) for p in self.points if p.label == label]
        return [label for label in self.labels()
                if "+" not in label or values(label) != [(r, f, m) for r, f, m in values(label.split("+")[0])]]

    def final(self, rung: str, label: str) -> Point | None:
        points = [p for p in self.series(rung, label) if math.isclose(p.fraction, 1.0)]
        return points[0] if points else None


def _estimate(value: dict | None) -> Estimate | None:
    if value is None:
        return None
    return Estimate(value["mean"], value.get("low"), value.get("high"), value.get("n", 1))


def read_rung(path: Path, rung: str) -> tuple[list[Point], dict]:
    """The rung's points from its comparison's results.json (its snapshots rows; the final model is the row at
    fraction 1), and its settings."""
    results = json.loads((path / "results.json").read_text())
    settings = results["settings"]
    per_step, max_steps = int(settings["tokens_per_step"]), int(settings["max_steps"])
    points = []
    for row in results.get("snapshots", []):
        steps = max_steps if math.isclose(row["fraction"], 1.0) else max(1, round(row["fraction"] * max_steps))
        points.append(Point(rung, row["label"], float(row["fraction"]), steps * per_step, _estimate(row["penalty"]),
                            _estimate(row["ppl_1x"])))
    return points, settings


def collect_ladder(out: Path, rungs: list[str]) -> Ladder:
    """The ladder from OUT/RUNG/results.json of every rung that has one (rungs without are left out)."""
    points, parameters, settings, longest = [], {}, {}, None
    for rung in rungs:
        if not (out / rung / "results.json").exists():
            continue
        rung_points, rung_settings = read_rung(out / rung, rung)
        points += rung_points
        parameters[rung] = rung_settings.get("parameters", {})
        settings[rung] = rung_settings
        multiple = max(rung_settings["lengths"]) / rung_settings["trained_length"]
        if longest is not None and not math.isclose(multiple, longest):
            raise ConfigError(f"{out}: the rungs evaluate different longest lengths ({longest:g}x and {multiple:g}x);"
                              " a ladder compares one length")
        longest = multiple
    present = [rung for rung in rungs if rung in settings]
    return Ladder(present, points, longest or 0.0, parameters, settings)


# ---------------------------------------------------------------------------------------------------------------
# Verdicts


def trend(first: Estimate | None, last: Estimate | None) -> str:
    """'grows' / 'shrinks' where the two intervals separate, else 'within noise' ('n/a' without both)."""
    if first is None or last is None:
        return "n/a"
    return movement(first, last, "grows", "shrinks")


def training_trends(ladder: Ladder, label: str) -> dict[str, str]:
    """rung -> how the variant's penalty moves from the first kept model to the final one."""
    trends = {}
    for rung in ladder.rungs:
        series = [p for p in ladder.series(rung, label) if p.penalty is not None]
        if len(series) >= 2:
            trends[rung] = trend(series[0].penalty, series[-1].penalty)
    return trends


def size_trend(ladder: Ladder, label: str) -> str:
    """How the variant's penalty at the full budget moves from the smallest rung to the largest."""
    first, last = ladder.final(ladder.rungs[0], label), ladder.final(ladder.rungs[-1], label)
    return trend(first and first.penalty, last and last.penalty)


def relation(a: Estimate | None, b: Estimate | None) -> str:
    """'<' or '>' where the intervals separate, '≈' where they overlap, '?' without both."""
    if a is None or b is None:
        return "?"
    if not separated(a, b):
        return "≈"
    return "<" if a.mean < b.mean else ">"


def rung_order(ladder: Ladder, rung: str) -> str:
    """The variants by their penalty at the full budget, lowest first; '<' where neighbours separate, else '≈'."""
    return order_chain([(p.penalty, label) for label in ladder.labels()
                        if (p := ladder.final(rung, label)) is not None and p.penalty is not None], "+.3f") or "n/a"


def ordering_comparison(ladder: Ladder) -> dict[str, list[str]]:
    """Every pair of variants, by its penalty at the full budget at the smallest and the largest rung: 'same' (the
    same separated order at both), 'reversed' (separated in opposite directions), 'only_small' / 'only_large'
    (separated at one rung, within noise at the other), 'neither' (within noise at both)."""
    small, large = ladder.rungs[0], ladder.rungs[-1]
    labels = ladder.labels()
    kinds: dict[str, list[str]] = {"same": [], "reversed": [], "only_small": [], "only_large": [], "neither": []}
    for index, a in enumerate(labels):
        for b in labels[index + 1:]:
            estimates = [(ladder.final(rung, a), ladder.final(rung, b)) for rung in (small, large)]
            if any(x is None or y is None for x, y in estimates):
                continue
            here, there = (relation(x.penalty, y.penalty) for x, y in estimates)
            if "?" in (here, there):
                continue
            pair = f"{a} {here} {b}" if here != "≈" else f"{a} {there} {b}"
            if here == there == "≈":
                kinds["neither"].append(f"{a} ≈ {b}")
            elif here == there:
                kinds["same"].append(pair)
            elif "≈" not in (here, there):
                kinds["reversed"].append(f"{a} {here} {b} at {small}, {a} {there} {b} at {large}")
            else:
                kinds["only_small" if there == "≈" else "only_large"].append(pair)
    return kinds


def ordering_verdict(kinds: dict[str, list[str]]) -> str:
    if not (kinds["same"] or kinds["reversed"] or kinds["only_small"] or kinds["only_large"]):
        return "not told apart: no pair separates at either rung"
    if kinds["reversed"]:
        return "differs: a pair separated at both rungs is in opposite orders"
    if kinds["only_small"] or kinds["only_large"]:
        return ("no pair reverses, but some pairs separate at one rung only (the orders agree where both rungs "
                "tell them apart)")
    return "the same: every pair separated at one rung is separated the same way at the other"


def findings(ladder: Ladder) -> list[str]:
    if len(ladder.rungs) < 1:
        return ["- No rung has finished; nothing to report yet."]
    lines = [f"- **With training** (penalty at {ladder.longest_multiple:g}x, the first kept model against the final "
             "one, at each rung) and **with size** (the final models, smallest rung against the largest):", ""]
    for label in ladder.labels():
        trends = training_trends(ladder, label)
        words = set(trends.values())
        trained = (f"{words.pop()} at every rung" if len(words) == 1 and len(trends) == len(ladder.rungs)
                   else ", ".join(f"{word} ({rung})" for rung, word in trends.items()) or "n/a")
        first = ladder.final(ladder.rungs[0], label)
        last = ladder.final(ladder.rungs[-1], label)
        values = " -> ".join(f"{p.penalty.mean:+.3f}" for p in (first, last) if p is not None and p.penalty)
        size = size_trend(ladder, label) if len(ladder.rungs) > 1 else "n/a (one rung)"
        lines.append(f"  - {label}: with training {trained}; with size {size} ({values} nats, "
                     f"{ladder.rungs[0]} -> {ladder.rungs[-1]})")
    if len(ladder.rungs) > 1:
        kinds = ordering_comparison(ladder)
        lines += ["", f"- **Order of the variants by their {ladder.longest_multiple:g}x penalty** at the full budget "
                  f"('<' where the 95% intervals separate): {ladder.rungs[0]}: {rung_order(ladder, ladder.rungs[0])};"
                  f" {ladder.rungs[-1]}: {rung_order(ladder, ladder.rungs[-1])}. Between the smallest and the largest"
                  f" rung: {ordering_verdict(kinds)}."]
        for key, text in (("same", "separated the same way at both"), ("reversed", "reversed"),
                          ("only_small", f"separated at {ladder.rungs[0]} only"),
                          ("only_large", f"separated at {ladder.rungs[-1]} only")):
            if kinds[key]:
                lines.append(f"  - {text}: {'; '.join(kinds[key])}")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# Outputs


def plot_ladder(ladder: Ladder, measure: str, path: Path) -> None:
    """One panel per rung: `measure` ('penalty' or 'ppl') against training tokens, a line per variant, a band
    where it has an interval."""
    from matplotlib.ticker import FormatStrFormatter, NullLocator

    figure, axes = panels(len(ladder.rungs))
    labels = ladder.labels() if measure == "penalty" else ladder.distinct_at_1x()
    for axis, rung in zip(axes, ladder.rungs):
        for label in labels:
            points = [(p.tokens, getattr(p, measure)) for p in ladder.series(rung, label)]
            points = [(tokens, e) for tokens, e in points if e is not None]
            if not points:
                continue
            encoding, _, method = label.partition("+")
            xs = [tokens / 1e6 for tokens, _ in points]
            line, = axis.plot(xs, [e.mean for _, e in points], **figures.style(encoding, method or "none"),
                              markersize=3, linewidth=1.3, label=label)
            if all(e.has_interval for _, e in points):
                axis.fill_between(xs, [e.low for _, e in points], [e.high for _, e in points],
                                  color=line.get_color(), alpha=0.15, linewidth=0)
        if measure == "penalty":
            axis.axhline(0, color="black", linewidth=0.8)
        else:
            axis.set_yscale("log")
        axis.set_xscale("log", base=2)
        ticks = sorted({p.tokens / 1e6 for p in ladder.points if p.rung == rung})
        axis.set_xticks(ticks, [f"{tick:.2g}" for tick in ticks])
        axis.xaxis.set_minor_locator(NullLocator())
        if measure != "penalty":
            axis.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            axis.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        axis.grid(True, which="both", alpha=0.3)
    if len(axes) == 1:
        axes[0].set_title(ladder.rungs[0])
    ylabel = (f"penalty at {ladder.longest_multiple:g}x (nats)" if measure == "penalty" else "perplexity at 1x")
    finish(figure, axes, ladder.rungs, path, "training tokens (millions, log scale)", ylabel,
            f"Scale ladder: {ylabel} against training tokens, one panel per rung (band: 95% interval over seeds)")


def ladder_table(ladder: Ladder, measure: str) -> list[str]:
    fractions = sorted({p.fraction for p in ladder.points})
    digits, signed = (3, True) if measure == "penalty" else (2, False)
    lines = ["| variant | rung | " + " | ".join(f"{f:g} of training" for f in fractions) + " |",
             "|---|---|" + "---:|" * len(fractions)]
    for label in (ladder.labels() if measure == "penalty" else ladder.distinct_at_1x()):
        for rung in ladder.rungs:
            by_fraction = {p.fraction: p for p in ladder.series(rung, label)}
            if not by_fraction:
                continue
            cells = []
            for fraction in fractions:
                point = by_fraction.get(fraction)
                estimate = getattr(point, measure) if point else None
                cells.append("n/a" if estimate is None else
                             f"{cell(estimate, digits, signed)} ({point.tokens / 1e6:.2g}M)")
            lines.append(f"| {label} | {rung} | " + " | ".join(cells) + " |")
    return lines


def rung_wall(folder: Path) -> float:
    """Seconds of wall time over every invocation of a rung's comparison (OUT/RUNG/invocations.jsonl)."""
    return sum(record["wall_s"] for record in invocations(folder))


def write_ladder(out: Path, ladder: Ladder, config: LadderConfig, command: str, wall_s: float) -> None:
    tables = [f"### Penalty at {ladder.longest_multiple:g}x (nats; mean [95% interval] over seeds and windows; "
              "training tokens in brackets)", "", *ladder_table(ladder, "penalty"), "",
              "### Perplexity at 1x (mean [95% t interval] over seeds)", "",
              *([f"Not repeated: {', '.join(same)} (at 1x the same numbers as the model without the method)", ""]
                if (same := [label for label in ladder.labels() if label not in ladder.distinct_at_1x()]) else []),
              *ladder_table(ladder, "ppl"), ""]
    (out / "table.md").write_text("\n".join(tables))
    if ladder.points:
        plot_ladder(ladder, "penalty", out / "penalty.png")
        plot_ladder(ladder, "ppl", out / "ppl.png")
    records = invocations(out)
    first = ladder.settings[ladder.rungs[0]] if ladder.rungs else {}
    own = {key for settings in config.rungs.values() for key in settings}  # what differs between the rungs
    shared = {section: {k: v for k, v in values.items() if f"{section}.{k}" not in own}
              for section, values in first.get("shared", {}).items() if isinstance(values, dict)}
    compare = first.get("compare", {})
    rung_lines = []
    for rung in ladder.rungs:
        params = ladder.parameters.get(rung, {})
        settings = ", ".join(f"{k} = {json.dumps(v)}" for k, v in config.rungs.get(rung, {}).items())
        counts = sorted(set(params.values())) or [0]
        count = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,} - {counts[-1]:,}"
        rung_lines.append(f"| {rung} | {settings} | {count} | "
                          f"{ladder.settings[rung]['max_steps'] * ladder.settings[rung]['tokens_per_step']:,} | "
                          f"{rung_wall(out / rung) / 60:.1f} min |")
    lines = [
        "# Scale ladder", "",
        f"Reproduce: `{command}`. This invocation: {wall_s / 60:.1f} min wall on this machine "
        f"({machine_description()}); all {len(records)} invocation(s) on record (OUT/invocations.jsonl): "
        f"{sum(r['wall_s'] for r in records) / 60:.1f} min wall. Each rung's own report: OUT/RUNG/report.md.", "",
        "## Setup", "",
        f"- Every rung starts from the `{config.preset}` preset of `{config.compare_config}`: data `"
        f"{compare.get('source')}`, encodings {compare.get('encodings')}, methods {compare.get('methods')} "
        f"(the kept models are evaluated under {compare.get('snapshot_methods')}), seeds {compare.get('seeds')}, "
        f"L = {first.get('trained_length')}, evaluated at {ladder.longest_multiple:g}x; shared settings "
        f"{json.dumps(shared.get('model', {}))}, training {json.dumps(shared.get('train', {}))}.",
        f"- Models kept at {sorted({p.fraction for p in ladder.points})} of training (one training per encoding, "
        "seed and rung; the earlier models are snapshots of it, taken while the learning rate was still high).",
        "", "| rung | its settings | parameters (by encoding) | training tokens | rung wall time |",
        "|---|---|---:|---:|---:|", *rung_lines, "",
        "## Results", "", *tables,
        "![penalty against training tokens, one panel per rung](penalty.png)", "",
        "![1x perplexity against training tokens, one panel per rung](ppl.png)", "",
        "## What this shows", "", *findings(ladder), "",
        "A trend or an order is stated only where the 95% intervals separate; 'within noise' is not 'no change'.",
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(results_json({
        "rungs": {rung: {"settings": config.rungs.get(rung, {}), "parameters": ladder.parameters.get(rung, {})}
                  for rung in ladder.rungs},
        "longest_multiple": ladder.longest_multiple,
        "points": [{"rung": p.rung, "label": p.label, "fraction": p.fraction, "tokens": p.tokens,
                    "penalty": estimate_dict(p.penalty), "ppl_1x": estimate_dict(p.ppl)} for p in ladder.points],
        "training_trends": {label: training_trends(ladder, label) for label in ladder.labels()},
        "size_trends": {label: size_trend(ladder, label) for label in ladder.labels()} if len(ladder.rungs) > 1
        else {},
        "ordering": ordering_comparison(ladder) if len(ladder.rungs) > 1 else {}}))


def share_data(out: Path, rung_out: Path) -> None:
    """Every rung reads the ladder's one prepared data folder (OUT/data): OUT/RUNG/data links to it."""
    link = rung_out / "data"
    if link.is_symlink() or link.exists():
        return
    rung_out.mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path("..") / "data", target_is_directory=True)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.ladder", __doc__, epilog="Overrides for every rung: --compare.key=value, "
                                                           "--model.key=value, --train.key=value (as experiments.compare)")
    parser.add_argument("--config", type=Path, default=Path("configs/ladder.toml"), metavar="FILE",
                        help="TOML ladder config ([ladder]: compare_config, preset, out, rungs)")
    parser.add_argument("--rungs", help="run only these rungs (comma-separated names)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the aggregate report from the rungs' results without running anything")
    add_out(parser, "output folder (default: [ladder] out of the config)")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args, overrides, command = experiment_arguments(build_parser(), argv)
    config = load_ladder_config(args.config, [r for r in (args.rungs or "").split(",") if r] or None)
    out = Path(args.out) if args.out else config.out
    if any(o.startswith("--compare.out=") for o in overrides):
        raise ConfigError("--compare.out: every rung writes to OUT/RUNG; set the ladder's folder with --out")
    started = time.perf_counter()
    status = 0
    # Every rung's configuration is checked before any trains.
    rungs = {name: load_compare_config(config.compare_config, config.preset,
                                       [*config.rung_overrides(name, overrides), f"--compare.out={out / name}"])
             for name in config.rungs}
    with FolderLock(out, "ladder"):
        if not args.report_only:
            for name, (compare, shared, preset) in rungs.items():
                print(f"\n=== rung {name}: {' '.join(config.rung_overrides(name, overrides))} ===", flush=True)
                share_data(out, out / name)
                with FolderLock(out / name, "comparison"):
                    status |= run_comparison(compare, shared, f"{preset}, rung {name}", f"{command} (rung {name})",
                                             time.perf_counter())
        wall = time.perf_counter() - started
        record_invocation(out, command, wall, rungs=list(config.rungs), report_only=args.report_only)
        ladder = collect_ladder(out, list(config.rungs))
        if not ladder.rungs:
            raise ConfigError(f"{out}: no rung has results yet; run the ladder without --report-only first")
        write_ladder(out, ladder, config, command, wall)
    print(f"\nwrote {out / 'report.md'} ({wall / 60:.1f} min)")
    return status


if __name__ == "__main__":
    sys.exit(main())
