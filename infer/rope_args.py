"""Command-line flags for inference-time RoPE scaling and attention methods, and loading a checkpoint for
inference with them; shared by generate and the eval commands.

    --rope-scaling yarn --rope-factor 4 [--rope-param beta_fast=16 --rope-param truncate=false]
    --attention-method logn --attention-method rerope:window=64      (model/methods/)

`original_max_position_embeddings` defaults to the context the checkpoint was trained at; an attention method's
parameters left out take their defaults from it.
"""
from __future__ import annotations

import argparse
import sys

import torch
from transformers import PreTrainedTokenizerFast

from data.tokenizer import load_tokenizer
from errors import ConfigError
from model.checkpoint import load_model
from model.fields import parse_override_value
from model.methods import ATTENTION_METHODS, ROPE_SCALINGS
from model.runtime import resolve_device
from model.transformer import Transformer

NO_SCALING = "none"


def add_rope_scaling_args(parser: argparse.ArgumentParser) -> None:
    """The --rope-scaling flags and the --attention-method flag."""
    add_attention_method_args(parser)
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


def add_attention_method_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument_group("inference-time attention methods").add_argument(
        "--attention-method", action="append", default=[], metavar="NAME[:KEY=VALUE,...]",
        help=f"an attention method, repeatable: {', '.join(sorted(ATTENTION_METHODS))}; e.g. logn, "
             "rerope:window=64, selfextend:neighbors=128,group=4 (they replace the checkpoint's own)")


def attention_methods_from_args(items: list[str]) -> list[dict]:
    """[{"method": NAME, KEY: VALUE, ...}] from --attention-method NAME[:KEY=VALUE,...] flags."""
    methods = []
    for item in items:
        name, _, params = item.partition(":")
        entry: dict = {"method": name}
        for pair in filter(None, params.split(",")):
            if "=" not in pair:
                raise ConfigError(f"--attention-method {item!r}: parameters look like NAME:KEY=VALUE,KEY=VALUE")
            key, value = pair.split("=", 1)
            entry[key] = parse_override_value(value)
        methods.append(entry)
    return methods


def rope_scaling_from_args(args: argparse.Namespace) -> dict | None:
    """The scaling dict the flags ask for; None for plain RoPE. Raises ValueError for inconsistent flags."""
    if args.rope_scaling in (None, NO_SCALING):
        if args.rope_factor is not None or args.rope_param:
            raise ConfigError("--rope-factor and --rope-param need --rope-scaling NAME")
        return None
    scaling = {"rope_type": args.rope_scaling}
    if args.rope_factor is not None:
        scaling["factor"] = args.rope_factor
    elif "factor" in ROPE_SCALINGS[args.rope_scaling].keys and not any(p.startswith("factor=") for p in args.rope_param):
        raise ConfigError(f"--rope-scaling {args.rope_scaling} needs --rope-factor S (e.g. the evaluation length / "
                          "the trained length)")
    for item in args.rope_param:
        if "=" not in item:
            raise ConfigError(f"--rope-param {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        scaling[key] = parse_override_value(value)
    return scaling


def apply_rope_scaling_args(model: Transformer, args: argparse.Namespace) -> Transformer:
    """The model under the scaling the flags ask for (a view sharing its weights); without --rope-scaling, the
    model with its own."""
    if args.rope_scaling is None and args.rope_factor is None and not args.rope_param:
        return model
    own = model.config.rope_scaling
    model = model.with_rope_scaling(rope_scaling_from_args(args))
    if own is not None:
        print(f"note: --rope-scaling replaces the checkpoint's own scaling {own}; the length it refers to stays "
              f"{model.config.original_length} (the length before extension)", file=sys.stderr)
    return model


def load_for_inference(args: argparse.Namespace) -> tuple[Transformer, PreTrainedTokenizerFast, torch.device]:
    """What generate and the eval commands do first: the model of --checkpoint on --device, with the
    --rope-scaling flags applied, and its tokenizer."""
    device = resolve_device(args.device)
    model = load_model(args.checkpoint, device)
    model = apply_rope_scaling_args(model, args)
    if getattr(args, "attention_method", None):
        model = model.with_settings(attention_methods=attention_methods_from_args(args.attention_method))
    return model, load_tokenizer(args.checkpoint), device
