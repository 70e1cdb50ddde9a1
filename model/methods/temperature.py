"""Llama 4's attention temperature tuning (transformers' Llama4TextAttention): q_i *= 1 + beta log(floor((i + 1) /
floor_scale) + 1), in layers without position encoding (NoPE) only."""
from __future__ import annotations

import torch

from model.methods import AttentionMethod, register_attention


@register_attention
class Temperature(AttentionMethod):
    """Llama 4 temperature: q_i times 1 + beta log(floor((i + 1) / floor_scale) + 1), in NoPE layers only."""

    name = "temperature"
    defaults = {"beta": 0.1, "floor_scale": 0}
    derived = {"floor_scale": lambda trained, params: trained}
    scales_queries = True
    only_layers_without_positions = True  # transformers' Llama4TextAttention: attn_temperature_tuning and not use_rope

    def query_scale(self, positions: torch.Tensor) -> torch.Tensor:
        steps = torch.floor((positions.to(torch.float32) + 1) / self.params["floor_scale"])
        return 1 + self.params["beta"] * torch.log(steps + 1)
