"""Command-line flags for inference-time RoPE scaling, and loading a checkpoint for inference with them; shared
by generate and the eval commands.

    --rope-scaling yarn --rope-factor 4 [--rope-param beta_fast=16 --rope-param truncate=false]

`original_max_position_embeddings` defaults to the context the checkpoint was trained at.
"""
from __future__ import annotations

import argparse
import sys

import torch
from transformers import PreTrainedTokenizerFast

from data.tokenizer import load_tokenizer
from errors import ConfigError
from model.checkpoint import load_model
from model.config import parse_override_value
from model.rope import ROPE_SCALINGS, SCALING_KEYS
from model.runtime import resolve_device
from model.transformer import Transformer

NO_SCALING = "none"


def add_rope_scaling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("inference-time RoPE scaling (RoPE checkpoints only)")
    group.add_argument(
        "--rope-scaling",
        choices=[NO_SCALING, *sorted(name for name in ROPE_SCALINGS if name != "default")],
        help="scaling to use instead of the checkpoint's own (none = plain RoPE)",
    )
    group.add_argument("--rope-factor", type=float, help="scaling factor s >= 1, e.g. eval length / trained length")
    group.add_argument(
        "--rope-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra scaling key in transformers' names, e.g. beta_fast=16, truncate=false, attention_factor=1.0",
    )


def rope_scaling_from_args(args: argparse.Namespace) -> dict | None:
    """The scaling dict the flags ask for; None for plain RoPE. Raises ValueError for inconsistent flags."""
    if args.rope_scaling in (None, NO_SCALING):
        if args.rope_factor is not None or args.rope_param:
            raise ConfigError("--rope-factor and --rope-param need --rope-scaling NAME")
        return None
    scaling = {"rope_type": args.rope_scaling}
    if args.rope_factor is not None:
        scaling["factor"] = args.rope_factor
    elif "factor" in SCALING_KEYS[args.rope_scaling] and not any(p.startswith("factor=") for p in args.rope_param):
        raise ConfigError(f"--rope-scaling {args.rope_scaling} needs --rope-factor S (e.g. the evaluation length / "
                          "the trained length)")
    for item in args.rope_param:
        if "=" not in item:
            raise ConfigError(f"--rope-param {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        scaling[key] = parse_override_value(value)
    return scaling


def apply_rope_scaling_args(model: Transformer, args: argparse.Namespace) -> None:
    """Switch the model to the scaling the flags ask for; without --rope-scaling it keeps its own."""
    if args.rope_scaling is None and args.rope_factor is None and not args.rope_param:
        return
    own = model.config.rope_scaling
    model.set_rope_scaling(rope_scaling_from_args(args))
    if own is not None:
        print(f"note: --rope-scaling replaces the checkpoint's own scaling {own}; the length it refers to stays "
              f"{model.config.original_length} (the length before extension)", file=sys.stderr)


def load_for_inference(args: argparse.Namespace) -> tuple[Transformer, PreTrainedTokenizerFast, torch.device]:
    """What generate and the eval commands do first: the model of --checkpoint on --device, with the
    --rope-scaling flags applied, and its tokenizer."""
    device = resolve_device(args.device)
    model = load_model(args.checkpoint, device)
    apply_rope_scaling_args(model, args)
    return model, load_tokenizer(args.checkpoint), device
