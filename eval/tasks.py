"""Length-generalisation tasks: train a small model per encoding and seed on a synthetic task at length L (loss on
the answers only), then score exact match at 1x, 2x, 4x and 8x L on fresh sequences (eval/task_generators.py).

    python -m eval.tasks --task copy --encodings rope,alibi,none,sinusoidal --length 64 --seeds 1,2,3 \\
        --train.max_steps=600 --out runs/tasks

Every encoding and seed trains the same model shape on the same sequences (a function of the seed and the step);
evaluation sequences come from a separate seed. Writes OUT/results.json (per encoding and length: exact match and
token accuracy with a t interval over seeds) and OUT/TASK.png.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import torch

from commands import add_out, comma_list, command_parser
from data.batches import IGNORE_INDEX
from errors import ConfigError, cli_command
from eval import figures
from eval.stats import t_interval
from eval.task_generators import TASKS, Task, TaskBatch, get_task, score
from model.checkpoint import load_model
from model.config import parse_override_value
from model.position import POSITION_ENCODINGS
from model.transformer import Transformer
from train.config import build_run_config
from train.loop import run_training

EVAL_SEED = 10**6  # evaluation sequences: a seed no training batch uses
DEFAULT_MODEL = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}
DEFAULT_TRAIN = {"batch_size": 32, "max_steps": 600, "lr": 3e-3, "warmup_steps": 30, "eval_interval": 200,
                 "eval_batches": 4, "log_interval": 100, "dtype": "float32"}


class TaskBatches:
    """The training loop's batch source for a task: loss only on the answer targets."""

    def __init__(self, task: Task, length: int, batch_size: int, seed: int, val_batches: int) -> None:
        self.task, self.length, self.batch_size, self.seed, self.val_batches = task, length, batch_size, seed, val_batches

    @staticmethod
    def masked(batch: TaskBatch) -> tuple[torch.Tensor, torch.Tensor]:
        return batch.inputs, torch.where(batch.answers, batch.targets, torch.full_like(batch.targets, IGNORE_INDEX))

    def train_batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.masked(self.task.batch([self.seed, step, micro_step], self.batch_size, self.length))

    def val_batches_iter(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in range(self.val_batches):
            yield self.masked(self.task.batch([EVAL_SEED - 1, index], self.batch_size, self.length))


@torch.inference_mode()
def evaluate(model: Transformer, task: Task, length: int, count: int) -> dict[str, float]:
    model.eval()
    batch = task.batch(EVAL_SEED, count, length)
    logits = torch.cat([model(batch.inputs[first : first + 64])[0] for first in range(0, count, 64)])
    return score(logits, batch)


def run_suite(task: Task, encodings: dict[str, dict], seeds: list[int], length: int, multiples: list[int],
              count: int, shared: dict, out: Path) -> dict[str, Any]:
    """Train and score every encoding (name -> the model settings that make it, e.g. {"position": "rope"} or a
    comparison's variant) for every seed; per encoding and length, each metric's mean and t interval over seeds."""
    results: dict[str, Any] = {}
    for encoding, settings in encodings.items():
        per_length: dict[int, list[dict]] = {multiple: [] for multiple in multiples}
        for seed in seeds:
            values = {section: dict(shared.get(section, {})) for section in ("model", "train")}
            values["model"].update(settings, vocab_size=task.vocab_size, max_seq_len=length)
            values["model"].setdefault("learned_clamp", settings["position"] == "learned")
            values["train"]["seed"] = seed
            values["out"] = {"dir": str(out / "runs" / task.name / encoding / f"seed{seed}"), "overwrite": True}
            config = build_run_config(values, f"task {task.name}, {encoding}, seed {seed}")
            run_training(config, lambda: Transformer(config.model),
                         TaskBatches(task, length, config.train.batch_size, seed, config.train.eval_batches),
                         None, task=f"task:{task.name}")
            model = load_model(config.out.dir)
            for multiple in multiples:
                per_length[multiple].append(evaluate(model, task, multiple * length, count))
        results[encoding] = {
            f"{multiple}x": {metric: t_interval([row[metric] for row in rows]).__dict__ for metric in rows[0]}
            for multiple, rows in per_length.items()}
    return results


def plot(results: dict[str, Any], task: str, length: int, out: Path) -> Path:
    figure, axis = figures.new(width=6, height=4)
    for encoding, by_length in results.items():
        multiples = [int(key[:-1]) for key in by_length]
        estimates = [by_length[key]["exact_match"] for key in by_length]
        means = [e["mean"] for e in estimates]
        axis.plot(multiples, means, **figures.style(encoding), label=encoding)
        if all(e["low"] is not None for e in estimates):  # the 95% t interval over seeds, as a band
            axis.fill_between(multiples, [min(1.0, max(0.0, e["low"])) for e in estimates],
                              [min(1.0, max(0.0, e["high"])) for e in estimates], color=figures.colour(encoding),
                              alpha=0.15, linewidth=0)
    axis.set_xscale("log", base=2)
    axis.set_xlabel(f"evaluation length / L (L = {length})")
    axis.set_ylabel("exact match (band: 95% t interval over seeds)")
    axis.set_title(task)
    return figures.save(figure, out / f"{task}.png", axis)


def write_suite(out: Path, task: str, length: int, seeds: list[int], results: dict[str, Any],
                settings: dict | None = None) -> None:
    """OUT/results.json and OUT/TASK.png, and one line per encoding."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"task": task, "length": length, "seeds": seeds,
                                                  "settings": settings, "results": results}, indent=1) + "\n")
    for encoding, by_length in results.items():
        shown = ", ".join(f"{key} {row['exact_match']['mean']:.2f}" for key, row in by_length.items())
        print(f"{task} {encoding}: exact match {shown}")
    print(f"wrote {out / 'results.json'} and {plot(results, task, length, out)}")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.tasks", __doc__, epilog="Overrides: --model.key=value, --train.key=value "
                                                          f"(defaults: model {DEFAULT_MODEL}, train {DEFAULT_TRAIN})")
    parser.add_argument("--task", required=True, help=f"one of {sorted(TASKS)}")
    parser.add_argument("--encodings", default="rope,alibi,none,sinusoidal", help="comma-separated model.position names")
    parser.add_argument("--length", type=int, default=64, help="training length L in tokens")
    parser.add_argument("--multiples", default="1,2,4,8", help="evaluation lengths as multiples of L")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated training seeds")
    parser.add_argument("--count", type=int, default=256, help="evaluation sequences per length")
    add_out(parser, "output folder: results.json, TASK.png, runs/ (required)", type=Path)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    task = get_task(args.task)
    if args.out is None:
        raise ConfigError("--out DIR is required")
    encodings = comma_list(args.encodings)
    unknown = [name for name in encodings if name not in POSITION_ENCODINGS]
    if unknown:
        raise ConfigError(f"--encodings: unknown {unknown}; valid names are {sorted(POSITION_ENCODINGS)}")
    try:
        seeds = [int(seed) for seed in comma_list(args.seeds)]
        multiples = [int(multiple) for multiple in comma_list(args.multiples)]
    except ValueError as error:
        raise ConfigError(f"--seeds and --multiples are comma-separated integers ({error})") from error
    if not seeds or not multiples or min(multiples) < 1 or args.length < 4 or args.count < 1:
        raise ConfigError("--seeds and --multiples need values (multiples >= 1), --length >= 4, --count >= 1")
    shared = {"model": dict(DEFAULT_MODEL), "train": dict(DEFAULT_TRAIN)}
    for override in overrides:
        if not override.startswith(("--model.", "--train.")) or "=" not in override:
            raise ConfigError(f"unexpected argument {override!r}: overrides look like --model.key=value or "
                              "--train.key=value")
        dotted, text = override[2:].split("=", 1)
        section, key = dotted.split(".", 1)
        shared[section][key] = parse_override_value(text)
    build_run_config({**shared, "model": {**shared["model"], "vocab_size": task.vocab_size, "max_seq_len": args.length}},
                     "eval.tasks settings")  # every setting is checked before anything trains
    results = run_suite(task, {name: {"position": name} for name in encodings}, seeds, args.length, multiples,
                        args.count, shared, args.out)
    write_suite(args.out, task.name, args.length, seeds, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
