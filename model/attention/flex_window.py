"""flex_window: a layer's sliding window through compiled FlexAttention, for an encoding that adds nothing to the
scores (RoPE's local layers in RNoPE-SWA, Gemma-style local layers): a block mask that skips the blocks wholly
outside each query's `window` latest keys, no score_mod.

Taken by name only (model.attention_backend = "flex_window"): the chunked SDPA path (sdpa_mask) already skips the
keys outside a window, and "auto" keeps it until this one is measured faster (scripts.performance.flex_costs). Like
the flex backend it serves no-grad float32 forwards on the CPU (torch has no FlexAttention backward there), with no
KV cache and no attention method; other forwards, and all after compiling failed for this view, take the backend
chosen beside it."""
from __future__ import annotations

from typing import Any

import torch

from model.attention.flex import block_mask
from model.attention.registry import DECODE, FallbackBackend, Workload, first_reason, register_backend
from model.compiled import Compiled
from model.encodings import FUSED


def _windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float,
              enable_gqa: bool) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=enable_gqa)


_kernel = Compiled(_windowed, "FlexAttention (a sliding window)",
                   "this model view continues on the chunked backend (model/attention/flex_window.py)", remember=False)


@register_backend
class FlexWindow(FallbackBackend):
    name = "flex_window"

    @classmethod
    def why_not(cls, encoding, workload: Workload) -> str | None:
        return first_reason([
            (encoding.attention != FUSED, "the encoding adds to the scores (the flex backend serves biases)"),
            (not workload.window, "no sliding window in this layer"),
            (workload.chunk, "an attention chunk, not a window"),
            (workload.sinks, "learned sink logits"),
            (workload.methods or workload.observed or workload.dropout, "an attention method, a diagnostic or dropout"),
            (workload.mode == DECODE, "a KV cache"),
            (workload.compiling, "inside a compiled graph"),
            (workload.device == "cpu" and workload.grad,
             "gradients are wanted, and torch has no FlexAttention backward on the CPU"),
            (workload.dtype != torch.float32, f"{str(workload.dtype).removeprefix('torch.')}; it serves float32"),
        ])

    def why_not_served(self, inputs) -> str | None:
        return first_reason([
            (inputs.q.shape[2] != inputs.k.shape[2], "queries that are not the keys"),
            (inputs.q.shape[-1] != inputs.v.shape[-1], "queries and keys wider than the values"),
        ])

    def compute(self, layer, inputs) -> torch.Tensor | None:
        q, k, v = inputs.q, inputs.k, inputs.v
        return _kernel(q, k, v, block_mask(q.shape[2], q.device, window=layer.window), layer.score_scale,
                       k.shape[1] != q.shape[1])

    def kernel(self, inputs) -> Compiled:
        return _kernel
