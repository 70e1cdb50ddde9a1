"""Length-generalisation tasks: train a small model per task, encoding and seed on a synthetic task at length L (loss
on the answers only), then score exact match and token accuracy at multiples of L on fresh sequences (data/tasks.py).

    python -m experiments.tasks --out runs/tasks      # the suite: copy and flipflop x rope, alibi, none, sinusoidal x 3 seeds
    python -m experiments.tasks --tasks flipflop --encodings rope,none --seeds 1 --until 0 --train.max_steps=1000 --out runs/ff
    python -m experiments.tasks --tasks copy --encodings rope,rope-randomized --out runs/tasks_rr \\
        --tasks.variants='{rope-randomized = {position = "rope", random_positions = 2048}}'

Every encoding (a model.position, or a named variant: its model settings) and seed trains the same model shape on
the same sequences (a function of the seed and the step); test sequences come from a separate seed. Each model trains
until it has learned the task at L, so that the longer lengths compare models equally good at L: the learning rate
decays in cosine cycles of train.lr_cycle (3,000) steps that restart, and at the end of each cycle (the evaluation
interval) the model's exact match on 256 validation sequences at L (a third seed) is checked; training stops once it
reaches --until (0.95), or at train.max_steps (12,000, four cycles), where a model that never reached it is marked.
So every model stops annealed (a --train.max_steps below one cycle decays over the whole run instead).

A cell is one task, encoding and seed: its model trains in OUT/work/tasks/TASK/ENCODING/seedS (train/tasks.py: a rerun
reuses a finished training with the same settings and resumes an interrupted one), and its record keeps the steps,
whether the target was reached, and each length's scores; a retrieval task (mqar, niah_multikey) also keeps its grid
of length x answer distance (eval/retrieval.py) as trained and under each of --methods that applies, each beside its
window control. Report: OUT/tasks.md (exact match over seeds, each seed's steps, the grids), OUT/tasks.png and
OUT/TASK/TASK.png, OUT/report.md. A comparison (experiments/compare.py, compare.tasks) declares the same cells
(comparison_cells) and shows them in its report (comparison_section, retrieval_grids for its extrapolation map).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from data.tasks import TASKS, get_task
from errors import ConfigError
from eval import figures
from eval.retrieval import grid_over_seeds, retrieval_grid
from eval.stats import Estimate, Rate, rate_over_seeds
from eval.task_score import VALIDATION_COUNT, evaluate, validation_stop
from eval.use import WINDOW_CONTROL
from experiments.engine import Context, Records, Study, option
from experiments.render import bands, header, provenance, write
from model.checkpoint import load_model
from model.encodings import POSITION_ENCODINGS
from model.fields import check_field_types
from model.methods import NONE, applies, check_methods, label
from train.config import build_run_config
from train.tasks import train_task

GRID_COUNT = 128  # sequences per cell of a retrieval grid (up to 10 cells, each scored with and without the control)
SUITE = ["copy", "flipflop"]  # the tasks every encoding learns at 1x at the default budget (docs/evaluation.md)
DEFAULT_LENGTH, MULTIPLES = 32, [1, 2, 4, 8]
DEFAULT_MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2}
DEFAULT_UNTIL = 0.95  # the stop target, and the exact match at which a seed counts as having learned the task
DEFAULT_TRAIN = {"batch_size": 32, "max_steps": 12000, "lr_cycle": 3000, "lr": 3e-3, "warmup_steps": 30,
                 "eval_interval": 3000, "eval_batches": 4, "log_interval": 500, "dtype": "float32"}
MAP_LENGTH, MAP_DISTANCE = "8x", "4L"  # the extrapolation map's cell of the retrieval grids
MAP_CELL = "exact match on a retrieval task whose answers lie 4L before their queries in inputs of 8x the task's L"


@dataclass
class Settings:
    tasks: list = option(SUITE, f"tasks, from {sorted(TASKS)}")
    encodings: list = option(["rope", "alibi", "none", "sinusoidal"], "model.position names, or names of variants")
    variants: dict = option({}, "name -> the model settings (with a position) of a variant encodings may list, e.g. "
                                "--tasks.variants='{rope-randomized = {position = \"rope\", random_positions = 2048}}'")
    length: int = option(DEFAULT_LENGTH, "training length L in tokens")
    multiples: list = option(MULTIPLES, "evaluation lengths as multiples of L")
    seeds: list = option([1, 2, 3], "training seeds")
    count: int = option(256, "test sequences per length")
    methods: list = option([], "inference-time methods the retrieval tasks' grids are also scored under, where they "
                               "apply (e.g. yarn); every retrieval model is also scored under its window control")
    until: float = option(DEFAULT_UNTIL, f"stop each training once exact match at L on {VALIDATION_COUNT} validation "
                                         "sequences, checked every train.eval_interval steps, reaches this (0: train "
                                         "to train.max_steps, the cap)")
    out: str = option("runs/tasks", "the study's folder")
    model: dict = option({}, f"[model]: settings over {DEFAULT_MODEL}")
    train: dict = option({}, f"[train]: settings over {DEFAULT_TRAIN}")

    def __post_init__(self) -> None:
        check_field_types(self, "tasks")
        for name in self.tasks:
            get_task(name)
        check_methods(self.methods)
        bad = [name for name, own in self.variants.items() if not isinstance(own, dict) or "position" not in own]
        unknown = [name for name in self.encodings if name not in POSITION_ENCODINGS and name not in self.variants]
        if bad or unknown:
            raise ConfigError(f"tasks.encodings: unknown {unknown} (valid: {sorted(POSITION_ENCODINGS)} and the variants "
                              f"{sorted(self.variants)}); a variant is a table of model settings with a position: "
                              f"{bad}")
        integers, distinct = [*self.seeds, *self.multiples], len(set(self.seeds)) == len(self.seeds)
        given = self.tasks and self.encodings and self.seeds and self.multiples and distinct
        if not given or any(not isinstance(n, int) or isinstance(n, bool) for n in integers) or (
                min(self.multiples) < 1 or self.length < 4 or self.count < 1 or not 0 <= self.until <= 1):
            raise ConfigError("tasks: tasks, encodings, seeds (distinct integers) and multiples (integers >= 1) need "
                              "values, length >= 4, count >= 1, until in [0, 1]")


def task_train(overrides: dict) -> dict:
    """DEFAULT_TRAIN with `overrides`; a cap below one learning-rate cycle (--train.max_steps=1000, say) decays
    over the whole run instead (lr_cycle 0), so that a short training still ends annealed, unless lr_cycle is set;
    the stop check runs at each cycle's end unless eval_interval is set."""
    train = {**DEFAULT_TRAIN, **overrides}
    if "lr_cycle" not in overrides and train["lr_cycle"] > train["max_steps"]:
        train["lr_cycle"] = 0
    if "eval_interval" not in overrides and train["lr_cycle"]:
        train["eval_interval"] = train["lr_cycle"]
    return train


def task_cell(name: str, task: str, encoding: str, own: dict, seed: int, model: dict, train: dict, length: int,
              multiples: list[int], count: int, until: float | None, methods: list[str]) -> dict:
    """One task model's cell: its run config (the shared model settings, then the encoding's own), its lengths and
    stop target; a retrieval task's also names the methods its grid is scored under (those that apply)."""
    spec = get_task(task)
    settings = {**copy.deepcopy(model), **copy.deepcopy(own), "vocab_size": spec.vocab_size, "max_seq_len": length}
    if settings["position"] == "learned":  # scored past its table: positions there reuse its last row
        settings.setdefault("position_args", {}).setdefault("learned", {}).setdefault("clamp", True)
    run = {"model": settings, "train": {**train, "seed": seed}}
    config = build_run_config(copy.deepcopy(run), f"task {name}")  # every setting is checked before anything trains
    spec.batch(0, 1, max(multiples) * length)  # and every length
    cell = {"name": name, "kind": "task", "task": task, "encoding": encoding, "seed": seed, "length": length,
            "multiples": list(multiples), "count": count, "until": until or None, "run": run}
    if spec.make_at is not None:
        cell["methods"] = [m for m in methods if WINDOW_CONTROL not in m.split("+") and m != NONE
                           and applies(m, config.model.position, config.model.layer_encodings)]
        cell["grid_count"] = min(count, GRID_COUNT)
    return cell


def cells(settings: Settings, context: Context) -> list[dict]:
    model, train = {**DEFAULT_MODEL, **settings.model}, task_train(settings.train)
    return [task_cell(f"{task}/{encoding}-seed{seed}", task, encoding, settings.variants.get(encoding, {
        "position": encoding}), seed, model, train, settings.length, settings.multiples, settings.count, settings.until,
                      settings.methods) for task in settings.tasks for encoding in settings.encodings
            for seed in settings.seeds]


def comparison_cells(settings: Any) -> list[dict]:
    """A comparison's task cells (experiments.compare.Settings): each of its encodings with its model settings (a
    variant's, and the position_args of the comparison's [model] that reach it) on DEFAULT_MODEL at L = 32, per seed."""
    train = task_train({"max_steps": settings.task_steps, **({"lr_cycle": settings.task_cycle}
                                                             if settings.task_cycle else {})})
    return [task_cell(f"task/{task}/{encoding}-seed{seed}", task, encoding, settings.model_settings(encoding), seed,
                      DEFAULT_MODEL, train, DEFAULT_LENGTH, MULTIPLES, settings.task_count, settings.task_until,
                      settings.methods) for task in settings.tasks for encoding in settings.encodings
            for seed in settings.seeds]


def measure(cell: dict, context: Context) -> dict:
    """Train (or reuse, or resume) the cell's model, then score it at every multiple of L (and its grids)."""
    task, length, until = get_task(cell["task"]), cell["length"], cell["until"]
    run = context.work / "tasks" / cell["task"] / cell["encoding"] / f"seed{cell['seed']}"
    config = build_run_config({**copy.deepcopy(cell["run"]), "out": {"dir": str(run), "overwrite": True}},
                              f"task {cell['name']}")
    steps, reached = train_task(config, task, length, until, until and validation_stop(task, length, until))
    model = load_model(run, runtime=config.runtime)
    record: dict[str, Any] = {"steps": steps, "reached": reached, "rows": {
        f"{multiple}x": evaluate(model, task, multiple * length, cell["count"]) for multiple in cell["multiples"]}}
    if "grid_count" in cell:
        record["grids"] = {method: retrieval_grid(model, task, length, cell["multiples"], cell["grid_count"],
                                                  method=method) for method in [NONE, *cell["methods"]]}
    return record


# ------------------------------------------------------------------------------------------------- the report

def grouped(pairs: list[tuple[dict, dict]]) -> dict[str, dict[str, list[tuple[dict, dict]]]]:
    """task -> encoding -> its (cell, record) pairs in seed order."""
    found: dict[str, dict[str, list]] = {}
    for cell, record in pairs:
        found.setdefault(cell["task"], {}).setdefault(cell["encoding"], []).append((cell, record))
    return {task: {name: sorted(seeds, key=lambda pair: pair[0]["seed"]) for name, seeds in by.items()}
            for task, by in found.items()}


def rates(seeds: list[tuple[dict, dict]], metric: str = "exact_match") -> dict[str, Rate]:
    """Length ("Mx") -> the seeds' rate (eval.stats.rate_over_seeds over the cell's count of sequences: exact match
    with the seeds that reach the stop target; token accuracy, a mean score per sequence)."""
    cell, exact = seeds[0][0], metric == "exact_match"
    return {key: rate_over_seeds([record["rows"][key][metric] for _, record in seeds], cell["count"],
                                 (cell["until"] or DEFAULT_UNTIL) if exact else None) for key in seeds[0][1]["rows"]}


def task_grids(by_encoding: dict[str, list[tuple[dict, dict]]]) -> dict[str, dict]:
    """Variant label ("rope", "rope+yarn") -> its grid over seeds, for the encodings whose every seed has grids."""
    found = {}
    for encoding, seeds in by_encoding.items():
        if all("grids" in record for _, record in seeds):
            cell = seeds[0][0]
            for method in seeds[0][1]["grids"]:
                found[label(encoding, method)] = grid_over_seeds([record["grids"][method] for _, record in seeds],
                                                                 cell["grid_count"], cell["until"] or DEFAULT_UNTIL)
    return found


def retrieval_grids(task_records: list[tuple[dict, dict]]) -> dict[str, dict[str, tuple[Estimate, Estimate, Estimate]]]:
    """Task -> variant label -> (model, window control, difference) at the map's cell (MAP_CELL)."""
    found: dict[str, dict] = {}
    for task, by_encoding in grouped(task_records).items():
        for name, grid in task_grids(by_encoding).items():
            at = grid.get(MAP_LENGTH, {}).get(MAP_DISTANCE)
            if at:
                found.setdefault(task, {})[name] = (at["full"], at["window"], at["difference"])
    return found


def rate_caption(found: list[Rate]) -> str:
    """What the intervals and the k/n of `found` (the rates of one table) are, in words."""
    methods, thresholds = {rate.method for rate in found}, {rate.threshold for rate in found} - {None}
    if methods == {"seeds and trials"}:
        words = ("the mean of the seeds' rates [95% interval holding the t interval over seeds, cut to 0..1, and "
                 "the pooled Wilson interval of the sequences scored]")
    elif "seeds and sequences" in methods and methods <= {"seeds and sequences", "seeds and trials"}:
        words = ("the mean of the seeds' rates [95% interval holding the t interval over seeds, cut to 0..1, and "
                 "the Wilson interval of the summed per-sequence scores]")
    elif methods == {"t over seeds, clipped to [0, 1]"}:
        words = "the mean of the seeds' rates [95% t interval over seeds, cut to 0..1]"
    else:
        words = "the mean of the seeds' rates [95% interval]"
    if thresholds:
        words += f"; k/n: the seeds whose exact match reaches {min(thresholds):g} (learned at 1x, retrieved past it)"
    return words


def steps_cell(seeds: list[tuple[dict, dict]]) -> str:
    """Each seed's training steps, `*` on those that ran to the cap without reaching the stop target."""
    return " / ".join(f"{record['steps']:,}" + ("*" if record["reached"] is False else "") for _, record in seeds)


def grid_table(grids: dict[str, dict]) -> list[str]:
    """The retrieval grid of one task, a row per variant and a column per (length, answer distance): the model's
    exact match over seeds, then its difference from its window control, paired by seed."""
    first = next(iter(grids.values()))
    columns = [(key, name) for key, by_label in first.items() for name in by_label]
    titles = [f"{key}, d = {first[key][name]['distance']} ({name})" for key, name in columns]
    lines = []
    for part, what in (("full", "exact match"), ("difference", "exact match: the model minus its window control")):
        lines += [f"{what} (length, answer distance d in tokens)", "", *header("encoding", titles)]
        for variant, grid in grids.items():
            lines.append(f"| {variant} | " + " | ".join(
                grid[key][name][part].format(2, signed=part == "difference") if name in grid.get(key, {}) else "n/a"
                for key, name in columns) + " |")
        lines.append("")
    return lines


def plot(found: dict[str, dict[str, dict[str, Rate]]], length: int, path: Path) -> None:
    """One panel per task: exact match against length, one line per encoding, its 95% interval as a band."""
    path.parent.mkdir(parents=True, exist_ok=True)
    bands([(task, [(encoding, figures.style(encoding), [(int(key[:-1]), rate.estimate) for key, rate in by.items()])
                   for encoding, by in by_encoding.items()]) for task, by_encoding in found.items()], path,
          f"evaluation length / L (L = {length})", "exact match (band: 95% interval over seeds)",
          "exact match against length", log_x=True)


def tasks_markdown(found: dict[str, dict[str, list]], length: int, seeds: list[int]) -> str:
    """OUT/tasks.md: per task, exact match at each length over seeds and each seed's steps; the retrieval grids."""
    exact = {task: {name: rates(pairs) for name, pairs in by.items()} for task, by in found.items()}
    every = [rate for by in exact.values() for row in by.values() for rate in row.values()]
    lines = [f"Exact match at each multiple of L = {length} over seeds {seeds}: {rate_caption(every)}.", ""]
    for task, by_encoding in exact.items():
        keys = list(next(iter(by_encoding.values())))
        lines += [*header(task, [*keys, "steps (each seed)"]), *[
            f"| {name} | " + " | ".join(row[key].format() for key in keys) + f" | {steps_cell(found[task][name])} |"
            for name, row in by_encoding.items()], ""]
    accuracy = {task: {name: rates(pairs, "token_accuracy") for name, pairs in by.items()} for task, by in found.items()}
    lines += [f"Token accuracy (the share of answer tokens right) at each multiple of L over the same seeds: "
              f"{rate_caption([rate for by in accuracy.values() for row in by.values() for rate in row.values()])}.",
              ""]
    for task, by_encoding in accuracy.items():
        keys = list(next(iter(by_encoding.values())))
        lines += [*header(f"{task}, token accuracy", keys), *[
            f"| {name} | " + " | ".join(row[key].format() for key in keys) + " |" for name, row in by_encoding.items()],
            ""]
    if any(record["reached"] is False for by in found.values() for pairs in by.values() for _, record in pairs):
        lines += ["Steps: each seed's training steps; * ran to train.max_steps without reaching the stop target.", ""]
    for task, by_encoding in found.items():
        grids = task_grids(by_encoding)
        if grids:
            lines += [f"### {task}: answer distance past L", "", "Each model on test sequences whose answers lie d "
                      "tokens before their queries, and the same weights with attention limited to the last L = "
                      f"{length} keys (its window control). A difference whose interval excludes 0 at d > L: the "
                      "model uses what lies past L.", "", *grid_table(grids)]
    return "\n".join(lines)


def report(records: Records) -> None:
    """OUT/tasks.md, OUT/tasks.png, OUT/TASK/TASK.png and OUT/report.md."""
    out, settings, done = records.out, records.settings, records.done()
    found = grouped(done)
    text = tasks_markdown(found, settings.length, settings.seeds)
    write(out, "tasks.md", text)
    exact = {task: {name: rates(pairs) for name, pairs in by.items()} for task, by in found.items()}
    for task, by_encoding in exact.items():
        plot({task: by_encoding}, settings.length, out / task / f"{task}.png")
    plot(exact, settings.length, out / "tasks.png")
    train = task_train(settings.train)
    budget = (f"until validation exact match at L reaches {settings.until:g}, at most {train['max_steps']:,} steps"
              if settings.until else f"{train['max_steps']:,} steps")
    write(out, "report.md", "\n".join([
        "# Length-generalisation tasks", "", f"Each model: {({**DEFAULT_MODEL, **settings.model})} at L = "
        f"{settings.length}, batches of {train['batch_size']} sequences, trained {budget}; {settings.count} test "
        "sequences per length (experiments/tasks.py).", "",
        provenance(records.invocations, [records.seconds(cell) for cell, _ in done]), "", text,
        "![exact match against length](tasks.png)", ""]))


def comparison_section(task_records: list[tuple[dict, dict]], settings: Any, out: Path) -> list[str]:
    """A comparison's task sections: per task, exact match at each length over seeds, each seed's steps, its figure
    (OUT/tasks/TASK/TASK.png) and, for a retrieval task, its grid."""
    found, lines = grouped(task_records), []
    for name in [task for task in settings.tasks if task in found]:
        by_encoding = found[name]
        first = next(iter(by_encoding.values()))[0][0]
        cap, until = first["run"]["train"]["max_steps"], first["until"]
        budget = f"until validation exact match at L reaches {until:g}, at most {cap:,} steps" if until else (
            f"{cap:,} steps")
        exact = {encoding: rates(pairs) for encoding, pairs in by_encoding.items()}
        multiples = list(next(iter(exact.values())))
        lines += [f"### Task: {name}", "",
                  f"Trained per encoding and seed at L = {first['length']} (experiments/tasks.py, model {DEFAULT_MODEL}, "
                  f"batches of {first['run']['train']['batch_size']} sequences, {budget}), exact match on "
                  f"{first['count']} fresh sequences per length: "
                  + rate_caption([rate for row in exact.values() for rate in row.values()])
                  + "; steps: each seed's (* reached the cap).", "", *header("encoding", [*multiples, "steps"])]
        lines += [f"| {encoding} | " + " | ".join(rate.format() for rate in row.values())
                  + f" | {steps_cell(by_encoding[encoding])} |" for encoding, row in exact.items()]
        plot({name: exact}, first["length"], out / "tasks" / name / f"{name}.png")
        lines += ["", f"![{name}](tasks/{name}/{name}.png)", ""]
        grids = task_grids(by_encoding)
        if grids:
            lines += ["Answers at a set distance d before their queries, at each length (the grid), for each model and "
                      f"its window control (the same weights, attention limited to the last L = {first['length']} "
                      "keys), 95% t intervals over seeds; the difference is paired by seed:", "", *grid_table(grids)]
    return lines


STUDY = Study("experiments.tasks", Settings, cells, measure, report, doc=__doc__)

if __name__ == "__main__":
    from experiments.engine import main

    raise SystemExit(main("experiments.tasks"))
