"""Dynamic NTK on a trained RoPE checkpoint: three ways to score the same held-out tokens beyond L.

    python -m experiments.dynamic_check --checkpoint runs/compare_full/runs/rope/seed1 --data runs/compare_full/data \
        --lengths 2x,4x

  before  factor = k, one forward per k*L window (how eval.extrapolation scored "rope+dynamic" before)
  cached  factor 1, token by token through the KV cache (experiments.compare now, and cached generation)
  exact   factor 1, a fresh full forward of every prefix: each token under the base of its own prefix length in
          every layer (quadratic cost, so only a few windows)
Prints the mean loss (nats) of the tokens at positions >= L under each, and plain RoPE for reference.
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import torch

from commands import add_checkpoint, comma_list, command_parser, parse, renamed
from data.tokenizer import load_tokenizer
from errors import CheckpointError, ConfigError, cli_command
from eval.heldout import checkpoint_eval_tokens
from eval.scoring import score_incremental, score_prefixes, score_windows
from eval.segments import choose_segments, tiled_windows
from model.checkpoint import load_model, trained_length
from model.methods import method_spec
from model.runtime import configure_runtime


def compare_dynamic(checkpoint: str, data: str, multiples: list[int], windows: int) -> list[dict]:
    model = load_model(checkpoint)
    if model.config.position != "rope":
        raise CheckpointError(f"{checkpoint} uses position = {model.config.position!r}; dynamic NTK needs a RoPE checkpoint")
    trained = trained_length(checkpoint)
    ids, scored = checkpoint_eval_tokens(data, checkpoint, load_tokenizer(checkpoint))
    print(f"{checkpoint}: {scored}")
    rows = []
    for multiple in multiples:
        length = multiple * trained
        batch = tiled_windows(ids, choose_segments(len(ids), length, windows * length, margin=trained), length)
        plain = score_windows(model, batch)[:, trained:]
        before = score_windows(model.with_settings(rope_scaling={"rope_type": "dynamic", "factor": float(multiple)}),
                               batch)[:, trained:]
        dynamic = model.under(method_spec("dynamic"), length, trained)
        cached = score_incremental(dynamic, batch, trained)[:, trained:]
        exact = score_prefixes(dynamic, batch, trained)[:, trained:]
        rows.append({"multiple": multiple, "windows": len(batch), "tokens": int(cached.size),
                     "plain": float(plain.mean()), "before": float(before.mean()), "cached": float(cached.mean()),
                     "exact": float(exact.mean()), "cached_minus_exact": float((cached - exact).mean()),
                     "mean_abs_difference": float(np.abs(cached - exact).mean())})
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("experiments.dynamic_check", __doc__)
    add_checkpoint(parser, "a RoPE checkpoint folder (required)")
    parser.add_argument("--data", help="a prepared folder (its val.bin) or a raw source (required)")
    parser.add_argument("--lengths", default="2x,4x", help="comma-separated multiples of the trained length")
    renamed(parser, "--multiples", "--lengths 2x,4x")
    parser.add_argument("--windows", type=int, default=4, help="windows per length (exact scoring is quadratic)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "checkpoint", "data")
    torch.set_num_threads(args.threads)
    items = comma_list(args.lengths)
    if not all(item.endswith("x") and item[:-1].isdigit() and int(item[:-1]) >= 2 for item in items):
        raise ConfigError(f"--lengths must be whole multiples of the trained length, at least 2x (e.g. 2x,4x), got {items}")
    multiples = [int(item[:-1]) for item in items]
    rows = compare_dynamic(args.checkpoint, args.data, multiples, args.windows)
    for row in rows:
        shown = ", ".join(f"{name} {row[name]:.4f} (ppl {math.exp(row[name]):.1f})"
                          for name in ("plain", "before", "cached", "exact"))
        print(f"{row['multiple']}x, {row['windows']} windows, {row['tokens']:,} tokens at positions >= L: {shown}; "
              f"cached - exact {row['cached_minus_exact']:+.4f} nats (mean |.| {row['mean_abs_difference']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
