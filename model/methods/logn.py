"""log-n scaling (Su 2021, kexue.fm/archives/8823; Qwen's logn_attn): q_i *= max(1, log(i + 1) / log(L))."""
from __future__ import annotations

import math

import torch

from model.methods import AttentionMethod, register_attention


@register_attention
class LogN(AttentionMethod):
    """log-n scaling: q_i times max(1, log(i + 1) / log(L))."""

    name = "logn"
    defaults = {"base_length": 0}
    derived = {"base_length": lambda trained, params: trained}
    scales_queries = True

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor:
        base = self.params["base_length"]
        return torch.clamp(torch.log(positions.to(torch.float32) + 1) / math.log(base), min=1.0)
