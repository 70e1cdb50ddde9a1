"""What one long scored forward of a real checkpoint costs, in seconds and as a fraction of this machine's matmul
peak measured in the same run, with and without the two things that make a hybrid's long forward affordable:

    python -m scripts.performance.long_forward --checkpoint runs/gemma3_270m --tokens 49152,65536 --out runs/cost

  dense            every layer attends over the whole causal prefix (a local layer computed as a global one: the
                   cost of a sliding window applied as a mask over all keys, less the mask itself) and the head
                   runs at every position;
  windowed         the local layers attend within their windows (O(T x window): model/attention/chunks.py), the
                   head still at every position;
  windowed+scored  and the head only at the scored positions (--scored of them, evenly spread: what a curve of
                   NLL by position needs; model/loss.py's token_cross_entropy skips every other row).

Each forward runs under the precision the grids use (--dtype auto: bfloat16 autocast where the CPU has it natively,
else float32), the modes alternating in every repeat. Its FLOPs are counted for what it computes: 2 x the layers' matmul
parameters per token, 2 x vocabulary x dim per scored position for the head, and per layer and head 2 x head_dim x
T^2 for a global layer's scores and values (bench.forward_flops' convention) or 4 x head_dim x T x window for a
local one. The peak is scripts.bench.matmul_peak: the fastest of a few matmul shapes, so no forward can exceed it.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from data.batches import IGNORE_INDEX
from model.checkpoint import load_model
from model.config import ModelConfig
from model.runtime import autocast, autocast_dtype
from model.transformer import Transformer
from scripts.bench import matmul_peak

MODES = ("dense", "windowed", "windowed+scored")


def forward_flops(model: Transformer, tokens: int, scored: int, dense: bool) -> float:
    """FLOPs of one forward as the module's docstring counts them."""
    config = model.config
    layer_params = sum(module.weight.numel() for name, module in model.named_modules()
                       if isinstance(module, torch.nn.Linear) and name.startswith("layers."))
    attention = 0.0
    for window in config.layer_windows:
        width = config.n_heads * config.head_dim
        attention += 2 * width * tokens**2 if dense or not window else 4 * width * tokens * min(window, tokens)
    return 2 * layer_params * tokens + 2 * config.vocab_size * config.dim * scored + attention


def view_of(model: Transformer, mode: str) -> Transformer:
    """The model itself, or for the dense mode the same weights in a model without windows (a window is held by
    the layers, so a view cannot drop it)."""
    if mode != "dense" or not any(model.config.layer_windows):
        return model
    dense = Transformer(ModelConfig.from_dict({**model.config.to_dict(), "attention_window": []})).eval()
    dense.load_state_dict(model.state_dict())
    return dense


def targets_for(ids: torch.Tensor, mode: str, scored: int) -> torch.Tensor:
    """The window's targets, IGNORE_INDEX outside the scored positions in the scored mode."""
    targets = ids[:, 1:].clone()
    if mode == "windowed+scored":
        keep = torch.zeros(targets.shape[1], dtype=torch.bool)
        keep[torch.linspace(0, targets.shape[1] - 1, scored).long()] = True
        targets[:, ~keep] = IGNORE_INDEX
    return targets


@torch.no_grad()
def one_forward(model: Transformer, ids: torch.Tensor, targets: torch.Tensor, amp: torch.dtype | None) -> float:
    started = time.perf_counter()
    with autocast(torch.device("cpu"), amp):
        model(ids[:, :-1], targets, loss_reduction="none", return_logits=False)
    return time.perf_counter() - started


def measure(model: Transformer, lengths: list[int], scored: int, repeats: int, modes: list[str],
            dtype: str = "auto") -> dict:
    amp = autocast_dtype(torch.device("cpu"), dtype)
    precision = "bf16" if amp == torch.bfloat16 else "fp32"
    peaks = {"fp32": matmul_peak(torch.float32, torch.device("cpu"))}
    if amp == torch.bfloat16:
        peaks["bf16"] = matmul_peak(torch.bfloat16, torch.device("cpu"))
    rows = []
    rng = np.random.default_rng(0)
    for tokens in lengths:
        ids = torch.from_numpy(rng.integers(4, model.config.vocab_size, (1, tokens + 1)))
        views = {mode: view_of(model, mode) for mode in modes}
        targets = {mode: targets_for(ids, mode, min(scored, tokens)) for mode in modes}
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        for repeat in range(repeats):
            for mode in modes[repeat % len(modes):] + modes[: repeat % len(modes)]:
                times[mode].append(one_forward(views[mode], ids, targets[mode], amp))
                print(f"{tokens:,} tokens, {mode}: {times[mode][-1]:.1f} s", flush=True)
        for mode in modes:
            seconds = statistics.median(times[mode])
            heads = tokens if mode != "windowed+scored" else min(scored, tokens)
            flops = forward_flops(model, tokens, heads, mode == "dense")
            rows.append({"tokens": tokens, "mode": mode, "seconds": seconds, "runs": times[mode],
                         "scored": heads, "tflop": flops / 1e12, "gflops": flops / seconds / 1e9,
                         "of_peak": flops / seconds / 1e9 / peaks[precision],
                         "paths": views[mode].attention_paths()})
    return {"precision": precision, "peak_gflops": peaks, "rows": rows}


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers (a bare "AMD EPYC" names no generation)."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                      if ":" in line)
    except OSError:
        return platform.processor() or platform.machine()
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return f"{fields.get('model name', platform.machine())} (family {fields.get('cpu family', '?')}, " \
           f"model {fields.get('model', '?')})"


def table(result: dict) -> str:
    peak = result["peak_gflops"][result["precision"]]
    lines = [f"One scored forward, {result['precision']}, {result['threads']} threads, {result['cpu']}; matmul peak "
             f"{peak:,.0f} GFLOP/s (measured in the same run)", "",
             "| tokens | mode | positions through the head | seconds | TFLOP | GFLOP/s | of peak |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['tokens']:,} | {r['mode']} | {r['scored']:,} | {r['seconds']:.1f} | {r['tflop']:.1f} | "
              f"{r['gflops']:,.0f} | {r['of_peak']:.0%} |" for r in result["rows"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.performance.long_forward", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a pelab checkpoint folder (e.g. runs/gemma3_270m)")
    parser.add_argument("--tokens", default="49152,65536", help="comma-separated window lengths")
    parser.add_argument("--scored", type=int, default=4096, help="positions through the head in the scored mode")
    parser.add_argument("--repeats", type=int, default=1, help="forwards per mode and length (the median is kept)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="auto: bfloat16 autocast where the CPU has it natively, else float32 (the grids' rule)")
    parser.add_argument("--out", required=True, help="folder for long_forward.json and long_forward.md")
    args = parser.parse_args(argv)
    modes = [mode for mode in args.modes.split(",") if mode]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    model = load_model(args.checkpoint).eval()
    result = measure(model, [int(t) for t in args.tokens.split(",")], args.scored, args.repeats, modes, args.dtype)
    result.update(checkpoint=args.checkpoint, cpu=cpu_name(), threads=torch.get_num_threads(),
                  command="python -m scripts.performance.long_forward " + " ".join(argv or sys.argv[1:]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "long_forward.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "long_forward.md").write_text(table(result) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
