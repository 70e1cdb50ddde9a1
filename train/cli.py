"""What the training entry points share: arguments, the model factory, vocabulary checks, error reporting."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from commands import add_checkpoint, add_out, command_parser, deprecated
from errors import ConfigError, UserError
from model.checkpoint import load_config, load_weights_into
from model.transformer import Transformer
from train.config import RunConfig, load_run_config, toml_value
from train.loop import NonFiniteLoss, TrainingInterrupted


def build_parser(module: str, description: str | None, data_key: str = "data.dir",
                 data_help: str = "a prepared data folder") -> argparse.ArgumentParser:
    """The options every training command shares: --config, --checkpoint, --data, --out, --overwrite, --resume.
    --data, --out and --overwrite are shorthands for the config keys they name."""
    parser = command_parser(module, description, epilog="Any config key can be set as --section.key=value, e.g. "
                                                        "--train.lr=1e-3 --model.position=none")
    parser.add_argument("--config", metavar="FILE", help="TOML run config (see configs/)")
    add_checkpoint(parser, "start from this checkpoint's weights; its config.json is the base of [model]")
    deprecated(parser, "--init", "--checkpoint", "checkpoint")
    parser.add_argument("--data", metavar="PATH", help=f"{data_help}: shorthand for --{data_key}=PATH")
    add_out(parser, "the run folder: shorthand for --out.dir=DIR")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a run already in the run folder: shorthand for --out.overwrite=true")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in the run folder")
    parser.set_defaults(data_key=data_key)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """(args, overrides): the shorthands become overrides after those given as --section.key=value."""
    args, overrides = parser.parse_known_args(argv)
    if args.data is not None:
        overrides.append(f"--{args.data_key}={toml_value(args.data)}")
    if args.out is not None:
        overrides.append(f"--out.dir={toml_value(args.out)}")
    if args.overwrite:
        overrides.append("--out.overwrite=true")
    return args, overrides


def load_config_with_init(args: argparse.Namespace, overrides: list[str]) -> RunConfig:
    """Defaults, then the --checkpoint's model config, then the TOML file, then the overrides."""
    model_base = load_config(args.checkpoint).to_dict() if args.checkpoint else None
    return load_run_config(args.config, overrides, model_base)


def model_factory(config: RunConfig, init: str | None) -> Callable[[], Transformer]:
    """Fresh weights, or the weights of the --checkpoint (shapes checked against config.model)."""
    if init is None:
        return lambda: Transformer(config.model)
    return lambda: load_weights_into(Transformer(config.model), init)


def check_vocab(config: RunConfig, tokenizer_vocab: int, where: str) -> None:
    if tokenizer_vocab > config.model.vocab_size:
        raise ConfigError(
            f"the tokenizer in {where} has {tokenizer_vocab} tokens but model.vocab_size is "
            f"{config.model.vocab_size}; set --model.vocab_size={tokenizer_vocab} or larger"
        )


def run_cli(body: Callable[[], None]) -> int:
    """Run a training entry point's body: an interrupted run exits 130, a non-finite loss 3, bad input (a
    UserError) 2 with one line; anything else is a bug and keeps its traceback."""
    try:
        body()
    except TrainingInterrupted as stop:
        print(stop, file=sys.stderr)
        return 130
    except NonFiniteLoss as stop:
        print(f"error: {stop}", file=sys.stderr)
        return 3
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
