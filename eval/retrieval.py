"""Retrieval past the trained length: a retrieval task's exact match on a grid of input length x answer distance,
for a model and for its window control (the same weights with attention limited to the last L keys). The difference
says whether the model uses what lies past L, where the text penalty can only say it is not harmed by it.

    python -m eval.retrieval --checkpoint runs/compare_map/work/tasks/mqar/alibi/seed1 --task mqar \
        --lengths 64x --distances 0.5x,8x,16x,32x,63x --out runs/alibi_far

Scores checkpoints trained on a retrieval task (experiments.tasks, or a comparison's tasks) at any input length and
answer distance, with and without the window control. Writes OUT/results.json (each checkpoint's cells: distance,
length, exact match and token accuracy, full and window) and OUT/table.md. grid_over_seeds: the grids of one
encoding's seeds as one, with 95% intervals (experiments.tasks reports them)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commands import add_device, add_out, comma_list, command_parser, parse, results_json
from data.tasks import EVAL_SEED, Task, get_task
from errors import ConfigError, cli_command
from eval.extrapolation import parse_lengths, resolve_length
from eval.stats import paired_rate_difference, rate_over_seeds
from eval.task_score import evaluate
from model.checkpoint import load_model, trained_length
from model.methods import NONE, method_spec
from model.runtime import configure_runtime, resolve_device
from model.transformer import Transformer

# The answer distances of the retrieval grid, as multiples of the trained length L: one within L, the rest past it.
GRID_DISTANCES = (0.5, 2, 4, 8)


def distance_label(multiple: float) -> str:
    return "L/2" if multiple == 0.5 else f"{multiple:g}L"


def grid_cells(task: Task, trained: int, multiples: list[int]) -> list[tuple[str, str, int]]:
    """(length key "Mx", distance label, distance in tokens) for every cell of the retrieval grid: each evaluation
    length M x L and each answer distance of GRID_DISTANCES that it holds (distance <= length); a distance the
    length cannot hold exactly (the queries and the pairs take room) is the largest it holds."""
    cells = []
    for multiple in multiples:
        length = multiple * trained
        for far in GRID_DISTANCES:
            if far <= multiple:
                cells.append((f"{multiple}x", distance_label(far), min(int(far * trained), task.max_distance(length))))
    return cells


def window_control(model: Transformer, trained: int) -> Transformer:
    """The same weights with every layer's attention limited to the last `trained` keys: the first token (where a
    model parks attention that has nowhere to go: a sink) and the `trained` - 1 keys before each query (the `window`
    attention method with first = 1). Stacked layers still reach n_layers x (trained - 1) tokens back through
    intermediate positions, so the control can retrieve past L only through such relays."""
    return model.with_settings(attention_methods=[{"method": "window", "window": trained - 1, "first": 1}])


def retrieval_grid(model: Transformer, task: Task, trained: int, multiples: list[int], count: int,
                   seed: int | list[int] = EVAL_SEED, method: str = NONE) -> dict[str, dict[str, dict]]:
    """Exact match and token accuracy at every (length, answer distance) of the grid, for the model (under an
    inference-time method, set for each length: model/methods/) and for its window control:
    {"Mx": {label: {"distance": d, "full": metrics, "window": metrics}}}."""
    spec = method_spec(method)
    grid: dict[str, dict[str, dict]] = {}
    for key, label, distance in grid_cells(task, trained, multiples):
        length = int(key[:-1]) * trained
        view = model.under(spec, length, trained)
        grid.setdefault(key, {})[label] = {
            "distance": distance,
            "full": evaluate(view, task, length, count, seed, distance),
            "window": evaluate(window_control(view, trained), task, length, count, seed, distance)}
    return grid


def grid_over_seeds(grids: list[dict], count: int, threshold: float) -> dict[str, dict[str, dict]]:
    """The seeds' retrieval grids (retrieval_grid, in seed order) as one: per cell, the exact match of the model
    ("full") and of its window control ("window") over seeds (eval.stats.rate_over_seeds: `count` sequences per cell,
    `threshold` for the seeds that reach it), and their difference paired by seed (eval.stats.paired_rate_difference:
    the t interval over the seeds' differences joined with the MOVER interval of the two parts)."""
    merged: dict[str, dict[str, dict]] = {}
    for key, by_label in grids[0].items():
        for name, first in by_label.items():
            parts = [grid[key][name] for grid in grids]
            full, window = (rate_over_seeds([part[side]["exact_match"] for part in parts], count, threshold).estimate
                            for side in ("full", "window"))
            difference = paired_rate_difference([p["full"]["exact_match"] - p["window"]["exact_match"] for p in parts],
                                                full, window)
            merged.setdefault(key, {})[name] = {"distance": first["distance"], "full": full, "window": window,
                                                "difference": difference}
    return merged


def score_checkpoint(model: Transformer, task: Task, trained: int, lengths: list[int], distances: list[str],
                     count: int) -> list[dict]:
    """Every (length, distance) cell that fits, for the model and its window control."""
    cells = []
    for length in lengths:
        for item in distances:
            distance = resolve_length(item, trained)
            if not task.min_distance <= distance <= task.max_distance(length):
                continue
            cells.append({"length": length, "distance": distance, "full": evaluate(model, task, length, count,
                                                                                    distance=distance),
                          "window": evaluate(window_control(model, trained), task, length, count, distance=distance)})
    return cells


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.retrieval", __doc__)
    parser.add_argument("--checkpoint", metavar="DIR", nargs="+", help="checkpoints trained on the task (required)")
    parser.add_argument("--task", default="mqar", help="a retrieval task: mqar or niah_multikey (default: mqar)")
    parser.add_argument("--lengths", default="8x", help="input lengths: multiples of the trained length (8x) or "
                                                         "token counts (default: 8x)")
    parser.add_argument("--distances", default="0.5x,2x,4x,8x",
                        help="answer distances, multiples of the trained length or token counts; a cell whose "
                             "distance its length cannot hold is left out (default: 0.5x,2x,4x,8x)")
    parser.add_argument("--count", type=int, default=128, help="sequences per cell (default: 128)")
    add_device(parser)
    add_out(parser, "output folder: results.json and table.md (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()
    args = parse(build_parser(), argv, "checkpoint", "out")
    task = get_task(args.task)
    if task.make_at is None:
        raise ConfigError(f"--task {args.task} has no answer distance to set; the retrieval tasks are mqar and "
                          "niah_multikey")
    if args.count < 1:
        raise ConfigError(f"--count must be at least 1, got {args.count}")
    lengths, distances = parse_lengths(args.lengths), parse_lengths(",".join(comma_list(args.distances)))
    device = resolve_device(args.device)
    results = []
    for folder in args.checkpoint:
        trained = trained_length(folder)
        model = load_model(folder, device=device)
        if model.config.vocab_size != task.vocab_size:
            raise ConfigError(f"{folder} has a vocabulary of {model.config.vocab_size} tokens and {args.task} uses "
                              f"{task.vocab_size}: it was not trained on this task (or on an older form of it)")
        cells = score_checkpoint(model, task, trained, [resolve_length(item, trained) for item in lengths],
                                 distances, args.count)
        if not cells:
            raise ConfigError(f"{folder}: no --distances fit the --lengths at L = {trained} (a distance must lie "
                              f"between {task.min_distance} and what the length holds)")
        results.append({"checkpoint": str(folder), "trained_length": trained, "cells": cells})
        for cell in cells:
            print(f"{folder}: length {cell['length']}, distance {cell['distance']}: exact match "
                  f"{cell['full']['exact_match']:.3f}, window control {cell['window']['exact_match']:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(results_json({"task": args.task, "count": args.count, "results": results}))
    lines = [f"Exact match on {args.task} ({args.count} sequences per cell), the model and its window control "
             "(attention limited to its last L keys and the first token)", "",
             "| checkpoint | L | length | distance | exact match | window control | difference |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        for cell in result["cells"]:
            full, window = cell["full"]["exact_match"], cell["window"]["exact_match"]
            lines.append(f"| {result['checkpoint']} | {result['trained_length']} | {cell['length']} | "
                         f"{cell['distance']} | {full:.3f} | {window:.3f} | {full - window:+.3f} |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
