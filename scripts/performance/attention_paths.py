"""The attention backend every encoding takes (model/attention/registry.py), and why: in a training step, in a 16x
evaluation and in cached decoding, each run for real on a model of the quick preset's shape.

    python -m scripts.performance.attention_paths   # every registered encoding, on this machine's device
    python -m scripts.performance.attention_paths --device cuda --out runs/paths
    python -m scripts.performance.attention_paths --device cuda --flex-cuda   # model.attention_backend = "flex"

The three situations are the ones the project runs:
  - training: the train loop's forward with a loss, gradients on, at L with --batch sequences, in the trainer's
    default precision (bf16 autocast where the device supports it);
  - 16x evaluation: score_windows (eval/scoring.py) on windows of 16 L, float32 and no gradients, as
    eval.extrapolation and experiments.compare score them (its batch: as many windows as fit its token budget; a learned
    table under the clamp method, as the evaluation scores it past its end);
  - cached decoding: one new token through the KV cache after a prefill of L - 1 tokens, as generation runs it.
Each cell is what the layers' latest forward took (Transformer.attention_paths: equal neighbouring layers merged).
Writes OUT/attention_paths.md and .json when --out is given.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from commands import add_device, add_out, command_parser, parse
from errors import ConfigError, PositionRangeError, cli_command
from eval.scoring import score_windows
from model.config import ModelConfig
from model.encodings import POSITION_ENCODINGS
from model.kv_cache import KVCache
from model.methods import METHODS
from model.runtime import autocast, autocast_dtype, configure_runtime, resolve_device
from model.transformer import Transformer

# The quick preset's model (configs/compare.toml).
SHAPE = {"vocab_size": 4096, "dim": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64}
SITUATIONS = ("training", "16x evaluation", "cached decoding")


def paths_of(settings: dict, device: torch.device, batch: int, shape: dict | None = None) -> dict[str, dict]:
    """{situation: {layers: path}} for one model (encoding and settings), each from a real forward."""
    shape = {**SHAPE, **(shape or {})}
    config = ModelConfig(**{**shape, **settings})
    torch.manual_seed(0)
    model = Transformer(config).to(device)
    length, vocab = config.max_seq_len, config.vocab_size
    generator = np.random.default_rng(0)
    found = {}
    model.train()
    ids = torch.from_numpy(generator.integers(0, vocab, (batch, length + 1))).to(device)
    with autocast(device, autocast_dtype(device, "auto")):
        model(ids[:, :-1], ids[:, 1:])
    found["training"] = model.attention_paths()
    windows = generator.integers(0, vocab, (2, 16 * length + 1))
    try:
        score_windows(model, windows)
        found["16x evaluation"] = model.attention_paths()
    except PositionRangeError:  # a learned table: the evaluation scores it past its end under the clamp method
        clamped = model.under(METHODS["clamp"], 16 * length, length)
        score_windows(clamped, windows)
        found["16x evaluation"] = {layers: f"{path} (under the clamp method)"
                                   for layers, path in clamped.attention_paths().items()}
    with torch.inference_mode():
        cache = KVCache.for_model(config, 1, length)
        prompt = torch.from_numpy(generator.integers(0, vocab, (1, length))).to(device)
        model(prompt[:, :-1], kv_cache=cache)
        model(prompt[:, -1:], kv_cache=cache)  # the L-th token, one step
    found["cached decoding"] = model.attention_paths()
    return found


def markdown(rows: dict[str, dict[str, dict]]) -> str:
    lines = ["| encoding | " + " | ".join(SITUATIONS) + " |", "|---|" + "---|" * len(SITUATIONS)]
    for name, by_situation in rows.items():
        cells = ["<br>".join(f"{layers}: {path}" if len(paths) > 1 else path for layers, path in paths.items())
                 for paths in (by_situation[situation] for situation in SITUATIONS)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.performance.attention_paths", __doc__)
    parser.add_argument("--encodings", help="comma-separated encodings (default: every registered one)")
    parser.add_argument("--batch", type=int, default=32, help="training sequences (the quick preset's batch)")
    add_device(parser)
    parser.add_argument("--flex-cuda", action="store_true",
                        help='models with model.attention_backend = "flex": FlexAttention on CUDA for the bias '
                             'encodings (model/attention/flex.py)')
    add_out(parser, "folder for attention_paths.md and .json (default: print only)", type=Path, default=None)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    names = args.encodings.split(",") if args.encodings else list(POSITION_ENCODINGS)
    unknown = [name for name in names if name not in POSITION_ENCODINGS]
    if unknown:
        raise ConfigError(f"--encodings: unknown {unknown}; valid names are {sorted(POSITION_ENCODINGS)}")
    device = resolve_device(args.device)
    backend = {"attention_backend": "flex"} if args.flex_cuda else {}
    rows = {name: paths_of({"position": name, **backend}, device, args.batch) for name in names}
    table = markdown(rows)
    print(f"Attention paths on {device.type} (d = {SHAPE['dim']}, {SHAPE['n_layers']} layers, L = "
          f"{SHAPE['max_seq_len']}; training batch {args.batch}):\n")
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention_paths.md").write_text(table)
        (args.out / "attention_paths.json").write_text(json.dumps({"device": device.type, "shape": SHAPE,
                                                                   "flex_cuda": args.flex_cuda, "rows": rows},
                                                                  indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
