"""Length-generalisation tasks: train a small model per task, encoding and seed on a synthetic task at length L (loss
on the answers only), then score exact match at 1x, 2x, 4x and 8x L on fresh sequences (data/tasks.py).

    python -m experiments.tasks --out runs/tasks      # the suite: copy and flipflop x rope, alibi, none, sinusoidal x 3 seeds
    python -m experiments.tasks --tasks flipflop --encodings rope,none --seeds 1 --until 0 --train.max_steps=1000 --out runs/ff

Every encoding and seed trains the same model shape on the same sequences (a function of the seed and the step);
evaluation sequences come from a separate seed. Each model trains until it has learned the task at L, so that the
longer lengths compare models equally good at L: the learning rate decays in cosine cycles of train.lr_cycle
(3,000) steps that restart, and at the end of each cycle (train.eval_interval, 3,000) the model's exact match on 256
validation sequences at L (a third seed) is checked; training stops once it reaches --until (0.95), or at
train.max_steps (12,000, four cycles), where a model that never reached it is marked. So, with a cap that is a
whole number of cycles, every model stops annealed, and those that learn the task in the first cycle are trained as on a 3,000-step budget (a
--train.max_steps below one cycle decays over the whole run instead).

Trainings run in --workers processes (default: one single-thread process per CPU core); a failed one is reported
and the others go on. The same command run again resumes: a training finished with the same settings and target is
scored again, not retrained, and one interrupted after a checkpoint continues from it. Writes OUT/tasks.md (exact
match, mean [95% t interval] over seeds, and each seed's steps), OUT/tasks.png, and per task OUT/TASK/results.json (exact match and token accuracy: each seed's value, their mean
and t interval; each seed's steps) and OUT/TASK/TASK.png; runs and their logs in OUT/runs/.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import dataclasses
import multiprocessing
import os
import sys
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from commands import add_out, comma_list, command_parser, renamed, results_json
from data.batches import IGNORE_INDEX
from data.tasks import EVAL_SEED, TASKS, Task, TaskBatch, get_task
from errors import ConfigError, cli_command
from eval import figures
from eval.retrieval import retrieval_grid
from eval.stats import Estimate, rate_over_seeds
from eval.task_score import evaluate
from experiments.jobs import comparable, die_with_parent, job_output, saved_run_config, worker_layout
from experiments.seed_intervals import paired_rate_difference
from model.checkpoint import load_model, load_trainer_state
from model.encodings import POSITION_ENCODINGS
from model.fields import parse_override_value
from model.methods import NONE, applies, check_methods, label
from model.transformer import Transformer
from train.config import RunConfig, build_run_config
from train.loop import Training, model_factory, run_training

CONTROL = "window"  # the window control: scored beside every model of a retrieval task, not as a method of its own
GRID_COUNT = 128  # sequences per cell of a retrieval grid (up to 10 cells, each scored with and without the control)
SUITE = ["copy", "flipflop"]  # the tasks every encoding learns at 1x at the default budget (docs/evaluation.md)
DEFAULT_LENGTH = 32
VAL_COUNT = 256  # validation sequences at L for the stop check
DEFAULT_MODEL = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2}
DEFAULT_UNTIL = 0.95  # train each model in cycles until validation exact match at L reaches this (or to max_steps):
# the learning rate decays over cycles of 3,000 steps, restarting, and the check runs at each cycle's end (the
# evaluation interval), so every model stops annealed, and one that learns the task in the first cycle is trained as
# on a 3,000-step budget
DEFAULT_TRAIN = {"batch_size": 32, "max_steps": 12000, "lr_cycle": 3000, "lr": 3e-3, "warmup_steps": 30,
                 "eval_interval": 3000, "eval_batches": 4, "log_interval": 500, "dtype": "float32"}


def task_train(overrides: dict) -> dict:
    """DEFAULT_TRAIN with `overrides`; a cap below one learning-rate cycle (--train.max_steps=1000, say) decays
    over the whole run instead (lr_cycle 0), so that a short training still ends annealed, unless lr_cycle is set."""
    train = {**DEFAULT_TRAIN, **overrides}
    if "lr_cycle" not in overrides and train["lr_cycle"] > train["max_steps"]:
        train["lr_cycle"] = 0
    if "eval_interval" not in overrides and train["lr_cycle"]:
        train["eval_interval"] = train["lr_cycle"]  # the stop check at each cycle's end
    return train


class TaskBatches:
    """The training loop's batch source for a task: loss only on the answer targets."""

    def __init__(self, task: Task, length: int, batch_size: int, seed: int, val_batches: int) -> None:
        self.task, self.length, self.batch_size, self.seed, self.val_batches = task, length, batch_size, seed, val_batches

    @staticmethod
    def masked(batch: TaskBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.inputs, torch.where(batch.answers, batch.targets, torch.full_like(batch.targets, IGNORE_INDEX))

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.masked(self.task.batch([self.seed, step, micro_step], self.batch_size, self.length, train=True))

    def val_batches_iter(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in range(self.val_batches):
            yield self.masked(self.task.batch([EVAL_SEED - 1, index], self.batch_size, self.length, train=True))


def stop_at(task: Task, length: int, target: float, count: int = VAL_COUNT):
    """The training loop's stop check: stop once exact match at L on `count` validation sequences (a seed no
    training batch and no test uses; the validation-loss batches draw from it too) reaches `target`."""
    def check(model: Transformer, step: int) -> str | None:
        value = evaluate(model, task, length, count, seed=[EVAL_SEED - 1, 1])["exact_match"]
        print(f"step {step:5d} | validation exact match at L {value:.4f} (stop at {target:g})", flush=True)
        return f"validation exact match {value:.4f} >= {target:g}" if value >= target else None
    return check


@dataclass(frozen=True)
class TaskJob:
    """One training of one task, encoding (its model settings) and seed, then its scores at every multiple."""
    task: str
    encoding: str
    settings: dict
    seed: int
    length: int
    multiples: tuple[int, ...]
    count: int
    shared: dict
    runs: str  # the run folder is RUNS/TASK/ENCODING/seedS
    threads: int = 0
    until: float | None = None  # stop training once validation exact match at L reaches this (None: max_steps)
    methods: tuple[str, ...] = ()  # inference-time methods the retrieval grid is also scored under, where they apply

    @property
    def name(self) -> str:
        return f"{self.task}-{self.encoding}-seed{self.seed}"


def run_task_job(job: TaskJob, log_path: Path | None = None) -> dict[str, Any]:
    """Train and score one job; a failure is returned as its status, not raised (the other jobs go on)."""
    started = time.perf_counter()
    result: dict[str, Any] = {"task": job.task, "encoding": job.encoding, "seed": job.seed, "status": "ok"}
    with job_output(log_path, job.threads):
        try:
            task = get_task(job.task)
            values = {section: copy.deepcopy(job.shared.get(section, {})) for section in ("model", "train")}
            values["model"].update(copy.deepcopy(job.settings), vocab_size=task.vocab_size, max_seq_len=job.length)
            if job.settings["position"] == "learned":  # scored past its table: positions there reuse its last row
                values["model"].setdefault("position_args", {}).setdefault("learned", {}).setdefault("clamp", True)
            values["train"]["seed"] = job.seed
            values["out"] = {"dir": str(Path(job.runs) / job.task / job.encoding / f"seed{job.seed}"),
                             "overwrite": True}
            config = build_run_config(values, f"task {job.name}")
            earlier, state = earlier_training(config, job.until)
            if earlier == "done":
                steps, stopped = int(state["step"]), "stopped" in state
                print(f"{job.name}: reusing the finished training in {config.out.dir} (step {steps})", flush=True)
            else:
                trained = run_training(Training(
                    config, model_factory(config, None),
                    TaskBatches(task, job.length, config.train.batch_size, job.seed, config.train.eval_batches), None,
                    resume=earlier == "partial", task=f"task:{task.name}", extra_state={"until": job.until},
                    stop_when=None if job.until is None else stop_at(task, job.length, job.until)))
                steps, stopped = trained.steps, trained.stopped is not None
            result["steps"] = steps
            result["reached"] = None if job.until is None else stopped  # None: no target
            model = load_model(config.out.dir, runtime=config.runtime)
            result["rows"] = {f"{multiple}x": evaluate(model, task, multiple * job.length, job.count)
                              for multiple in job.multiples}
            if task.make_at is not None:  # a retrieval task: length x answer distance, and the window control
                methods = [NONE] + [m for m in job.methods if m not in (NONE, CONTROL) and applies(
                    m, model.config.position, model.config.layer_encodings)]
                count = min(job.count, GRID_COUNT)
                result["grids"] = {method: retrieval_grid(model, task, job.length, list(job.multiples), count,
                                                          method=method) for method in methods}
        except Exception as error:  # reported with the others' results
            traceback.print_exc()
            result["status"] = f"failed: {type(error).__name__}: {error}"[:300]
    result["seconds"] = time.perf_counter() - started
    return result


def earlier_training(config: RunConfig, until: float | None) -> tuple[str | None, dict]:
    """What an earlier run left in this job's folder, and its trainer state: "done" (a training with this job's
    settings and stop target that reached its target or train.max_steps: scored again, not retrained), "partial"
    (the same training interrupted after a checkpoint: resumed from it), or None (nothing usable: trained afresh)."""
    out = Path(config.out.dir)
    saved = comparable(saved_run_config(out))
    if saved is None or saved != comparable(config.to_dict()):
        return None, {}
    state = load_trainer_state(out)
    if state.get("until", "unrecorded") != until:
        return None, {}
    finished = int(state.get("step", 0)) >= config.train.max_steps or (until is not None and "stopped" in state)
    return ("done" if finished else "partial"), state


def run_jobs(jobs: list[TaskJob], workers: int, logs: Path) -> list[dict[str, Any]]:
    """Every job, `workers` at a time in spawned processes (in this process when 1), with a line per finished job."""
    started, results = time.perf_counter(), []

    def finished(job: TaskJob, result: dict[str, Any]) -> None:
        results.append(result)
        print(f"[{len(results)}/{len(jobs)}, {(time.perf_counter() - started) / 60:.1f} min] {job.name}: "
              f"{result['status']} ({result['seconds']:.0f} s)", flush=True)

    if workers <= 1:
        for job in jobs:
            finished(job, run_task_job(job))
        return results
    print(f"{len(jobs)} trainings in {workers} worker processes ({jobs[0].threads} thread(s) each); logs in {logs}",
          flush=True)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(run_task_job, job, logs / f"{job.name}.log"): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            try:
                result = future.result()
            except Exception as error:  # the worker process itself died
                result = {"task": job.task, "encoding": job.encoding, "seed": job.seed, "seconds": 0.0,
                          "status": f"failed: worker died ({type(error).__name__}: {error})"[:300]}
            finished(job, result)
    return results


@dataclass
class Suite:
    """What a task suite measured, each a dict task -> encoding -> ...: `results`, length -> metric -> mean, t
    interval over seeds and the seeds' values; `training`, {"seeds", "steps", "reached"}: the steps each seed
    trained and whether it reached the stop target; `grids` (retrieval tasks), the length x distance grid
    (aggregate_grid)."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    training: dict[str, dict[str, Any]] = field(default_factory=dict)
    grids: dict[str, dict[str, Any]] = field(default_factory=dict)

    def update(self, other: "Suite") -> None:
        for mine, theirs in ((self.results, other.results), (self.training, other.training),
                             (self.grids, other.grids)):
            mine.update(theirs)


def difference_record(values: list[float], full: dict[str, Any], window: dict[str, Any]) -> dict[str, Any]:
    """A rate's difference full - window paired by seed as results files keep it: the mean with
    experiments.seed_intervals.paired_rate_difference's interval (inside [-1, 1], never narrower than either part)
    and the seeds' own differences."""
    found = paired_rate_difference(values, estimate(full), estimate(window))
    return {**found.__dict__, "values": values}


def rate_record(metric: str, values: list[float], count: int | None, threshold: float | None) -> dict[str, Any]:
    """A rate over seeds (exact match, token accuracy) as results files keep it: eval.stats.rate_over_seeds, an
    interval inside [0, 1] (exact match: each seed's rate is a whole number of the `count` sequences scored, so the
    interval holds both the t interval over seeds and the pooled Wilson interval; token accuracy: the t interval
    over seeds cut to [0, 1]), the seeds' values and, for exact match, how many reach `threshold`."""
    exact = metric == "exact_match"
    return rate_over_seeds(values, count if exact else None, threshold if exact else None).record()


def aggregate_grid(grids: list[dict], count: int | None = None,
                   threshold: float | None = DEFAULT_UNTIL) -> dict[str, dict[str, dict]]:
    """The seeds' retrieval grids (eval/retrieval.py retrieval_grid, in seed order) as one: per cell, each
    metric of the model ("full") and of its window control ("window") over seeds (rate_record: `count` sequences
    per cell, `threshold` for "k of n seeds"), and their difference full - window paired by seed ("difference", a
    t interval on the per-seed differences)."""
    merged: dict[str, dict[str, dict]] = {}
    for key, cells in grids[0].items():
        for distance, first in cells.items():
            cell_of = [grid[key][distance] for grid in grids]
            merged.setdefault(key, {})[distance] = {"distance": first["distance"], **{
                part: {metric: rate_record(metric, [c[part][metric] for c in cell_of], count, threshold)
                       for metric in first["full"]}
                for part in ("full", "window")},
                "difference": {}}
            parts = merged[key][distance]
            for metric in first["full"]:
                parts["difference"][metric] = difference_record(
                    [c["full"][metric] - c["window"][metric] for c in cell_of], parts["full"][metric],
                    parts["window"][metric])
    return merged


def run_suite(tasks: list[str], encodings: dict[str, dict], seeds: list[int], length: int, multiples: list[int],
              count: int, shared: dict, runs: Path, workers: int = 1, until: float | None = None,
              methods: tuple[str, ...] = ()) -> Suite:
    """Train and score every task, encoding (name -> the model settings that make it, e.g. {"position": "rope"}
    or a comparison's variant) and seed, over the seeds that finished (a failed training is reported and left
    out). until: stop each training once validation exact match at L reaches it (0.0 stops at the first check;
    None: no target, train to max_steps; the CLI's and compare's 0 mean None). methods: inference-time methods
    the retrieval grids are also scored under (each as the variant "ENCODING+METHOD"), where they apply."""
    jobs = [TaskJob(task, encoding, settings, seed, length, tuple(multiples), count, shared, str(runs), until=until,
                    methods=tuple(methods)) for task in tasks for encoding, settings in encodings.items()
            for seed in seeds]
    workers, threads = worker_layout(workers, len(jobs))
    jobs = [dataclasses.replace(job, threads=threads if workers > 1 else 0) for job in jobs]
    finished = run_jobs(jobs, workers, runs / "logs")
    threshold = until if until else DEFAULT_UNTIL  # a seed "learned" at this exact match
    failed = [f"{r['task']}-{r['encoding']}-seed{r['seed']}: {r['status']}" for r in finished if r["status"] != "ok"]
    if failed:
        print("failed (left out of the results):\n  " + "\n  ".join(failed), file=sys.stderr)
    suite = Suite()
    for task in tasks:
        suite.results[task], suite.training[task], suite.grids[task] = {}, {}, {}
        for encoding in encodings:
            done = [r for r in sorted(finished, key=lambda r: r["seed"])
                    if r["task"] == task and r["encoding"] == encoding and r["status"] == "ok"]
            rows = [r["rows"] for r in done]
            if rows:
                suite.training[task][encoding] = {key: [r[name] for r in done] for key, name in
                                                  (("seeds", "seed"), ("steps", "steps"), ("reached", "reached"))}
                suite.results[task][encoding] = {
                    key: {metric: rate_record(metric, [row[key][metric] for row in rows], count, threshold)
                          for metric in rows[0][key]} for key in rows[0]}
            if done and all("grids" in r for r in done):
                for method in done[0]["grids"]:
                    suite.grids[task][label(encoding, method)] = aggregate_grid(
                        [r["grids"][method] for r in done], min(count, GRID_COUNT), threshold)
        if not suite.grids[task]:
            del suite.grids[task]
    return suite


def _draw(axis, results: dict[str, Any], task: str, length: int) -> None:
    for encoding, by_length in results.items():
        multiples = [int(key[:-1]) for key in by_length]
        estimates = [by_length[key]["exact_match"] for key in by_length]
        axis.plot(multiples, [e["mean"] for e in estimates], **figures.style(encoding), label=encoding)
        if all(e["low"] is not None for e in estimates):  # the 95% interval (rate_record), as a band
            axis.fill_between(multiples, [min(1.0, max(0.0, e["low"])) for e in estimates],
                              [min(1.0, max(0.0, e["high"])) for e in estimates], color=figures.colour(encoding),
                              alpha=0.15, linewidth=0)
    axis.set_xscale("log", base=2)
    shown = sorted({int(key[:-1]) for by_length in results.values() for key in by_length})
    axis.set_xticks(shown, [f"{multiple}x" for multiple in shown])
    axis.set_ylim(-0.03, 1.03)
    axis.set_xlabel(f"evaluation length / L (L = {length})")
    axis.set_title(task)


def plot(results: dict[str, dict[str, Any]], length: int, path: Path) -> Path:
    """One panel per task: exact match against length, one line per encoding."""
    figure, axes = figures.new(columns=len(results), width=3.4 * len(results) + 1.5, height=3.6)
    axes = list(axes) if len(results) > 1 else [axes]
    for axis, (task, by_encoding) in zip(axes, results.items()):
        _draw(axis, by_encoding, task, length)
    axes[0].set_ylabel("exact match (band: 95% interval over seeds)")
    return figures.save(figure, path, axes[-1])


def estimate(saved: dict[str, Any]) -> Estimate:
    """A saved metric (mean, low, high, n and, since they were kept, the seeds' values) as an Estimate."""
    return Estimate(**{key: saved[key] for key in ("mean", "low", "high", "n")})


def rate_cell(saved: dict[str, Any], digits: int = 2) -> str:
    """A saved rate as a table shows it: 'mean [low, high]', then 'k/n' (the seeds that reach the threshold) where
    the record counts them (results written before it did: the interval alone)."""
    text = estimate(saved).format(digits)
    return text if saved.get("reached") is None else f"{text} {saved['reached']}/{saved['n']}"


def rate_caption(records: list[dict[str, Any]]) -> str:
    """What the intervals and the k/n of `records` (saved rates of one table) are, in words."""
    methods = {record.get("interval") for record in records}
    thresholds = {record.get("threshold") for record in records} - {None}
    if methods == {"seeds and trials"}:
        words = ("the mean of the seeds' rates [95% interval holding the t interval over seeds, cut to 0..1, and "
                 "the pooled Wilson interval of the sequences scored]")
    elif methods == {"t over seeds, clipped to [0, 1]"}:
        words = "the mean of the seeds' rates [95% t interval over seeds, cut to 0..1]"
    else:
        words = "the mean of the seeds' rates [95% interval]"
    if thresholds:
        words += (f"; k/n: the seeds whose exact match reaches {min(thresholds):g} (learned at 1x, retrieved past "
                  "it)")
    return words


def steps_cell(runs: dict[str, Any]) -> str:
    """Each seed's training steps, `*` on those that ran to the cap without reaching the stop target."""
    return " / ".join(f"{n:,}" + ("*" if reached is False else "")
                      for n, reached in zip(runs.get("steps", []), runs.get("reached", []))) or "n/a"


def table(results: dict[str, dict[str, Any]], length: int, seeds: list[int],
          training: dict[str, dict[str, Any]] | None = None) -> str:
    """Markdown: per task, exact match at each length over seeds (rate_cell: the mean [95% interval] and the
    seeds that reach the stop target), and each seed's training steps when they are known."""
    records = [row["exact_match"] for by_encoding in results.values() for by_length in by_encoding.values()
               for row in by_length.values()]
    if all("interval" in record for record in records):
        lines = [f"Exact match at each multiple of L = {length} over seeds {seeds}: {rate_caption(records)}.", ""]
    else:  # results written before rate_record: t intervals over seeds
        lines = [f"Exact match at each multiple of L = {length}, mean [95% t interval] over seeds {seeds}.", ""]
    for task, by_encoding in results.items():
        if not by_encoding:
            continue
        keys = list(next(iter(by_encoding.values())))
        steps = (training or {}).get(task, {})
        extra = [" steps (each seed) |"] if steps else []
        lines += [f"| {task} | " + " | ".join(keys) + " |" + "".join(extra), "|---|" + "---|" * (len(keys) + len(extra))]
        for encoding, by_length in by_encoding.items():
            cells = [rate_cell(by_length[key]["exact_match"]) for key in keys]
            if steps:
                cells.append(steps_cell(steps.get(encoding, {})))
            lines.append(f"| {encoding} | " + " | ".join(cells) + " |")
        lines.append("")
    if any(reached is False for by_encoding in (training or {}).values() for runs in by_encoding.values()
           for reached in runs.get("reached", [])):
        lines += ["Steps: each seed's training steps; * ran to train.max_steps without reaching the stop target.", ""]
    return "\n".join(lines)


def grid_table(grids: dict[str, Any], metric: str = "exact_match") -> list[str]:
    """Markdown: the retrieval grid of one task, a row per encoding and a column per (length, answer distance):
    the model's `metric` over seeds [95% interval inside 0..1, rate_record], then its difference from its window
    control, paired by seed [95% t interval]."""
    if not grids:
        return []
    first = next(iter(grids.values()))
    cells = [(key, label) for key, by_label in first.items() for label in by_label]
    titles = [f"{key}, d = {first[key][label]['distance']} ({label})" for key, label in cells]
    lines = []
    for part, what in (("full", f"{metric.replace('_', ' ')}"),
                       ("difference", f"{metric.replace('_', ' ')}: the model minus its window control")):
        lines += [f"{what} (length, answer distance d in tokens)", "",
                  "| encoding | " + " | ".join(titles) + " |", "|---|" + "---:|" * len(cells)]
        for encoding, grid in grids.items():
            lines.append(f"| {encoding} | " + " | ".join(
                estimate(grid[key][label][part][metric]).format(2, signed=part == "difference")
                if key in grid and label in grid[key] else "n/a" for key, label in cells) + " |")
        lines.append("")
    return lines


def write_suite(out: Path, length: int, seeds: list[int], suite: Suite, settings: dict | None = None) -> None:
    """Per task OUT/TASK/results.json and OUT/TASK/TASK.png; OUT/tasks.md (the tables, and the length x distance
    grid of each retrieval task) and OUT/tasks.png (every task); one line per task and encoding."""
    results = suite.results
    for task, by_encoding in results.items():
        folder = out / task
        folder.mkdir(parents=True, exist_ok=True)
        record = {"task": task, "length": length, "seeds": seeds, "settings": settings, "results": by_encoding,
                  "training": suite.training.get(task, {})}
        if task in suite.grids:
            record["grid"] = suite.grids[task]
        (folder / "results.json").write_text(results_json(record))
        if by_encoding:
            plot({task: by_encoding}, length, folder / f"{task}.png")
        for encoding, by_length in by_encoding.items():
            shown = ", ".join(f"{key} {row['exact_match']['mean']:.2f}" for key, row in by_length.items())
            print(f"{task} {encoding}: exact match {shown}")
    text = table(results, length, seeds, suite.training)
    for task, grids in suite.grids.items():
        text += "\n".join([f"### {task}: answer distance past L", "",
                           "Each model on test sequences whose answers lie d tokens before their queries, and the same "
                           f"weights with attention limited to the last L = {length} keys (its window control). A "
                           "difference whose interval excludes 0 at d > L: the model uses what lies past L.", "",
                           *grid_table(grids)]) + "\n"
    (out / "tasks.md").write_text(text)
    shown = [task for task, by_encoding in results.items() if by_encoding]
    if shown:
        print(f"wrote {out / 'tasks.md'} and {plot({task: results[task] for task in shown}, length, out / 'tasks.png')}")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.tasks", __doc__, epilog="Overrides: --model.key=value, --train.key=value "
                                                          f"(defaults: model {DEFAULT_MODEL}, train {DEFAULT_TRAIN})")
    parser.add_argument("--tasks", default=",".join(SUITE), help=f"comma-separated, from {sorted(TASKS)}")
    renamed(parser, "--task", "--tasks")
    parser.add_argument("--encodings", default="rope,alibi,none,sinusoidal",
                        help="comma-separated model.position names, or names of --variants")
    parser.add_argument("--variants", default="",
                        help="named model settings --encodings may list, as a TOML inline table: "
                             "'{rope-randomized = {position = \"rope\", random_positions = 2048}}'")
    parser.add_argument("--length", type=int, default=DEFAULT_LENGTH, help="training length L in tokens")
    parser.add_argument("--multiples", default="1,2,4,8", help="evaluation lengths as multiples of L")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated training seeds")
    parser.add_argument("--count", type=int, default=256, help="evaluation sequences per length")
    parser.add_argument("--methods", default="",
                        help="inference-time methods the retrieval tasks' grids are also scored under, where they "
                             "apply (e.g. yarn); every retrieval model is also scored under its window control")
    parser.add_argument("--until", type=float, default=DEFAULT_UNTIL,
                        help=f"stop each training once exact match at L on {VAL_COUNT} validation sequences, checked "
                             "every train.eval_interval steps, reaches this; else train to train.max_steps, the cap "
                             "(0: always train to the cap)")
    parser.add_argument("--workers", type=int, default=0,
                        help="training processes (0: one single-thread process per CPU core)")
    add_out(parser, "output folder: tasks.md, tasks.png, TASK/results.json, TASK/TASK.png, runs/ (required)",
            type=Path)
    return parser


def parse_variants(text: str) -> dict[str, dict]:
    """--variants: a TOML inline table of named model settings, each naming its model.position."""
    if not text:
        return {}
    try:
        variants = tomllib.loads(f"variants = {text}")["variants"]
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--variants is a TOML inline table such as '{{rope-randomized = {{position = \"rope\", "
                          f"random_positions = 2048}}}}' ({error})") from error
    if not isinstance(variants, dict) or any(not isinstance(v, dict) or "position" not in v for v in variants.values()):
        raise ConfigError(f"--variants: each variant is a table of model settings with a position, got {text!r}")
    return variants


@cli_command
def main(argv: list[str] | None = None) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    tasks = [get_task(name).name for name in comma_list(args.tasks)]
    if args.out is None:
        raise ConfigError("--out DIR is required")
    variants = parse_variants(args.variants)
    encodings = comma_list(args.encodings)
    unknown = [name for name in encodings if name not in POSITION_ENCODINGS and name not in variants]
    if unknown:
        raise ConfigError(f"--encodings: unknown {unknown}; valid names are {sorted(POSITION_ENCODINGS)} and the "
                          f"--variants {sorted(variants)}")
    try:
        seeds = [int(seed) for seed in comma_list(args.seeds)]
        multiples = [int(multiple) for multiple in comma_list(args.multiples)]
    except ValueError as error:
        raise ConfigError(f"--seeds and --multiples are comma-separated integers ({error})") from error
    if not tasks or not seeds or not multiples or min(multiples) < 1 or args.length < 4 or args.count < 1:
        raise ConfigError("--tasks, --seeds and --multiples need values (multiples >= 1), --length >= 4, --count >= 1")
    if not 0 <= args.until <= 1:
        raise ConfigError(f"--until is an exact match in [0, 1], got {args.until}")
    if args.workers < 0:
        raise ConfigError("--workers must be >= 0 (0: one per CPU core)")
    shared: dict[str, dict] = {"model": dict(DEFAULT_MODEL), "train": {}}
    for override in overrides:
        if not override.startswith(("--model.", "--train.")) or "=" not in override:
            raise ConfigError(f"unexpected argument {override!r}: overrides look like --model.key=value or "
                              "--train.key=value")
        dotted, text = override[2:].split("=", 1)
        section, key = dotted.split(".", 1)
        shared[section][key] = parse_override_value(text)
    shared["train"] = task_train(shared["train"])
    settings_of = {name: variants.get(name, {"position": name}) for name in encodings}
    for name in tasks:  # every setting and length is checked before anything trains
        task = get_task(name)
        for encoding, settings in settings_of.items():
            build_run_config({**shared, "model": {**shared["model"], **settings, "vocab_size": task.vocab_size,
                                                  "max_seq_len": args.length}}, f"experiments.tasks settings of {encoding}")
        task.batch(0, 1, max(multiples) * args.length)
    started = time.perf_counter()
    methods = check_methods(comma_list(args.methods))
    suite = run_suite(tasks, settings_of, seeds, args.length, multiples, args.count, shared, args.out / "runs",
                      args.workers, args.until or None, tuple(methods))
    settings = {"model": shared["model"], "train": shared["train"], "count": args.count, "until": args.until or None,
                "wall_s": round(time.perf_counter() - started, 1)}
    write_suite(args.out, args.length, seeds, suite, settings)
    print(f"wall time {settings['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
