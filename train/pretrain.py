"""Pretrain a model from scratch on a prepared data folder.

    python -m data.prepare --data stdlib --out runs/data/stdlib
    python -m train.pretrain --config configs/tiny.toml
    python -m train.pretrain --config configs/tiny.toml --train.max_steps=200 --out runs/short
    python -m train.pretrain --config configs/tiny.toml --resume        # continue the run in out.dir
    python -m train.pretrain --config configs/passkey_finetune.toml --checkpoint runs/tiny   # fine-tune it
    torchrun --nproc_per_node 2 -m train.pretrain --config configs/tiny.toml   # data-parallel (DDP), same global batch

With --checkpoint the model starts from that checkpoint's weights, and its config.json is the base of [model]
(keys set in the file or on the command line still apply; shapes must match the weights).
"""
from __future__ import annotations

import argparse
import sys

from errors import cli_command
from train.args import build_parser as training_parser
from train.args import parse_args


def build_parser() -> argparse.ArgumentParser:
    return training_parser("train.pretrain", __doc__)


@cli_command
def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(build_parser(), argv)  # names checked before torch loads (train/args.py)
    from data.batches import PretrainBatches, read_meta
    from data.tokenizer import load_tokenizer
    from train.cli import check_vocab, resolve_resume
    from train.loop import Training, load_config_with_init, model_factory, run_training

    config, resume = resolve_resume(load_config_with_init(args, overrides), overrides, args.resume)
    meta = read_meta(config.data.dir)
    check_vocab(config, int(meta["vocab_size"]), config.data.dir)
    tokenizer = load_tokenizer(config.data.dir)
    train = config.train
    batches = PretrainBatches(config.data.dir, config.model.max_seq_len, train.batch_size, train.seed,
                              train.eval_batches)
    extra_state = {"data": meta, "init": args.checkpoint}
    run_training(Training(config, model_factory(config, args.checkpoint), batches, tokenizer, resume,
                          extra_state=extra_state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
