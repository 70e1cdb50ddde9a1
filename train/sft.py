"""Supervised fine-tuning for chat: continue a pretrained checkpoint on conversations, with the loss on the
assistant turns only (see data/sft.py).

    python -m train.sft --config configs/sft_stdlib.toml --checkpoint runs/tiny
    python -m scripts.generate --checkpoint runs/sft_stdlib --chat --prompt "Write the function ..."

data.source is `stdlib` (offline: standard-library functions from their signature and docstring), a
conversations .jsonl (MiniMind's format) or `minimind` (online). Conversations longer than
model.max_seq_len are cut after the last whole assistant turn that fits, or dropped; both are reported.
"""
from __future__ import annotations

import argparse
import sys

from commands import require
from errors import ConfigError, cli_command
from train.args import build_parser as training_parser
from train.args import parse_args


def build_parser() -> argparse.ArgumentParser:
    return training_parser("train.sft", __doc__, data_key="data.source",
                           data_help="conversations: stdlib, minimind or a .jsonl path")


@cli_command
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parse_args(parser, argv)
    require(parser, args, "checkpoint")
    from data.sft import SFTBatches, build_sft_data  # after the command line is checked (train/args.py)
    from data.tokenizer import load_tokenizer
    from train.cli import check_vocab, resolve_resume
    from train.loop import Training, load_config_with_init, model_factory, run_training

    config, resume = resolve_resume(load_config_with_init(args, overrides), overrides, args.resume)
    tokenizer = load_tokenizer(args.checkpoint)
    check_vocab(config, len(tokenizer), args.checkpoint)
    if not config.data.source:
        raise ConfigError("train.sft needs data.source: stdlib, minimind, or a conversations .jsonl path")
    data = build_sft_data(config.data.source, tokenizer, config.model.max_seq_len + 1, config.data.val_fraction)
    stats = data.stats
    print(f"SFT data {config.data.source}: {stats['train']} train / {stats['val']} held-out conversations; "
          f"{stats['truncated']} cut at a turn boundary, {stats['dropped']} dropped as too long "
          f"(limit {config.model.max_seq_len} tokens)")
    batches = SFTBatches(data, config.train.batch_size, config.train.seed, tokenizer.pad_token_id,
                         config.train.eval_batches)
    run_training(Training(config, model_factory(config, args.checkpoint), batches, tokenizer, resume, task="sft",
                 extra_state={"sft": stats, "init": args.checkpoint}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
