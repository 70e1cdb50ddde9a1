"""Context extension: continue pretraining a RoPE checkpoint at a longer length with a RoPE scaling fixed in
its config, following the YaRN paper's recipe at small scale (short run, small learning rate, warmup).

    python -m train.extend --init runs/tiny --rope-scaling yarn --rope-factor 4 --seq-len 1024 --steps 200
    python -m train.extend --init runs/tiny --rope-scaling linear --rope-factor 2 --train.lr=1e-4

The new checkpoint's config records the scaling with original_max_position_embeddings = the length the
--init checkpoint was trained at, and max_seq_len = --seq-len, so scripts.generate and the eval commands use
it without extra flags. Training data defaults to the --init run's data folder. The validation loss at
step 0 is the --init model with the scaling at inference time only, at the new length.
"""
from __future__ import annotations

import argparse
import sys

from data.batches import PretrainBatches, read_meta
from data.tokenizer import load_tokenizer
from errors import ConfigError
from model.checkpoint import load_config, load_trainer_state
from train.cli import check_vocab, model_factory, run_cli
from train.config import load_run_config
from train.loop import run_training

# The YaRN paper fine-tunes for 400 steps with lr 2e-5 (about 1/15 of Llama 2's peak) and 20 warmup steps.
# At this scale: a few hundred steps, a learning rate well below pretraining's.
DEFAULT_TRAIN = {"lr": 3e-4, "warmup_steps": 20, "min_lr_ratio": 0.1, "batch_size": 4, "log_interval": 10}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other settings: --train.key=value, --data.dir=..., --out.dir=...")
    parser.add_argument("--init", required=True, help="the RoPE checkpoint to extend")
    parser.add_argument("--rope-scaling", required=True, choices=["yarn", "linear", "ntk", "dynamic", "llama3"])
    parser.add_argument("--rope-factor", type=float, required=True, help="scaling factor S >= 1")
    parser.add_argument("--seq-len", type=int, help="training length (default S x the trained length)")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    parser.add_argument("--resume", action="store_true", help="continue the run saved in out.dir")
    args, overrides = parser.parse_known_args(argv)

    def body() -> None:
        base = load_config(args.init)
        if base.position != "rope":
            raise ConfigError(f"train.extend extends RoPE checkpoints; {args.init} uses position = {base.position!r}")
        state = load_trainer_state(args.init)
        trained = int(state.get("trained_seq_len", base.max_seq_len))
        seq_len = args.seq_len or int(round(args.rope_factor * trained))
        model = {**base.to_dict(), "max_seq_len": seq_len, "rope_scaling": {
            "rope_type": args.rope_scaling, "factor": args.rope_factor, "original_max_position_embeddings": trained}}
        data_dir = state.get("run_config", {}).get("data", {}).get("dir", "")
        defaults = [f"--train.{key}={value}" for key, value in DEFAULT_TRAIN.items()]
        config = load_run_config(None, [
            *defaults, f"--train.max_steps={args.steps}", f"--train.eval_interval={max(1, args.steps // 4)}",
            f"--data.dir={data_dir}", f"--out.dir={args.init.rstrip('/')}_{args.rope_scaling}{args.rope_factor:g}x",
            *overrides], model_base=model)
        meta = read_meta(config.data.dir)
        check_vocab(config, int(meta["vocab_size"]), config.data.dir)
        pretrain_tokens = int(state.get("tokens_seen", 0))
        tokens = config.train.max_steps * config.train.batch_size * config.train.grad_accum * seq_len
        share = f" ({100 * tokens / pretrain_tokens:.1f}% of its {pretrain_tokens:,} pretraining tokens)" if pretrain_tokens else ""
        print(f"extending {args.init} from {trained} to {seq_len} tokens with {args.rope_scaling} x{args.rope_factor:g}: "
              f"{tokens:,} fine-tuning tokens{share}")
        batches = PretrainBatches(config.data.dir, seq_len, config.train.batch_size, config.train.seed,
                                  config.train.eval_batches)
        extra = {"init": args.init, "extended_from": trained, "pretrain_tokens": pretrain_tokens}
        run_training(config, model_factory(config, args.init), batches, load_tokenizer(args.init), args.resume,
                     task="extend", extra_state=extra)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
