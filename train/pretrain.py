"""Pretrain a model from scratch on a prepared data folder.

    python -m data.prepare --source stdlib --out runs/data/stdlib
    python -m train.pretrain --config configs/tiny.toml
    python -m train.pretrain --config configs/tiny.toml --train.max_steps=200 --out.dir=runs/short
    python -m train.pretrain --config configs/tiny.toml --resume        # continue the run in out.dir
    python -m train.pretrain --config configs/passkey_finetune.toml --init runs/tiny   # fine-tune a checkpoint

With --init the model starts from that checkpoint's weights, and its config.json is the base of [model]
(keys set in the file or on the command line still apply; shapes must match the weights).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from data.batches import PretrainBatches, read_meta
from data.tokenizer import load_tokenizer
from model.checkpoint import CheckpointError, load_config, load_weights_into
from model.config import ConfigError
from model.transformer import Transformer
from train.config import RunConfig, load_run_config
from train.loop import TrainingInterrupted, run_training


def parse_args(argv: list[str] | None, description: str) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any config key can be overridden as --section.key=value, e.g. --train.lr=1e-3 --model.position=none",
    )
    parser.add_argument("--config", help="TOML run config (see configs/)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in out.dir")
    parser.add_argument("--init", help="start from this checkpoint's weights and model config (fine-tuning)")
    return parser.parse_known_args(argv)


def model_factory(config: RunConfig, init: str | None) -> Callable[[], Transformer]:
    """Fresh weights, or the weights of the --init checkpoint."""
    if init is None:
        return lambda: Transformer(config.model)
    return lambda: load_weights_into(Transformer(config.model), init)


def check_vocab(config: RunConfig, tokenizer_vocab: int, where: str) -> None:
    if tokenizer_vocab > config.model.vocab_size:
        raise ConfigError(
            f"the tokenizer in {where} has {tokenizer_vocab} tokens but model.vocab_size is "
            f"{config.model.vocab_size}; set --model.vocab_size={tokenizer_vocab} or larger"
        )


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv, __doc__)
    try:
        model_base = load_config(args.init).to_dict() if args.init else None
        config = load_run_config(args.config, overrides, model_base)
        meta = read_meta(config.data.dir)
        check_vocab(config, int(meta["vocab_size"]), config.data.dir)
        tokenizer = load_tokenizer(config.data.dir)
        batches = PretrainBatches(
            config.data.dir, config.model.max_seq_len, config.train.batch_size, config.train.seed, config.train.eval_batches
        )
        extra_state = {"data": meta, "init": args.init}
        run_training(config, model_factory(config, args.init), batches, tokenizer, args.resume, extra_state=extra_state)
    except TrainingInterrupted as stop:
        print(stop, file=sys.stderr)
        return 130
    except (ConfigError, CheckpointError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
