"""Peak memory and time of one evaluation forward at a long length, per encoding (or model variant), each in a
fresh process so the peaks do not mix.

    python -m scripts.eval_memory --length 4096
    python -m scripts.eval_memory --length 4096 --variants '[{"position": "fire"}, {"position": "rope", "attention_window": [64]}]'

The shape is the full comparison preset's (dim 256, 4 layers, 8 heads, 4 KV heads, L = 256, vocabulary 4096),
random weights, batch 1, float32, one thread. Prints one JSON line per variant: its settings, the loss (a sanity
check: ~ln(vocab) for random weights), the peak resident memory of the process and the forward's seconds.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from commands import command_parser
from errors import ConfigError, cli_command
from model.config import ModelConfig
from model.transformer import Transformer

SHAPE = {"vocab_size": 4096, "dim": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 256}
DEFAULT_VARIANTS = [
    {"position": "rope"}, {"position": "alibi"}, {"position": "t5"}, {"position": "shaw"}, {"position": "kerple"},
    {"position": "fire"}, {"position": "xpos"}, {"position": "cope"}, {"position": "rope", "rope_fraction": 0.25},
    {"position": "rope", "rope_p": 0.75}, {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"]},
    {"position": "rope", "position_layers": ["rope", "rope", "rope", "none"], "attention_window": [64, 64, 64, 0]},
    {"position": "rope", "attention_methods": [{"method": "rerope"}, {"method": "logn"}]},
    {"position": "rope", "attention_methods": [{"method": "selfextend", "group": 16}]},
    {"position": "rope", "attention_methods": [{"method": "sinks"}]},
]


def measure(settings: dict, length: int) -> dict:
    """One forward of `length` tokens in this process; its peak RSS (MiB) and seconds."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**SHAPE, **settings})).eval()
    idx = torch.randint(0, SHAPE["vocab_size"], (1, length))
    started = time.perf_counter()
    with torch.inference_mode():
        _, loss = model(idx[:, :-1], idx[:, 1:])
    return {"settings": settings, "length": length, "loss": round(loss.item(), 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "seconds": round(time.perf_counter() - started, 2)}


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.eval_memory", __doc__)
    parser.add_argument("--length", type=int, default=4096, help="tokens in the forward (16 x L = 4096)")
    parser.add_argument("--variants", help="a JSON list of model settings (default: every encoding and hybrid)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this JSON settings dict here
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.length < 2:
        raise ConfigError("--length must be at least 2")
    if args.one is not None:
        print(json.dumps(measure(json.loads(args.one), args.length)), flush=True)
        return 0
    try:
        variants = json.loads(args.variants) if args.variants else DEFAULT_VARIANTS
    except json.JSONDecodeError as error:
        raise ConfigError(f"--variants must be a JSON list of settings dicts ({error})") from error
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise ConfigError("--variants must be a JSON list of settings dicts")
    for settings in variants:
        result = subprocess.run([sys.executable, "-m", "scripts.eval_memory", "--length", str(args.length), "--one",
                                 json.dumps(settings)], capture_output=True, text=True)
        if result.returncode != 0:
            print(json.dumps({"settings": settings, "error": result.stderr.strip().splitlines()[-1:]}), flush=True)
            continue
        print(result.stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
