"""FlexAttention (torch.nn.attention.flex_attention, compiled) for the long evaluation forwards of encodings whose
bias depends on the distance i - j alone (ALiBi, T5, KERPLE).

Measured (`python -m scripts.flex_costs`, `scripts.encoding_costs`, README): for these biases and one sequence,
FlexAttention is 1.7-2.5x faster than the chunked path at 16 L for the whole model, with a lower peak memory; a
sliding window is slower with it, and torch 2.13 has no FlexAttention backward on CPU. With two or more sequences
the chunked path builds each chunk's bias once for all of them and measured as fast or faster (README). So it
serves forwards of one sequence without gradients, on the CPU (where it was measured), in float32, with no KV
cache, no attention method and no window: the scoring of one long window. Everything else, and any forward
shorter than MIN_LENGTH (one or two chunks, where a compilation per shape would not pay), keeps the chunked path,
which stays the reference (parity: tests/test_flex.py).

The bias enters as a (heads, time) table of its values at each distance, read by the score_mod: the encoding's own
score_bias fills it from the last query row, so the two paths add the same numbers. The block mask (causal) is
built once per length. If compiling fails (no C++ compiler, say), a warning names the error and every later
forward takes the chunked path; PELAB_FLEX_ATTENTION=0 turns it off.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from model.compiled import Compiled

# PELAB_FLEX_ATTENTION=0 in the environment: always the chunked path (an A/B measurement, or a machine where
# compiling is unwanted); tests set ENABLED directly.
ENABLED = os.environ.get("PELAB_FLEX_ATTENTION", "1") != "0"
MIN_LENGTH = 512  # shorter forwards keep the chunked path
_block_masks: dict[tuple[int, str], Any] = {}


def applies(q: torch.Tensor, k: torch.Tensor, position: Any, state: Any, causal: bool, kv_cache: Any,
            methods: Any, window: int, observed: bool, dropout: float) -> bool:
    """True when this forward can take FlexAttention: see the module docstring. `observed`: the attention
    diagnostics read the probabilities; `dropout`: the attention dropout this forward applies."""
    if not ENABLED or _kernel.failure is not None or torch.is_grad_enabled() or q.device.type != "cpu":
        return False
    if torch.compiler.is_compiling():  # inside a compiled model (training's validation): its own graph
        return False
    if not causal or kv_cache is not None or methods is not None or window or observed or dropout:
        return False
    if q.shape[0] != 1 or q.dtype != torch.float32 or q.shape[2] != k.shape[2] or q.shape[2] < MIN_LENGTH:
        return False
    if not position.has_score_bias or position.has_value_term or position.bias_needs_scores:
        return False
    if not position.relative_only or not hasattr(state, "queries"):
        return False
    # The table is indexed by i - j: the positions must be consecutive (and the keys the queries).
    queries, keys = state.queries, state.keys
    return queries.shape == keys.shape and bool(torch.equal(queries, keys)) and \
        bool((queries[:, 1:] - queries[:, :-1] == 1).all())


def distance_table(q: torch.Tensor, position: Any, state: Any, layer: int) -> torch.Tensor:
    """(heads, time) float32: the bias at distance d = i - j, read from the last query row (which sees every
    distance from 0 to time - 1)."""
    time = q.shape[2]
    last = slice(time - 1, time)
    bias = position.score_bias(q[:, :, last], state, layer, last, slice(0, time))  # (batch|1, heads, 1, time)
    return bias[0, :, 0].flip(-1).to(torch.float32).contiguous()


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, block_mask: Any,
          enable_gqa: bool) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, i, j):  # noqa: ANN001, ANN202 (flex's signature)
        return score + table[h, i - j]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)


def block_mask(time: int, device: torch.device) -> Any:
    """The causal block mask for `time` queries and keys, built once per (time, device)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (time, str(device))
    if key not in _block_masks:
        if len(_block_masks) >= 16:
            _block_masks.clear()
        _block_masks[key] = create_block_mask(lambda b, h, i, j: i >= j, None, None, time, time, device=str(device))
    return _block_masks[key]


_kernel = Compiled(_flex, "FlexAttention", "evaluation continues on the chunked attention path (model/flex.py)")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position: Any, state: Any,
              layer: int) -> torch.Tensor | None:
    """Causal attention with the encoding's distance bias through compiled FlexAttention, or None when compiling
    failed (then the caller takes the chunked path, as every later forward does)."""
    table = distance_table(q, position, state, layer)
    return _kernel(q, k, v, table, block_mask(q.shape[2], q.device), k.shape[1] != q.shape[1])
