"""ssmax: Scalable-Softmax (Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv 2501.19399) on a
model with no other position information (NoPE, `base = "none"`) or on RoPE (`base = "rope"`, as the paper's
models use it: queries and keys rotated, then each query scaled).

Softmax over n keys flattens as n grows; SSMax replaces softmax(z) by softmax((s log n) z), n the number of keys
the query sees and s a learned scalar per layer and head, which is a multiplication of each query by s log n. Here
n is the query's position less the first key's, plus one (at most the layer's sliding window): the number of keys
it sees in a sequence or a KV cache, unchanged by a shift of all positions; under positions with gaps (PoSE) it is
the count those positions stand for, as every other encoding reads them. s starts at 1 / log L, so that at the
trained length L the logits start as softmax's (the paper learns s with the model; this initial value is ours).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from errors import ConfigError
from model.encodings import POSITION_ENCODINGS, EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields

BASES = ("none", "rope")


@dataclass
class SSMaxSettings(EncodingSettings):
    base: str = "none"  # the position encoding under the scaling: none (NoPE) or rope

    def check(self, config: ModelFields, where: str) -> None:
        if self.base not in BASES:
            raise ConfigError(f"{where}.base must be one of {list(BASES)}, got {self.base!r}")


@dataclass
class ScaledPositions(Positions):
    """One layer's state: the positions, each query's factor s log n, (batch|1, heads, q_time, 1) float32, and the
    base's own state (RoPE's tables) if it has one."""

    scale: torch.Tensor | None = None
    base: Any = None


def refuse_chunks(name: str, config: ModelFields) -> None:
    """A scale of the count of keys a query sees is computed for causal and windowed layers, not for chunked ones."""
    if any(config.layer_chunks):
        raise ConfigError(f"{name} scales each query by the log of the keys it sees, counted for causal and windowed "
                          "layers; model.attention_chunk is not supported with it (give [] or 0 per layer)")


def keys_seen(queries: torch.Tensor, keys: torch.Tensor, window: int) -> torch.Tensor:
    """n for each query (batch|1, q_time): its position less the first key's (keys[:, 0]: the sequence's or the
    cache's first), plus one; at most `window` when the layer has one."""
    count = queries - keys[:, :1] + 1
    return count.clamp(min=1, max=window) if window else count.clamp(min=1)


@register_encoding("ssmax")
class SSMax(PositionEncoding):
    """NoPE or RoPE with Scalable-Softmax: each query multiplied by s log n, s learned per layer and head."""

    Settings = SSMaxSettings

    # The model's learning rate; no weight decay, as for the other vectors (norms, position vectors). Measured: 10x
    # the learning rate is within seed noise of this (docs/baselines.md).
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.s = nn.Parameter(torch.empty(config.n_layers, config.n_heads))
        self.windows = config.layer_windows
        self.base = POSITION_ENCODINGS["rope"](config) if self.settings.base == "rope" else None
        self.reset_parameters()

    @classmethod
    def check_config(cls, config: ModelFields) -> None:
        refuse_chunks("ssmax", config)
        settings = config.position_args.get("ssmax", {})
        if settings.get("base") == "rope":
            POSITION_ENCODINGS["rope"].check_config(config)

    def reset_parameters(self) -> None:
        nn.init.constant_(self.s, 1.0 / math.log(max(2, self.config.max_seq_len)))

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> ScaledPositions:
        base = self.base.prepare(q_positions, k_positions, all_keys) if self.base is not None else None
        return ScaledPositions(q_positions, k_positions, None, base)

    def for_layer(self, x: torch.Tensor, state: ScaledPositions, layer: int, kv_cache: Any = None) -> ScaledPositions:
        n = keys_seen(state.queries, state.keys, self.windows[layer]).to(torch.float32)
        scale = self.s[layer].float()[None, :, None, None] * torch.log(n)[:, None, :, None]
        return ScaledPositions(state.queries, state.keys, scale, state.base)

    def encode_queries(self, q: torch.Tensor, state: ScaledPositions) -> torch.Tensor:
        if self.base is not None:
            q = self.base.encode_queries(q, state.base)
        return q * state.scale.to(q.dtype)

    def encode_keys(self, k: torch.Tensor, state: ScaledPositions) -> torch.Tensor:
        return self.base.encode_keys(k, state.base) if self.base is not None else k
