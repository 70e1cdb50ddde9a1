"""Context extension: continue pretraining a RoPE checkpoint at a longer length with a RoPE scaling fixed in
its config, following the YaRN paper's recipe at small scale (short run, small learning rate, warmup); or drop
RoPE altogether and recalibrate the model briefly (DroPE).

    python -m train.extend --checkpoint runs/tiny --rope-scaling yarn --rope-factor 4 --length 1024
    python -m train.extend --checkpoint runs/tiny --rope-scaling linear --rope-factor 2 --train.lr=1e-4
    python -m train.extend --checkpoint runs/tiny --rope-scaling yarn --rope-factor 4 --method pose
    python -m train.extend --checkpoint runs/tiny --method drope --recalibration 0.01

--method pose (PoSE, Zhu et al. 2024) trains on windows of the checkpoint's own length whose position ids are
split into two chunks with a random skip between them, so they cover the target length (--length) without
attending over it: the same steps cost a factor target / trained fewer tokens (data/batches.py, PoseBatches).

--method drope (DroPE, Sakana AI 2025, arXiv 2512.12167) removes the position encoding: the new model is the same
weights with model.position = none (NoPE in every layer; RoPE has no weights of its own), recalibrated on windows
of the trained length (--length to change it) for a share of the pretraining tokens (--recalibration, default 1%:
the paper recalibrates on 0.5-2% of the budget; --train.max_steps sets the steps instead). No scaling is involved:
the NoPE model is then evaluated at any length as it is. The trainer state records what was dropped.

The new checkpoint's config records the scaling with original_max_position_embeddings = the length the
checkpoint was trained at, and max_seq_len = --length, so scripts.generate and the eval commands use
it without extra flags. Training data defaults to the checkpoint's data folder, and training to 200 steps
(train.max_steps) at lr 3e-4, under any --config file and overrides. The validation loss at step 0 is the
checkpoint's model with the scaling at inference time only, at the new length.
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from commands import renamed, require
from data.batches import PoseBatches, PretrainBatches, read_meta
from data.tokenizer import load_tokenizer
from errors import ConfigError, DataError, cli_command
from model.checkpoint import load_config, load_trainer_state, trained_length, training_data_dir
from model.methods import ROPE_SCALINGS
from train.args import build_parser as training_parser
from train.args import parse_args
from train.cli import check_vocab, resolve_resume
from train.config import load_run_config
from train.loop import Training, model_factory, run_training

if TYPE_CHECKING:
    from model.config import ModelConfig

# The YaRN paper fine-tunes for 400 steps with lr 2e-5 (about 1/15 of Llama 2's peak) and 20 warmup steps.
# At this scale: a few hundred steps, a learning rate well below pretraining's.
DEFAULT_TRAIN = {"lr": 3e-4, "warmup_steps": 20, "min_lr_ratio": 0.1, "batch_size": 4, "log_interval": 10,
                 "max_steps": 200}
LENGTH_SCALINGS = sorted(name for name in ROPE_SCALINGS if name != "default")
DROPE_SHARE = 0.01  # the recalibration's share of the pretraining tokens (the DroPE paper: 0.5-2%)
# The model settings DroPE takes away, recorded in the new checkpoint's trainer state.
POSITION_SETTINGS = ("position", "position_layers", "position_args", "rope_theta", "rope_layout", "rope_scaling",
                     "random_positions")


def dropped(base: dict) -> dict:
    """The model `base` (a config dict) with its position encoding removed: NoPE in every layer, every weight
    kept (RoPE has none), nothing else changed."""
    return {**base, "position": "none", "position_layers": [], "position_args": {}, "rope_scaling": None,
            "random_positions": 0}


def recalibration_steps(share: float, pretrain_tokens: int, tokens_per_step: int) -> int:
    """The steps that train `share` of the pretraining tokens, at least one."""
    return max(1, math.ceil(share * pretrain_tokens / tokens_per_step))



def build_parser() -> argparse.ArgumentParser:
    parser = training_parser("train.extend", __doc__, data_help="a prepared data folder (default: the checkpoint's)")
    parser.add_argument("--rope-scaling", choices=LENGTH_SCALINGS, help="the scaling to train with (required)")
    parser.add_argument("--rope-factor", type=float, help="scaling factor S >= 1 (required)")
    parser.add_argument("--length", type=int, help="target length in tokens (default: S x the trained length); with "
                        "--method full also the training window")
    parser.add_argument("--method", choices=["full", "pose", "drope"], default="full",
                        help="full: train on windows of the target length; pose: windows of the trained length "
                             "with skipped position ids covering the target length; drope: remove RoPE (NoPE from "
                             "now on) and recalibrate on windows of the trained length")
    parser.add_argument("--recalibration", type=float, metavar="SHARE",
                        help=f"--method drope: the recalibration's tokens as a share of the checkpoint's pretraining "
                             f"tokens (default {DROPE_SHARE:g}); --train.max_steps overrides it")
    renamed(parser, "--seq-len", "--length")
    renamed(parser, "--steps", "--train.max_steps=N")
    return parser


def check_method(parser: argparse.ArgumentParser, args: argparse.Namespace, base: "ModelConfig") -> None:
    """The options each method needs, and the checkpoints it takes (RoPE ones)."""
    if args.method == "drope":
        given = [flag for flag, value in (("--rope-scaling", args.rope_scaling), ("--rope-factor", args.rope_factor))
                 if value is not None]
        if given:
            raise ConfigError(f"--method drope removes RoPE, so {' and '.join(given)} cannot apply; leave them out")
        if base.position != "rope" or any(name not in ("rope", "none") for name in base.layer_encodings):
            raise ConfigError(f"--method drope drops RoPE from RoPE checkpoints (NoPE layers may be mixed in); "
                              f"{args.checkpoint} uses {sorted(set(base.layer_encodings))}")
        if args.recalibration is not None and not 0 < args.recalibration <= 1:
            raise ConfigError(f"--recalibration is a share of the pretraining tokens in (0, 1], got "
                              f"{args.recalibration}")
        return
    require(parser, args, "rope_scaling", "rope_factor")
    if args.recalibration is not None:
        raise ConfigError("--recalibration sets --method drope's budget; use --train.max_steps with --method "
                          f"{args.method}")
    if base.position != "rope":
        raise ConfigError(f"train.extend extends RoPE checkpoints; {args.checkpoint} uses position = "
                          f"{base.position!r}")


@cli_command
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parse_args(parser, argv)
    require(parser, args, "checkpoint")
    base = load_config(args.checkpoint)
    check_method(parser, args, base)
    drope = args.method == "drope"
    state = load_trainer_state(args.checkpoint)
    trained = trained_length(args.checkpoint)
    pretrain_tokens = int(state.get("tokens_seen", 0))
    if drope:
        seq_len = args.length or trained
        model = {**dropped(base.to_dict()), "max_seq_len": seq_len}
        suffix = "_drope"
    else:
        seq_len = args.length or int(round(args.rope_factor * trained))
        model = {**base.to_dict(), "max_seq_len": seq_len, "rope_scaling": {
            "rope_type": args.rope_scaling, "factor": args.rope_factor, "original_max_position_embeddings": trained}}
        suffix = f"_{args.rope_scaling}{args.rope_factor:g}x{'_pose' if args.method == 'pose' else ''}"
    try:  # the checkpoint's own data folder, unless --data or the config names one
        own_data, data_missing = training_data_dir(args.checkpoint), None
    except DataError as error:
        own_data, data_missing = "", error
    window = trained if args.method == "pose" else seq_len
    train_defaults = dict(DEFAULT_TRAIN)
    defaults = {"train": train_defaults, "data": {"dir": own_data}, "out": {"dir": f"{args.checkpoint.rstrip('/')}{suffix}"}}
    first = load_run_config(args.config, overrides, model_base=model, base=defaults).train
    if drope and pretrain_tokens:  # the recalibration's budget: a share of the pretraining tokens (the steps, if
        # given on the command line or in --config, win)
        steps = recalibration_steps(args.recalibration or DROPE_SHARE, pretrain_tokens,
                                    first.batch_size * first.grad_accum * window)
        train_defaults.update(max_steps=steps, warmup_steps=max(1, steps // 10))
        first = load_run_config(args.config, overrides, model_base=model, base=defaults).train
    elif drope and not args.config and not any(override.startswith("--train.max_steps=") for override in overrides):
        raise ConfigError(f"{args.checkpoint} records no pretraining tokens, so --recalibration has no budget to take "
                          "a share of; give the steps with --train.max_steps=N")
    train_defaults["eval_interval"] = max(1, first.max_steps // 4)  # unless set otherwise
    config, resume = resolve_resume(load_run_config(args.config, overrides, model_base=model, base=defaults),
                                    overrides, args.resume)
    if data_missing is not None and not config.data.dir:
        raise data_missing
    meta = read_meta(config.data.dir)
    check_vocab(config, int(meta["vocab_size"]), config.data.dir)
    tokens = config.train.max_steps * config.train.batch_size * config.train.grad_accum * window
    share = f" ({100 * tokens / pretrain_tokens:.1f}% of its {pretrain_tokens:,} pretraining tokens)" if pretrain_tokens else ""
    if drope:
        print(f"dropping RoPE from {args.checkpoint} (NoPE from now on, every weight kept) and recalibrating at "
              f"{seq_len} tokens: {tokens:,} tokens{share}")
    else:
        how = f", PoSE windows of {window} tokens" if args.method == "pose" else ""
        print(f"extending {args.checkpoint} from {trained} to {seq_len} tokens with {args.rope_scaling} "
              f"x{args.rope_factor:g}{how}: {tokens:,} fine-tuning tokens{share}")
    if args.method == "pose":
        batches = PoseBatches(config.data.dir, window, seq_len, config.train.batch_size, config.train.seed,
                              config.train.eval_batches)
    else:
        batches = PretrainBatches(config.data.dir, seq_len, config.train.batch_size, config.train.seed,
                                  config.train.eval_batches)
    extra = {"init": args.checkpoint, "extended_from": trained, "pretrain_tokens": pretrain_tokens,
             "extension_method": args.method, "training_window": window}
    if drope:
        extra["dropped_position"] = {key: base.to_dict()[key] for key in POSITION_SETTINGS}
        extra["recalibration_share"] = tokens / pretrain_tokens if pretrain_tokens else None
    run_training(Training(config, model_factory(config, args.checkpoint), batches, load_tokenizer(args.checkpoint),
                 resume, task="extend", extra_state=extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
