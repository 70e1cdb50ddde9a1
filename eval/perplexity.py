"""Perplexity and bits-per-byte of a checkpoint on a text, in nonoverlapping or sliding windows.

    python -m eval.perplexity --checkpoint runs/tiny --data runs/data/stdlib --length 256
    python -m eval.perplexity --checkpoint runs/tiny --data ../shared/data/tinyshakespeare/input.txt \\
        --length 1024 --stride 256 --rope-scaling yarn --rope-factor 4 --out runs/ppl

--data is a prepared data folder (its val.bin is read), a named source (stdlib) or a local file/folder,
tokenized with the checkpoint's tokenizer. A raw source that is the checkpoint's own training source keeps only the
documents data.prepare held out (the same document-hash rule, with the checkpoint's val_fraction) unless
--all-documents; any other source is scored whole. Nonoverlapping mode scores every token of each window; with
--stride S each window advances by S tokens and scores only its last S tokens (the first window scores all),
so every token is scored exactly once, with at least length - S tokens of context after the first window.
Bits-per-byte = total NLL / ln 2 / UTF-8 bytes of the scored tokens: comparable across tokenizers.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from commands import add_checkpoint, add_device, add_out, command_parser, parse, renamed
from data.batches import windows_at
from data.tokenizer import token_byte_lengths
from errors import ConfigError, DataError, cli_command
from eval.heldout import checkpoint_eval_tokens
from infer.rope_args import add_rope_scaling_args, load_for_inference
from model.runtime import autocast, autocast_dtype, configure_runtime
from model.transformer import Transformer

# Windows per forward are chosen so that a batch holds about this many tokens.
TOKENS_PER_BATCH = 8192


@dataclass
class PerplexityResult:
    nll: float  # mean negative log-likelihood per scored token, in nats
    ppl: float
    bpb: float  # bits per UTF-8 byte of the scored tokens
    tokens: int  # scored tokens
    bytes: int
    seq_len: int
    stride: int | None
    position_loss: list[float] = field(default_factory=list)  # mean loss at each window position (nan = unscored)


def window_plan(n_tokens: int, seq_len: int, stride: int | None) -> list[tuple[int, int]]:
    """(start, first scored offset) for each window over a stream of n_tokens ids.

    A window starting at s reads inputs ids[s : s + seq_len] and predicts ids[s + 1 : s + seq_len + 1].
    """
    if seq_len < 1 or n_tokens < seq_len + 1:
        raise DataError(f"need more than seq_len = {seq_len} tokens to evaluate, got {n_tokens}")
    if stride is None:
        return [(start, 0) for start in range(0, n_tokens - seq_len, seq_len)]
    if not 1 <= stride <= seq_len:
        raise ConfigError(f"--stride must be between 1 and --length ({seq_len}), got {stride}")
    plan = [(0, 0)]
    start = stride
    while start + seq_len < n_tokens:
        plan.append((start, seq_len - stride))
        start += stride
    return plan


@torch.inference_mode()
def evaluate_stream(
    model: Transformer,
    ids: np.ndarray,
    byte_lengths: np.ndarray,
    seq_len: int,
    stride: int | None = None,
    amp: torch.dtype | None = None,
    progress: bool = True,
) -> PerplexityResult:
    """Score a token stream with `model` in windows of seq_len (see window_plan)."""
    model.eval()
    device = next(model.parameters()).device
    plan = window_plan(len(ids), seq_len, stride)
    batch_size = max(1, TOKENS_PER_BATCH // seq_len)
    nll_total = 0.0
    byte_total = 0
    token_total = 0
    position_sum = torch.zeros(seq_len, dtype=torch.float64)
    position_count = torch.zeros(seq_len, dtype=torch.float64)
    offsets = torch.arange(seq_len)
    for first in tqdm(range(0, len(plan), batch_size), desc=f"ppl @ {seq_len}", disable=not progress, leave=False):
        windows = plan[first : first + batch_size]
        inputs, targets = windows_at(ids, [start for start, _ in windows], seq_len)
        inputs = inputs.to(device)
        with autocast(device, amp):
            _, losses = model(inputs, targets.to(device), loss_reduction="none")
        losses = losses.double().cpu()  # (windows, seq_len)
        scored = offsets[None, :] >= torch.tensor([skip for _, skip in windows])[:, None]
        nll_total += float(losses[scored].sum())
        token_total += int(scored.sum())
        byte_total += int(torch.from_numpy(byte_lengths)[targets][scored].sum())
        position_sum += (losses * scored).sum(0)
        position_count += scored.sum(0)
    nll = nll_total / token_total
    curve = (position_sum / position_count.clamp(min=1)).masked_fill(position_count == 0, float("nan"))
    return PerplexityResult(
        nll=nll,
        ppl=math.exp(nll),
        bpb=nll_total / math.log(2) / max(byte_total, 1),
        tokens=token_total,
        bytes=byte_total,
        seq_len=seq_len,
        stride=stride,
        position_loss=[round(float(value), 5) for value in curve],
    )


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("eval.perplexity", __doc__)
    add_checkpoint(parser, "the checkpoint to evaluate (required)")
    parser.add_argument("--data", help="a prepared data folder (its val.bin), a source name, or a text path "
                                       "(required)")
    parser.add_argument("--length", type=int, help="window length in tokens (required)")
    renamed(parser, "--seq-len", "--length")
    parser.add_argument("--stride", type=int, default=None, help="sliding-window stride (default: nonoverlapping)")
    parser.add_argument("--tokens", type=int, default=None, help="score only the first N tokens (default: all)")
    renamed(parser, "--max-tokens", "--tokens")
    parser.add_argument("--val-fraction", type=float, default=None,
                        help="raw --data: the held-out share used to split it (default: the checkpoint's, else 0.05)")
    parser.add_argument("--all-documents", action="store_true",
                        help="raw --data that is the checkpoint's training source: score every document, training "
                             "documents included (other sources are always scored whole)")
    add_device(parser)
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | auto")
    add_out(parser, "also write OUT/results.json: the result with the per-position loss curve")
    renamed(parser, "--json", "--out DIR (writes DIR/results.json)")
    add_rope_scaling_args(parser)
    return parser


@cli_command
def main(argv: list[str] | None = None) -> int:
    configure_runtime()  # the process's runtime switches, at start-up (model/runtime.py)
    args = parse(build_parser(), argv, "checkpoint", "data", "length")
    model, tokenizer, device = load_for_inference(args)
    ids, scored = checkpoint_eval_tokens(args.data, args.checkpoint, tokenizer, args.tokens, args.val_fraction,
                                         args.all_documents)
    print(scored)
    result = evaluate_stream(model, ids, token_byte_lengths(tokenizer), args.length, args.stride,
                             autocast_dtype(device, args.dtype))
    mode = f"sliding, stride {args.stride}" if args.stride else "nonoverlapping"
    print(
        f"{args.checkpoint} @ {args.length} ({mode}): nll {result.nll:.4f} | ppl {result.ppl:.3f} | "
        f"bpb {result.bpb:.4f} | {result.tokens:,} tokens, {result.bytes:,} bytes"
    )
    paths = [Path(args.out) / "results.json"] if args.out else []
    record = {"checkpoint": str(args.checkpoint), "data": args.data, "rope_scaling": model.config.rope_scaling,
              **asdict(result)}
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
