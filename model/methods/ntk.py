"""Static NTK-aware scaling (bloc97 2023): the RoPE base grows so that the longest wavelength stretches by the
factor while the shortest barely move."""
from __future__ import annotations

import torch

from model.methods import register_scaling
from model.rope import default_inv_freq


@register_scaling("ntk", {"factor"})
def ntk_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling: the base grows to theta * s^(d / (d - 2))."""
    factor = params["factor"]
    return default_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2))), 1.0


