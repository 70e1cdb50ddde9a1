"""The induction probe: can a pretrained model copy from far back? No training; any checkpoint.

    python -m eval.induction --checkpoint runs/demo --distances 0.25x,0.5x,1x,2x,4x,8x --out runs/induction

A trial is a sequence of random ordinary tokens (no special tokens) whose last `--block` tokens repeat the block
that starts `distance` tokens earlier: [block][filler][block], distance + block tokens in all. A model with an
induction mechanism predicts the second copy from the first (Olsson et al. 2022), so its loss on the second copy
(every token but the first, which nothing predicts) falls far below its loss on the first copy (the same tokens
with no earlier occurrence, about ln(vocab) or worse). The probe reports both losses by distance, with a t interval
over trials, and the induction gain (first copy minus second, nats): where it vanishes, the model no longer reaches
back that far. Distances are multiples of the trained length L ("2x") or token counts. Writes OUT/results.json and
OUT/induction.png (the loss on the second copy against distance, L marked).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from commands import add_checkpoint, add_device, add_out, comma_list, command_parser, parse, results_json
from errors import ConfigError, cli_command
from eval import figures
from eval.extrapolation import parse_lengths, resolve_length
from eval.stats import bounded_t_interval, t_interval
from infer.rope_args import add_rope_scaling_args, load_for_inference
from model.checkpoint import trained_length
from model.runtime import configure_runtime
from model.transformer import Transformer

# A fleet's probe (experiments.compare): the copied block, at most L / 4, and the trials per length
FLEET_BLOCK, FLEET_TRIALS = 32, 32


def fleet_block(trained: int) -> int:
    return max(2, min(FLEET_BLOCK, trained // 4))


def ordinary_token_ids(tokenizer, vocab_size: int) -> np.ndarray:
    """The ids a random sequence is drawn from: the model's vocabulary without the tokenizer's special tokens."""
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    ids = np.array([i for i in range(min(vocab_size, len(tokenizer))) if i not in special], dtype=np.int64)
    if ids.size < 2:
        raise ConfigError("the tokenizer has fewer than two ordinary tokens to draw random sequences from")
    return ids


def make_trials(ids: np.ndarray, distance: int, block: int, trials: int, seed: int) -> torch.Tensor:
    """(trials, distance + block) random tokens from `ids`; the last `block` repeat those at 0..block-1."""
    if distance < block:
        raise ConfigError(f"the distance between the copies ({distance}) must be at least the block ({block} tokens)")
    rng = np.random.default_rng([seed, distance, block])
    tokens = rng.choice(ids, size=(trials, distance + block))
    tokens[:, distance:] = tokens[:, :block]
    return torch.from_numpy(tokens)


@torch.inference_mode()
def copy_losses(model: Transformer, tokens: torch.Tensor, block: int, batch: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Per trial, the mean loss on the first copy and on the second copy of the block, each over its tokens
    1..block-1 (token 0 of a copy has nothing that predicts it)."""
    model.eval()
    device = next(model.parameters()).device
    first, second = [], []
    distance = tokens.shape[1] - block
    for start in range(0, tokens.shape[0], batch):
        rows = tokens[start : start + batch].to(device)
        logits = model(rows[:, :-1])[0].float()
        losses = F.cross_entropy(logits.transpose(1, 2), rows[:, 1:], reduction="none")  # (rows, T-1): loss of t+1
        first.append(losses[:, 0 : block - 1].mean(1).cpu())  # targets at positions 1..block-1
        second.append(losses[:, distance : distance + block - 1].mean(1).cpu())  # targets at distance+1..
    return torch.cat(first).numpy(), torch.cat(second).numpy()


def induction_probe(model: Transformer, ids: np.ndarray, distances: list[int], block: int, trials: int,
                    seed: int) -> list[dict[str, Any]]:
    rows = []
    for distance in distances:
        first, second = copy_losses(model, make_trials(ids, distance, block, trials, seed), block)
        rows.append({"distance": distance, "tokens": distance + block,
                     # losses are >= 0: their t intervals over trials cut at 0 (no coverage lost); the gain is signed
                     "first_copy": bounded_t_interval(first, low=0.0).__dict__,
                     "second_copy": bounded_t_interval(second, low=0.0).__dict__,
                     "gain": t_interval(first - second).__dict__})
    return rows


def plot(results: dict[str, Any], path: Path) -> Path:
    figure, axis = figures.new(width=6, height=4)
    for label, entry in results.items():
        rows = entry["rows"]
        x = [row["distance"] for row in rows]
        mean = np.array([row["second_copy"]["mean"] for row in rows])
        low = np.array([row["second_copy"]["low"] for row in rows], dtype=float)
        high = np.array([row["second_copy"]["high"] for row in rows], dtype=float)
        line, = axis.plot(x, mean, marker="o", label=f"{label}: second copy")
        axis.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
        axis.plot(x, [row["first_copy"]["mean"] for row in rows], color=line.get_color(), linestyle=":",
                  label=f"{label}: first copy")
        axis.axvline(entry["trained"], color="grey", linestyle="--", linewidth=1)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("distance between the copies (tokens); dashed: trained length L")
    axis.set_ylabel("loss (nats)")
    axis.set_title("Induction probe: loss on a repeated random block")
    return figures.save(figure, path, axis)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.induction", __doc__)
    add_checkpoint(parser, "the checkpoint to probe (required)")
    parser.add_argument("--distances", default="0.25x,0.5x,1x,2x,4x,8x",
                        help="comma-separated distances between the copies: multiples of the trained length (2x) "
                             "or token counts")
    parser.add_argument("--block", type=int, default=32, help="tokens in the repeated block (>= 2)")
    parser.add_argument("--trials", type=int, default=32, help="random sequences per distance (>= 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random sequences")
    add_device(parser)
    add_out(parser, "output folder: results.json, induction.png (required)", type=Path)
    add_rope_scaling_args(parser)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "checkpoint", "out")
    if args.block < 2 or args.trials < 2:
        raise ConfigError(f"--block and --trials must be at least 2, got {args.block} and {args.trials}")
    model, tokenizer, _ = load_for_inference(args)
    trained = trained_length(args.checkpoint)
    distances = sorted({resolve_length(item, trained) for item in parse_lengths(",".join(comma_list(args.distances)))})
    ids = ordinary_token_ids(tokenizer, model.config.vocab_size)
    rows = induction_probe(model, ids, distances, args.block, args.trials, args.seed)
    for row in rows:
        print(f"distance {row['distance']:6d}: loss first copy {row['first_copy']['mean']:.3f}, second copy "
              f"{row['second_copy']['mean']:.3f} (gain {row['gain']['mean']:+.3f} nats)")
    results = {Path(args.checkpoint).name: {"checkpoint": args.checkpoint, "trained": trained, "block": args.block,
                                            "trials": args.trials, "seed": args.seed, "rows": rows}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(results_json(results))
    print(f"wrote {args.out / 'results.json'} and {plot(results, args.out / 'induction.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
