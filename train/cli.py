"""What the training entry points share: arguments, the model factory, vocabulary checks, error reporting."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from errors import ConfigError, UserError
from model.checkpoint import load_config, load_weights_into
from model.transformer import Transformer
from train.config import RunConfig, load_run_config
from train.loop import NonFiniteLoss, TrainingInterrupted


def parse_args(argv: list[str] | None, description: str, init_required: bool = False):
    """(args, overrides): --config, --resume, --init; every --section.key=value is left as an override."""
    parser = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any config key can be overridden as --section.key=value, e.g. --train.lr=1e-3 --model.position=none",
    )
    parser.add_argument("--config", help="TOML run config (see configs/)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in out.dir")
    parser.add_argument("--init", required=init_required,
                        help="start from this checkpoint's weights; its config.json is the base of [model]")
    return parser.parse_known_args(argv)


def load_config_with_init(args: argparse.Namespace, overrides: list[str]) -> RunConfig:
    """Defaults, then the --init checkpoint's model config, then the TOML file, then the overrides."""
    model_base = load_config(args.init).to_dict() if args.init else None
    return load_run_config(args.config, overrides, model_base)


def model_factory(config: RunConfig, init: str | None) -> Callable[[], Transformer]:
    """Fresh weights, or the weights of the --init checkpoint (shapes checked against config.model)."""
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
