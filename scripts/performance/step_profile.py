"""Where a training step's time goes: ours against transformers' Llama, eager bf16 and compiled, by kind of work.

    python -m scripts.performance.step_profile   # tiny shape; writes runs/bench/step_profile-tiny.{md,json}
    python -m scripts.performance.step_profile --shape small --steps 3

The modes are scripts.bench's (the same models, weights and steps, from scripts/performance/measure.py: ours is
the train loop's own step, bf16 autocast and the fused head + loss; transformers' is the textbook loop under bf16
autocast), each compiled too unless --no-compile. Each mode runs two warm-up steps (compilation happens there), then
--steps steps under torch.profiler (CPU); every operator's self time is put in one kind:
  - matmul: GEMMs (aten::mm / addmm / bmm / linear and oneDNN's), forward and backward;
  - attention: the fused SDPA kernels (flash attention forward and backward);
  - loss: log-softmax, cross-entropy and their backward, outside a compiled graph;
  - optimizer: AdamW (fused) and gradient clipping;
  - compiled kernels: the inductor-generated code of a compiled graph (fused elementwise work, softmax, norms),
    which the profiler sees as one region per graph;
  - other: everything else (elementwise ops, copies, autograd bookkeeping, Python).
The per-step milliseconds by kind, per mode, are the table; the wall time per step is measured outside the
profiler in the same run. Profiling adds overhead to very short operators, so read the shares, not the totals.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from commands import add_out, command_parser, parse
from errors import ConfigError, cli_command
from model.runtime import configure_runtime
from scripts.performance.measure import SHAPES, hf_trainer, our_trainer

KINDS = ["matmul", "attention", "loss", "optimizer", "compiled kernels", "other"]


def kind(name: str) -> str:
    """The kind of work an operator (a profiler event name) does."""
    low = name.lower()
    if "flash_attention" in low or "scaled_dot_product" in low or "efficient_attention" in low:
        return "attention"
    if any(part in low for part in ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul",
                                    "mkldnn_", "onednn", "gemm")):
        return "matmul"
    if any(part in low for part in ("log_softmax", "cross_entropy", "nll_loss")):
        return "loss"
    if any(part in low for part in ("adam", "clip_grad", "_foreach_norm", "optimizer.step")):
        return "optimizer"
    if any(part in low for part in ("compiledfunction", "compiled fx", "torch-compiled region", "cpp_fused",
                                    "call compiledfxgraph", "inductor")):
        return "compiled kernels"
    return "other"


def profile_mode(step, steps: int) -> dict:
    """Wall ms per step (unprofiled), and the profiled self ms per step by kind."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()  # warm-up; compilation happens here
    started = time.perf_counter()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - started) / steps * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(steps):
            step()
    by_kind = dict.fromkeys(KINDS, 0.0)
    top: dict[str, float] = {}
    for event in profiler.key_averages():
        milliseconds = event.self_cpu_time_total / 1e3 / steps
        by_kind[kind(event.key)] += milliseconds
        top[event.key] = milliseconds
    largest = sorted(top.items(), key=lambda item: -item[1])[:8]
    return {"wall_ms": wall, "profiled_ms": sum(by_kind.values()), "by_kind_ms": by_kind,
            "largest_ops_ms": dict(largest)}


def table(results: dict) -> str:
    lines = ["| mode | wall ms/step | " + " | ".join(f"{k} ms (share)" for k in KINDS) + " |",
             "|---|---:|" + "---:|" * len(KINDS)]
    for name, mode in results.items():
        total = mode["profiled_ms"] or 1.0
        cells = [f"{mode['by_kind_ms'][k]:.1f} ({mode['by_kind_ms'][k] / total:.0%})" for k in KINDS]
        lines.append(f"| {name} | {mode['wall_ms']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("scripts.performance.step_profile", __doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="scripts.bench's shapes")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps per mode")
    parser.add_argument("--no-compile", action="store_true", help="eager modes only")
    add_out(parser, "folder for step_profile-SHAPE.md and .json", type=Path, default=Path("runs/bench"))
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv)
    if args.steps < 1:
        raise ConfigError("--steps must be at least 1")
    shape = SHAPES[args.shape]
    device = torch.device("cpu")
    torch.manual_seed(0)
    results = {}
    with tempfile.TemporaryDirectory() as out_dir:
        ours, trainer = our_trainer(shape["model"], shape["batch"], False, out_dir + "/eager", device)
        modes = {"ours eager bf16": ours,
                 "hf eager bf16": hf_trainer(trainer.model, shape["batch"], torch.bfloat16, False, device)[0]}
        if not args.no_compile:
            modes["ours compiled"] = our_trainer(shape["model"], shape["batch"], True, out_dir + "/compiled", device)[0]
            modes["hf compiled bf16"] = hf_trainer(trainer.model, shape["batch"], torch.bfloat16, True, device)[0]
        for name, step in modes.items():
            results[name] = profile_mode(step, args.steps)
            print(f"{name}: {results[name]['wall_ms']:.1f} ms/step", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"step_profile-{args.shape}"
    stem.with_suffix(".json").write_text(json.dumps({"shape": shape, "threads": torch.get_num_threads(),
                                                     "torch": torch.__version__, "modes": results}, indent=1) + "\n")
    shown = table(results)
    stem.with_suffix(".md").write_text(shown)
    print(shown + f"wrote {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
