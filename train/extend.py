"""Context extension: continue pretraining a RoPE checkpoint at a longer length with a RoPE scaling fixed in
its config, following the YaRN paper's recipe at small scale (short run, small learning rate, warmup).

    python -m train.extend --checkpoint runs/tiny --rope-scaling yarn --rope-factor 4 --length 1024
    python -m train.extend --checkpoint runs/tiny --rope-scaling linear --rope-factor 2 --train.lr=1e-4
    python -m train.extend --checkpoint runs/tiny --rope-scaling yarn --rope-factor 4 --method pose

--method pose (PoSE, Zhu et al. 2024) trains on windows of the checkpoint's own length whose position ids are
split into two chunks with a random skip between them, so they cover the target length (--length) without
attending over it: the same steps cost a factor target / trained fewer tokens (data/batches.py, PoseBatches).

The new checkpoint's config records the scaling with original_max_position_embeddings = the length the
checkpoint was trained at, and max_seq_len = --length, so scripts.generate and the eval commands use
it without extra flags. Training data defaults to the checkpoint's data folder, and training to 200 steps
(train.max_steps) at lr 3e-4, under any --config file and overrides. The validation loss at step 0 is the
checkpoint's model with the scaling at inference time only, at the new length.
"""
from __future__ import annotations

import argparse
import sys

from commands import renamed, require
from data.batches import PoseBatches, PretrainBatches, read_meta
from data.tokenizer import load_tokenizer
from errors import ConfigError, DataError, cli_command
from model.checkpoint import load_config, load_trainer_state, trained_length
from model.data_folder import training_data_dir
from model.rope import ROPE_SCALINGS
from train.args import build_parser as training_parser
from train.args import parse_args
from train.cli import check_vocab, model_factory, resolve_resume
from train.config import load_run_config
from train.loop import Training, run_training

# The YaRN paper fine-tunes for 400 steps with lr 2e-5 (about 1/15 of Llama 2's peak) and 20 warmup steps.
# At this scale: a few hundred steps, a learning rate well below pretraining's.
DEFAULT_TRAIN = {"lr": 3e-4, "warmup_steps": 20, "min_lr_ratio": 0.1, "batch_size": 4, "log_interval": 10,
                 "max_steps": 200}
LENGTH_SCALINGS = sorted(name for name in ROPE_SCALINGS if name != "default")



def build_parser() -> argparse.ArgumentParser:
    parser = training_parser("train.extend", __doc__, data_help="a prepared data folder (default: the checkpoint's)")
    parser.add_argument("--rope-scaling", choices=LENGTH_SCALINGS, help="the scaling to train with (required)")
    parser.add_argument("--rope-factor", type=float, help="scaling factor S >= 1 (required)")
    parser.add_argument("--length", type=int, help="target length in tokens (default: S x the trained length); with "
                        "--method full also the training window")
    parser.add_argument("--method", choices=["full", "pose"], default="full",
                        help="full: train on windows of the target length; pose: windows of the trained length "
                             "with skipped position ids covering the target length")
    renamed(parser, "--seq-len", "--length")
    renamed(parser, "--steps", "--train.max_steps=N")
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, overrides = parse_args(parser, argv)
    require(parser, args, "checkpoint", "rope_scaling", "rope_factor")

    base = load_config(args.checkpoint)
    if base.position != "rope":
        raise ConfigError(f"train.extend extends RoPE checkpoints; {args.checkpoint} uses position = "
                          f"{base.position!r}")
    state = load_trainer_state(args.checkpoint)
    trained = trained_length(args.checkpoint)
    seq_len = args.length or int(round(args.rope_factor * trained))
    model = {**base.to_dict(), "max_seq_len": seq_len, "rope_scaling": {
        "rope_type": args.rope_scaling, "factor": args.rope_factor, "original_max_position_embeddings": trained}}
    try:  # the checkpoint's own data folder, unless --data or the config names one
        own_data, data_missing = training_data_dir(args.checkpoint), None
    except DataError as error:
        own_data, data_missing = "", error
    defaults = {
        "train": DEFAULT_TRAIN,
        "data": {"dir": own_data},
        "out": {"dir": f"{args.checkpoint.rstrip('/')}_{args.rope_scaling}{args.rope_factor:g}x"
                       f"{'_pose' if args.method == 'pose' else ''}"},
    }
    steps = load_run_config(args.config, overrides, model_base=model, base=defaults).train.max_steps
    defaults["train"] = {**DEFAULT_TRAIN, "eval_interval": max(1, steps // 4)}  # unless set otherwise
    config, resume = resolve_resume(load_run_config(args.config, overrides, model_base=model, base=defaults),
                                    overrides, args.resume)
    if data_missing is not None and not config.data.dir:
        raise data_missing
    meta = read_meta(config.data.dir)
    check_vocab(config, int(meta["vocab_size"]), config.data.dir)
    pretrain_tokens = int(state.get("tokens_seen", 0))
    window = trained if args.method == "pose" else seq_len
    tokens = config.train.max_steps * config.train.batch_size * config.train.grad_accum * window
    share = f" ({100 * tokens / pretrain_tokens:.1f}% of its {pretrain_tokens:,} pretraining tokens)" if pretrain_tokens else ""
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
    run_training(Training(config, model_factory(config, args.checkpoint), batches, load_tokenizer(args.checkpoint),
                 resume, task="extend", extra_state=extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
