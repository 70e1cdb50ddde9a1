"""pope: Polar Coordinate Position Embeddings (Gopalakrishnan, Csordás, Schmidhuber and Mozer 2025, "Decoupling
the 'What' and 'Where' With Polar Coordinate Positional Embeddings", arXiv 2509.10534).

RoPE rotates pairs of query and key components, so a pair's angle mixes what the token is (the pair's own angle)
with where it is (the rotation). PoPE separates them: each of the d components c of a head becomes a complex
number whose magnitude is softplus(x_c), from the content alone, and whose phase is set by the position alone,
t theta_c with theta_c = rope_theta^(-c / d) (d frequencies, not RoPE's d / 2). The score of query t and key s is
the real part of their product,

    a_ts = sum_c softplus(q_c) softplus(k_c) cos((t - s) theta_c - delta_c),

scaled by 1 / sqrt(d) as usual; delta_c is a learned phase per layer, head and component, clamped to [-2 pi, 0]
in the forward and starting at 0. The polar form is a vector of 2d real numbers (magnitude x cos, magnitude x sin),
so queries and keys are twice as wide as the values: the fused kernel takes them as they are.

As pope-pytorch (PoPE / apply_pope_to_qk, version 0.2.1, checked against it in tests/test_outside_references.py),
whose phase bias is on the keys: here it is taken off the queries' phase instead (the same score), so that the keys
carry no learned parameter and under grouped-query attention each query head has its own delta. Keys are cached raw
(d wide, as the values) and put in polar form again at every step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.encodings import PositionEncoding, register_encoding
from model.fields import ModelFields


def pope_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """theta_c = theta^(-c / d) for c = 0 .. d - 1, float32: one frequency per component."""
    return theta ** -(torch.arange(head_dim, dtype=torch.float32) / head_dim)


@dataclass
class PolarPhases:
    """The phases of the queries (batch|1, 1, q_time, head_dim) and of the keys (batch|1, 1, k_time, head_dim),
    float32; for one layer, the queries' with that layer's delta taken off (batch|1, heads, q_time, head_dim)."""

    queries: torch.Tensor
    keys: torch.Tensor


def polar(x: torch.Tensor, phases: torch.Tensor) -> torch.Tensor:
    """softplus(x) at the given phases, as (magnitude cos, magnitude sin) side by side: (..., 2 head_dim), computed in
    at least float32 and returned in x's dtype."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    with torch.autocast(device_type=x.device.type, enabled=False):
        magnitude = F.softplus(wide)
        phases = phases.to(wide.dtype)
        return torch.cat((magnitude * phases.cos(), magnitude * phases.sin()), dim=-1).to(x.dtype)


@register_encoding("pope")
class PoPE(PositionEncoding):
    """Polar positions: magnitudes from the content (softplus), phases from the position alone."""

    model_settings = ("rope_theta",)
    caches_encoded_keys = False  # keys are cached d wide (the values' width) and put in polar form at every step
    exact_buffers = ("inv_freq",)
    # The model's learning rate and no weight decay, as for the other vectors (norms, FoX's gates' biases).
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.register_buffer("inv_freq", pope_frequencies(config.head_dim, config.rope_theta), persistent=False)
        # delta, one per layer that uses PoPE (a hybrid's other layers get none), per query head and component.
        self.phase_bias = nn.ParameterDict({str(index): nn.Parameter(torch.zeros(config.n_heads, config.head_dim))
                                            for index in self.layers_using()})

    def reset_parameters(self) -> None:
        for bias in self.phase_bias.values():
            nn.init.zeros_(bias)

    def phases(self, positions: torch.Tensor) -> torch.Tensor:
        """t theta_c, (batch|1, 1, time, head_dim), float32 whatever the autocast state."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            return (positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device))[:, None]

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> PolarPhases:
        queries = self.phases(q_positions)
        return PolarPhases(queries, queries if k_positions is q_positions else self.phases(k_positions))

    def for_layer(self, x: torch.Tensor, state: PolarPhases, layer: int, kv_cache: Any = None) -> PolarPhases:
        delta = self.phase_bias[str(layer)].float().clamp(-2 * math.pi, 0.0)  # (heads, head_dim)
        return PolarPhases(state.queries - delta[:, None, :], state.keys)

    def encode_queries(self, q: torch.Tensor, state: PolarPhases) -> torch.Tensor:
        return polar(q, state.queries)

    def encode_keys(self, k: torch.Tensor, state: PolarPhases) -> torch.Tensor:
        return polar(k, state.keys)
