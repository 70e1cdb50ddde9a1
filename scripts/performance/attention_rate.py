"""How fast torch's CPU attention kernel runs against the matmul peak, in bfloat16 and float32: one causal
scaled_dot_product_attention over T tokens at a model's head shape, the best of a few runs, in GFLOP/s (2 x head_dim
x T^2 per head: scripts.bench's convention), beside scripts.bench.matmul_peak in each precision.

    python -m scripts.performance.attention_rate --tokens 16384 --heads 4 --kv-heads 1 --head-dim 256   # Gemma 3 270M

What bounds a long forward whose cost is mostly global attention (docs/real_model/gemma3.md)."""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from scripts.bench import matmul_peak


def attention_rate(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, repeats: int = 2) -> float:
    """GFLOP/s of one causal attention (grouped-query where kv_heads < heads), the best of `repeats`."""
    torch.manual_seed(0)
    q = torch.randn(1, heads, tokens, head_dim, dtype=dtype)
    k, v = (torch.randn(1, kv_heads, tokens, head_dim, dtype=dtype) for _ in range(2))
    F.scaled_dot_product_attention(q[:, :, :512], k[:, :, :512], v[:, :, :512], is_causal=True, enable_gqa=True)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        best = min(best, time.perf_counter() - started)
    return 2 * heads * head_dim * tokens**2 / best / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.performance.attention_rate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=256)
    args = parser.parse_args(argv)
    print(f"causal attention, {args.tokens:,} tokens, {args.heads} heads ({args.kv_heads} KV) of {args.head_dim}, "
          f"{torch.get_num_threads()} threads")
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        rate = attention_rate(args.tokens, args.heads, args.kv_heads, args.head_dim, dtype)
        peak = matmul_peak(dtype, torch.device("cpu"))
        print(f"{name:>9}: attention {rate:,.0f} GFLOP/s, matmul peak {peak:,.0f} GFLOP/s ({rate / peak:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
