"""Score trained checkpoints on a synthetic task at multiples of their trained length, optionally with model
settings changed for the evaluation only.

    python -m eval.task_score --task copy --checkpoint runs/tasks/work/tasks/copy/dape/seed1 --multiples 1,2
    python -m eval.task_score --task copy --checkpoint A,B,C --multiples 1,2 --model.position_args.dape.mlp_bias_clip=20

A model setting given as --model.KEY=VALUE replaces the checkpoint's for this scoring: an evaluation-time option
(dape's mlp_bias_clip, random_positions_draw, an attention method's parameters) answers a question about a trained
model without training it again. A setting that changes the weights' shapes is refused when the weights are loaded.
The sequences are those experiments.tasks scores (data/tasks.py, the evaluation seed), so the scores of an
unchanged checkpoint equal the suite's. validation_stop is the suite's stop check during training: exact match at L
on validation sequences.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Callable

import torch

from commands import comma_list, command_parser, results_json
from data.tasks import EVAL_SEED, TASKS, Task, TaskBatch, get_task
from errors import ConfigError
from eval.stats import rate_over_seeds
from model.checkpoint import load_config, load_weights_into, trained_length
from model.config import ModelConfig
from model.fields import parse_override_value, set_dotted
from model.transformer import Transformer


@torch.inference_mode()
def score(logits: torch.Tensor, batch: TaskBatch) -> dict[str, float]:
    """Exact match (every answer of a sequence right) and token accuracy over the answers, from teacher-forced
    logits (n, length - 1, vocab)."""
    right = (logits.argmax(-1) == batch.targets) | ~batch.answers
    answered = batch.answers.sum()
    token_accuracy = float(((logits.argmax(-1) == batch.targets) & batch.answers).sum() / answered.clamp(min=1))
    return {"exact_match": float(right.all(dim=1).float().mean()), "token_accuracy": token_accuracy}


@torch.inference_mode()
def evaluate(model: Transformer, task: Task, length: int, count: int, seed: int | list[int] = EVAL_SEED,
             distance: int | None = None) -> dict[str, float]:
    """Exact match and token accuracy on `count` sequences of `length` from `seed` (on the model's device); with a
    `distance`, sequences whose answers lie that far before their queries (retrieval tasks)."""
    model.eval()
    batch = task.batch(seed, count, length, distance=distance)
    device = next(model.parameters()).device
    logits = torch.cat([model(batch.inputs[first : first + 64].to(device))[0].cpu() for first in range(0, count, 64)])
    return score(logits, batch)


VALIDATION_COUNT = 256  # validation sequences at L for the stop check


def validation_stop(task: Task, length: int, target: float,
                    count: int = VALIDATION_COUNT) -> Callable[[Transformer, int], str | None]:
    """A training's stop check (train.loop's stop_when): stop once exact match at `length` on `count` validation
    sequences (the seed EVAL_SEED - 1, which no training batch and no test uses) reaches `target`."""
    def check(model: Transformer, step: int) -> str | None:
        value = evaluate(model, task, length, count, seed=[EVAL_SEED - 1, 1])["exact_match"]
        print(f"step {step:5d} | validation exact match at L {value:.4f} (stop at {target:g})", flush=True)
        return f"validation exact match {value:.4f} >= {target:g}" if value >= target else None
    return check


def configured(folder: str, overrides: list[str]) -> ModelConfig:
    """The checkpoint's model config with each --model.KEY=VALUE of `overrides` set."""
    values = {"model": dataclasses.asdict(load_config(folder))}
    for override in overrides:
        if not override.startswith("--model.") or "=" not in override:
            raise ConfigError(f"unexpected argument {override!r}: a setting to change looks like --model.key=value")
        dotted, text = override[2:].split("=", 1)
        set_dotted(values, dotted, parse_override_value(text), f"override {override!r}")
    return ModelConfig.from_dict(values["model"])


def load_changed(folder: str, overrides: list[str]) -> Transformer:
    """The checkpoint's weights in a model built from its config with `overrides` set."""
    source = f"{folder}'s model config with {' '.join(overrides)}" if overrides else "the model config"
    return load_weights_into(Transformer(configured(folder, overrides)), folder, source)


def score_checkpoints(task_name: str, folders: list[str], multiples: list[int], count: int,
                      overrides: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """{checkpoint: {"Nx": {"exact_match", "token_accuracy"}}} for each checkpoint at each multiple of its
    trained length."""
    task = get_task(task_name)
    scores = {}
    for folder in folders:
        model = load_changed(folder, overrides)
        length = trained_length(folder)
        with torch.no_grad():
            scores[folder] = {f"{multiple}x": evaluate(model, task, multiple * length, count)
                              for multiple in multiples}
    return scores


def table(scores: dict[str, dict[str, dict[str, float]]], multiples: list[int], count: int | None = None) -> list[str]:
    """Token accuracy / exact match per checkpoint and multiple, then the mean over checkpoints with a 95% interval
    inside [0, 1] (eval.stats.rate_over_seeds: exact match, `count` sequences per checkpoint, with the pooled
    Wilson interval; token accuracy, the t interval cut to [0, 1])."""
    columns = [f"{multiple}x" for multiple in multiples]
    lines = ["| checkpoint | " + " | ".join(f"{column} token accuracy / exact match" for column in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for folder, row in scores.items():
        lines.append(f"| {folder} | " + " | ".join(
            f"{row[column]['token_accuracy']:.3f} / {row[column]['exact_match']:.3f}" for column in columns) + " |")
    if len(scores) > 1:
        cells = [" / ".join(rate_over_seeds([row[column][metric] for row in scores.values()],
                                            count if metric == "exact_match" else None).estimate.format(3)
                            for metric in ("token_accuracy", "exact_match")) for column in columns]
        lines.append("| mean [95% interval, inside 0..1] | " + " | ".join(cells) + " |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.task_score", __doc__)
    parser.add_argument("--task", required=True, help=f"the task the checkpoints were trained on, from {sorted(TASKS)}")
    parser.add_argument("--checkpoint", required=True, metavar="DIRS",
                        help="comma-separated checkpoints (e.g. one per seed: the table adds their mean)")
    parser.add_argument("--multiples", default="1,2", help="evaluation lengths as multiples of each checkpoint's "
                        "trained length")
    parser.add_argument("--count", type=int, default=256, help="evaluation sequences per length")
    parser.add_argument("--json", metavar="FILE", type=Path, help="also write the scores as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, overrides = build_parser().parse_known_args(argv)
    try:
        multiples = [int(multiple) for multiple in comma_list(args.multiples)]
    except ValueError as error:
        raise ConfigError(f"--multiples are comma-separated integers ({error})") from error
    if not multiples or min(multiples) < 1 or args.count < 1:
        raise ConfigError("--multiples need values >= 1 and --count >= 1")
    folders = comma_list(args.checkpoint)
    scores = score_checkpoints(args.task, folders, multiples, args.count, overrides)
    print("\n".join(table(scores, multiples, args.count)))
    if args.json:
        args.json.write_text(results_json({"task": args.task, "overrides": overrides, "count": args.count,
                                           "scores": scores}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
