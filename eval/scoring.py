"""Per-token losses of a model on windows of a token stream: the one primitive every evaluation builds on.

    score_windows      one full forward per window (positions may be offset, for the position-shift probe; only
                       the last `last` targets may be scored, as the L-window reference does)
    score_incremental  a prefill, then one token at a time through the KV cache, so every token is scored
                       exactly as generation would see it (dynamic NTK: under the base of its own prefix length)
    score_under        a window under an inference-time method set for its length: one forward, or for a method
                       scored incrementally (dynamic NTK) its last positions token by token after a prefill

Both take `windows`, an int array (n, T + 1): inputs are [:, :-1], targets [:, 1:]; both return float32
losses (n, T) in nats, where column p is the loss of the token predicted at position p (p + 1 tokens of context).
`on_batch`, if given, is called before each batch (and every 64 decoding steps): a hook for a caller that acts
between batches (reports progress, changes its thread count); it changes how fast, not what, is computed.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from data.batches import IGNORE_INDEX
from model.kv_cache import KVCache
from model.methods import method_spec
from model.runtime import autocast
from model.transformer import Transformer

# Windows per forward are chosen so that a batch holds about this many tokens.
TOKENS_PER_BATCH = 8192
# A forward whose (rows x time x vocab) logits would exceed this many elements (1 GiB in float32) scores its tokens
# in chunks of rows instead (model/loss.py's token_cross_entropy): a 32k window of a 49k vocabulary holds 1.6e9.
LOGITS_LIMIT = 2**28


def _whole_logits(rows: int, time: int, model: Transformer) -> bool:
    return rows * time * model.config.vocab_size <= LOGITS_LIMIT


def _device(model: Transformer) -> torch.device:
    return next(model.parameters()).device


OnBatch = Callable[[], None] | None


def _batches(count: int, per_batch: int, desc: str, progress: bool, on_batch: OnBatch):
    for first in tqdm(range(0, count, per_batch), desc=desc, disable=not progress, leave=False):
        if on_batch is not None:
            on_batch()
        yield first


@torch.inference_mode()
def score_windows(
    model: Transformer,
    windows: np.ndarray,
    amp: torch.dtype | None = None,
    position_offset: int = 0,
    progress: bool = False,
    desc: str = "scoring",
    last: int = 0,
    on_batch: OnBatch = None,
    only: np.ndarray | None = None,
) -> np.ndarray:
    """Loss of every target of every window, one full forward per window; its positions moved by position_offset.
    last > 0: only the last `last` targets of each window (losses (n, last)); the head and the last block's
    feed-forward part then skip the other rows (model.forward's logits_to_keep), and the losses are those a full
    scoring gives to float rounding (tested). only: the target indices to score in every window (the others' losses
    are 0): the head runs at those rows alone where the logits would not fit whole (model/loss.py), as a scattered
    few positions of a long window need (the copies of eval.use)."""
    model.eval()
    device = _device(model)
    count, width = windows.shape
    length = width - 1
    losses = np.empty((count, last or length), dtype=np.float32)
    per_batch = max(1, TOKENS_PER_BATCH // length)
    for first in _batches(count, per_batch, desc, progress, on_batch):
        rows = torch.from_numpy(np.asarray(windows[first : first + per_batch], dtype=np.int64)).to(device)
        targets = rows[:, 1:]
        if only is not None:
            kept = torch.full_like(targets, IGNORE_INDEX)
            kept[:, only] = targets[:, only]
            targets = kept
        # None: the model's own positions (0, 1, ..., or its randomized draw: model.random_positions); an offset
        # moves them, the draw included, so the probe shifts what the model sees and changes nothing else
        positions = model.default_positions(rows[:, :-1], None) + position_offset if position_offset else None
        with autocast(device, amp):
            _, loss = model(rows[:, :-1], targets, positions=positions, loss_reduction="none", logits_to_keep=last,
                            return_logits=_whole_logits(rows.shape[0], last or length, model))
        losses[first : first + per_batch] = loss.float().cpu().numpy()
    return losses


@torch.no_grad()  # not inference_mode: autocast then casts the weights once, not at every cached step (generate.py)
def score_incremental(
    model: Transformer,
    windows: np.ndarray,
    prefill: int,
    amp: torch.dtype | None = None,
    progress: bool = False,
    desc: str = "scoring (incremental)",
    max_batch: int = 256,
    on_batch: OnBatch = None,
    step: int = 1,
) -> np.ndarray:
    """Loss of every target, computed as decoding computes it: the first `prefill` inputs in one cached forward,
    then each further input as one cached step. Equals scoring every prefix with a fresh full forward (tested),
    also for encodings whose keys depend on the current length (dynamic NTK). step > 1: `step` inputs per cached
    forward, as a chunked prefill computes them (dynamic NTK then sets one base per chunk, that of its end)."""
    model.eval()
    device = _device(model)
    count, width = windows.shape
    length = width - 1
    prefill = max(1, min(prefill, length))
    losses = np.empty((count, length), dtype=np.float32)
    for first in _batches(count, max_batch, desc, progress, on_batch):
        rows = torch.from_numpy(np.asarray(windows[first : first + max_batch], dtype=np.int64)).to(device)
        cache = KVCache.for_model(model.config, rows.shape[0], length)
        with autocast(device, amp):
            _, loss = model(rows[:, :prefill], rows[:, 1 : prefill + 1], kv_cache=cache, loss_reduction="none",
                            return_logits=_whole_logits(rows.shape[0], prefill, model))
            columns = [loss.float()]
            for position in range(prefill, length, step):
                if (position - prefill) // step % 64 == 0 and on_batch is not None:
                    on_batch()
                end = min(position + step, length)
                _, loss = model(rows[:, position:end], rows[:, position + 1 : end + 1], kv_cache=cache,
                                loss_reduction="none")
                columns.append(loss.float())
        losses[first : first + rows.shape[0]] = torch.cat(columns, dim=1).cpu().numpy()
    return losses


@torch.inference_mode()
def score_prefixes(model: Transformer, windows: np.ndarray, start: int, amp: torch.dtype | None = None) -> np.ndarray:
    """Loss of targets start.. of every window, each from a fresh full forward over its own prefix (quadratic
    cost: a reference for tests and spot checks). Columns < start are NaN."""
    count, width = windows.shape
    losses = np.full((count, width - 1), np.nan, dtype=np.float32)
    for position in range(start, width - 1):
        losses[:, position] = score_windows(model, windows[:, : position + 2], amp)[:, -1]
    return losses


def score_under(model: Transformer, method: str, windows: np.ndarray, trained: int, amp: torch.dtype | None = None,
                tail: int = 0) -> tuple[np.ndarray, dict[str, str]]:
    """Losses of `windows` (n, T + 1) under `method` (model/methods/) set for their length T (a RoPE scaling's factor
    T / trained, an attention method's parameters for T), and the attention path each layer took. One forward per
    window; for a method scored incrementally (dynamic NTK), only the last `tail` positions, each as decoding
    scores it (through the KV cache, after a prefill of the rest): losses (n, tail)."""
    length = windows.shape[1] - 1
    spec = method_spec(method)
    view = model.under(spec, length, trained)
    if spec.incremental:
        return score_incremental(view, windows, length - tail, amp)[:, -tail:], view.attention_paths()
    return score_windows(view, windows, amp), view.attention_paths()
