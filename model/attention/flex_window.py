"""flex_window: a layer's sliding window through compiled FlexAttention, for an encoding that adds nothing to the
scores (RoPE's local layers in RNoPE-SWA, Gemma-style local layers): a block mask that skips the blocks wholly
outside each query's `window` latest keys, no score_mod.

Taken by name only (model.attention_backend = "flex_window"): the chunked SDPA path (sdpa_mask) already skips the
keys outside a window, and "auto" keeps it until this one is measured faster (python -m scripts.flex_costs). Like
the flex backend it serves no-grad float32 forwards on the CPU (torch has no FlexAttention backward there), with no
KV cache and no attention method; other forwards, and all after compiling failed for this view, take the backend
chosen beside it."""
from __future__ import annotations

from typing import Any

import torch

from model.attention.backend import DECODE, Backend, Setting
from model.attention.flex import block_mask
from model.compiled import Compiled
from model.encodings.base import FUSED


def _windowed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, scale: float,
              enable_gqa: bool) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=enable_gqa)


_kernel = Compiled(_windowed, "FlexAttention (a sliding window)",
                   "this model view continues on the chunked backend (model/attention/flex_window.py)", remember=False)


class FlexWindow(Backend):
    name = "flex_window"

    needs_fallback = True

    def __init__(self, reason: str, fallback: Backend | None = None, **options: Any) -> None:
        super().__init__(reason)
        if fallback is None:
            raise ValueError("flex_window needs a fallback for the forwards it does not serve")
        self.fallback = fallback
        self.failure: str | None = None
        self.latest: str | None = None  # why the latest forward took the fallback (None: it took FlexAttention)

    @classmethod
    def why_not(cls, encoding, setting: Setting) -> str | None:
        checks = [
            (encoding.attention != FUSED, "the encoding adds to the scores (the flex backend serves biases)"),
            (not setting.window, "no sliding window in this layer"),
            (setting.chunk, "an attention chunk, not a window"),
            (setting.sinks, "learned sink logits"),
            (setting.methods or setting.observed or setting.dropout, "an attention method, a diagnostic or dropout"),
            (setting.mode == DECODE, "a KV cache"),
            (setting.compiling, "inside a compiled graph"),
            (setting.device == "cpu" and setting.grad,
             "gradients are wanted, and torch has no FlexAttention backward on the CPU"),
            (setting.dtype != torch.float32, f"{str(setting.dtype).removeprefix('torch.')}; it serves float32"),
        ]
        return next((reason for failed, reason in checks if failed), None)

    def attend(self, layer, inputs) -> torch.Tensor:
        q, k, v = inputs.q, inputs.k, inputs.v
        checks = [
            (self.failure is not None, f"compiling FlexAttention failed for this model view ({self.failure})"),
            (not inputs.causal or inputs.kv_cache is not None, "a KV cache or a non-causal forward"),
            (q.shape[2] != k.shape[2], "queries that are not the keys"),
            (q.shape[-1] != v.shape[-1], "queries and keys wider than the values"),
        ]
        self.latest = next((reason for failed, reason in checks if failed), None)
        if self.latest is None:
            out = _kernel(q, k, v, block_mask(q.shape[2], q.device, window=layer.window), layer.score_scale,
                          k.shape[1] != q.shape[1])
            if out is not None:
                return out
            self.failure = _kernel.last_failure or "see the warning"
            self.latest = f"compiling FlexAttention failed for this model view ({self.failure})"
        return self.fallback.attend(layer, inputs)

    def describe(self) -> str:
        if self.latest is None:
            return super().describe()
        return f"{self.fallback.describe()}; not flex_window: {self.latest}"
