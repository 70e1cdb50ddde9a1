"""Passkey retrieval: can the model find a number hidden at some depth of a long filler text?

    python -m eval.passkey --checkpoint runs/passkey_ft --lengths 1x,2x,4x --depths 0,0.5,1 --trials 5 \\
        --out runs/passkey
    python -m eval.passkey --make-data runs/passkey_data/train.jsonl --checkpoint runs/tiny --lengths 64,128,256 \\
        --samples 4000          # training documents for the passkey fine-tune recipe (docs/evaluation.md)

The prompt is the landmark-attention / YaRN template, lines joined by newlines: the task description,
filler ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
repeated), "The pass key is K. Remember it. K is the pass key.", more filler, and
"What is the pass key? The pass key is". The filler is sized so the prompt has at most LENGTH tokens,
with the key line after DEPTH of it (0 = start, 1 = end). A trial scores 1 when the first integer in the
greedy continuation (10 tokens) equals K. Each cell's accuracy comes with its Wilson 95% interval over the trials
(use --trials 50 or more for an interval narrower than about +-0.15). Writes OUT/results.json and the heatmap
OUT/passkey.png.

A model that was never taught the task retrieves nothing: on the `make demo` checkpoint every cell is 0%. Teach it
first with the fine-tune recipe of docs/evaluation.md (configs/passkey_finetune.toml, about 7 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from commands import add_checkpoint, add_device, add_out, comma_list, command_parser, parse, renamed, results_json
from data.tokenizer import load_tokenizer
from errors import ConfigError, cli_command
from eval import figures
from eval.extrapolation import parse_lengths, resolve_length
from eval.stats import wilson_interval
from infer.generate import generate_tokens
from infer.rope_args import add_rope_scaling_args, load_for_inference
from model.checkpoint import trained_length
from model.methods import method_spec
from model.runtime import autocast, configure_runtime

INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_LINE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
ANSWER_TOKENS = 10


FLEET_DEPTHS = [0.0, 0.5, 1.0]  # a fleet's probe (experiments.compare): the key at the start, middle and end


def build_prompt(key: int, filler_count: int, depth: float) -> str:
    """The five-line prompt with `filler_count` filler sentences, round(depth * count) of them before the key."""
    if not 0.0 <= depth <= 1.0:
        raise ConfigError(f"depth must be in [0, 1], got {depth}")
    before = round(depth * filler_count)
    prefix = " ".join([FILLER] * before)
    suffix = " ".join([FILLER] * (filler_count - before))
    return "\n".join([INTRO, prefix, KEY_LINE.format(key=key), suffix, QUESTION])


def fit_prompt(key: int, length: int, depth: float, count_tokens: Callable[[str], int]) -> tuple[str, int]:
    """The prompt with the most filler that stays within `length` tokens, and its token count."""
    low, high = 0, 1
    while count_tokens(build_prompt(key, high, depth)) <= length:
        low, high = high, high * 2
    while high - low > 1:  # invariant: `low` fits, `high` does not
        middle = (low + high) // 2
        if count_tokens(build_prompt(key, middle, depth)) <= length:
            low = middle
        else:
            high = middle
    prompt = build_prompt(key, low, depth)
    tokens = count_tokens(prompt)
    if tokens > length:
        raise ConfigError(f"length {length} is too short for the passkey template ({tokens} tokens without filler)")
    return prompt, tokens


def parse_answer(text: str) -> int | None:
    """The first integer in the continuation, or None."""
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None


def evaluate_passkey(model, tokenizer, lengths: list[int], depths: list[float], trials: int, seed: int) -> list[dict]:
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    rng = random.Random(seed)
    rows = []
    for length in lengths:
        for depth in depths:
            correct, prompt_tokens, answers = 0, 0, []
            for _ in range(trials):
                key = rng.randint(1, 50000)
                prompt, prompt_tokens = fit_prompt(key, length, depth, count)
                ids = tokenizer.encode(prompt, add_special_tokens=False)
                generated = list(generate_tokens(model, ids, ANSWER_TOKENS, temperature=0))
                answer = parse_answer(tokenizer.decode(generated))
                correct += int(answer == key)
                answers.append({"key": key, "answer": answer})
            interval = wilson_interval(correct, trials)
            rows.append({"length": length, "prompt_tokens": prompt_tokens, "depth": depth,
                         "accuracy": correct / trials, "low": interval.low, "high": interval.high, "trials": trials,
                         "answers": answers})
            print(f"length {length:6d} depth {depth:4.2f}: {correct}/{trials} ({interval.format(2)}, Wilson 95%)")
    return rows


def passkey_under(model, tokenizer, method: str, length: int, depth: float, trials: int, trained: int,
                  amp: torch.dtype | None = None, seed: int = 0) -> dict:
    """One (length, depth) cell of evaluate_passkey (greedy) under `method` (model/methods/) set for `length`, its
    seconds added."""
    started = time.perf_counter()
    view = model.under(method_spec(method), length, trained)
    with autocast(next(model.parameters()).device, amp):
        [row] = evaluate_passkey(view, tokenizer, [length], [depth], trials, seed)
    return {**row, "method": method, "seconds": time.perf_counter() - started}


def plot_heatmap(rows: list[dict], path: Path, title: str, label: Callable[[dict], str] | None = None,
                 ylabel: str = "key depth") -> None:
    """Accuracy per prompt length (columns) and key depth (rows, the shallowest first), or per label(row) (rows in the
    order `rows` first gives each label, e.g. a method and a depth)."""
    lengths = sorted({row["length"] for row in rows})
    labels = list(dict.fromkeys(map(label, rows))) if label else [f"{d:g}" for d in sorted({r["depth"] for r in rows})]
    label = label or (lambda row: f"{row['depth']:g}")
    grid = [[next(r["accuracy"] for r in rows if r["length"] == n and label(r) == name) for n in lengths]
            for name in labels]
    figure, axis = figures.new(width=1.2 * len(lengths) + 2, height=0.6 * len(labels) + 2)
    image = axis.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    axis.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    axis.set_yticks(range(len(labels)), labels)
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            axis.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize=8)
    axis.set_xlabel("prompt length (tokens)")
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    figure.colorbar(image, ax=axis, label="accuracy")
    figures.save(figure, path)


def make_training_data(path: Path, tokenizer, lengths: list[int], samples: int, seed: int) -> None:
    """Passkey documents (prompt + answer) at random lengths and depths, as a {"text": ...} jsonl."""
    count = lambda text: len(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        for _ in range(samples):
            key = rng.randint(1, 50000)
            length = rng.choice(lengths) - 8  # room for the answer and <|endoftext|>
            prompt, _ = fit_prompt(key, length, rng.random(), count)
            handle.write(json.dumps({"text": f"{prompt} {key}."}) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.passkey", __doc__)
    add_checkpoint(parser, "the checkpoint to evaluate; with --make-data, the one whose tokenizer sizes the "
                           "prompts (required)")
    renamed(parser, "--tokenizer", "--checkpoint")
    parser.add_argument("--lengths", default="1x,2x,4x",
                        help="comma-separated multiples of the trained length (2x) or token counts")
    parser.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="key positions as fractions of the filler")
    parser.add_argument("--trials", type=int, default=5, help="random keys per (length, depth)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the keys and depths")
    add_device(parser)
    add_out(parser, "output folder for results.json and passkey.png (required to evaluate)", type=Path)
    parser.add_argument("--make-data", type=Path, metavar="FILE",
                        help="write passkey training documents (jsonl) here instead of evaluating")
    parser.add_argument("--samples", type=int, default=4000, help="with --make-data: number of documents")
    add_rope_scaling_args(parser)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "checkpoint")
    length_items = parse_lengths(args.lengths)
    try:
        depths = [float(item) for item in comma_list(args.depths)]
    except ValueError:
        raise ConfigError(f"--depths must be comma-separated numbers in [0, 1], got {args.depths!r}")
    if args.make_data:
        if any(item.endswith("x") for item in length_items):
            raise ConfigError("--make-data needs absolute --lengths (token counts)")
        make_training_data(args.make_data, load_tokenizer(args.checkpoint), [int(i) for i in length_items],
                           args.samples, args.seed)
        print(f"wrote {args.samples} passkey documents to {args.make_data}")
        return 0
    if not args.out:
        raise ConfigError("evaluation needs --out")
    model, tokenizer, device = load_for_inference(args)
    trained = trained_length(args.checkpoint)
    lengths = [resolve_length(item, trained) for item in length_items]
    rows = evaluate_passkey(model, tokenizer, lengths, depths, args.trials, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"checkpoint": args.checkpoint, "trained_length": trained,
                               "rope_scaling": model.config.rope_scaling, "rows": rows}
    (args.out / "results.json").write_text(results_json(summary))
    plot_heatmap(rows, args.out / "passkey.png", f"Passkey accuracy: {Path(args.checkpoint).name} (trained {trained})")
    print(f"wrote {args.out / 'results.json'} and {args.out / 'passkey.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
