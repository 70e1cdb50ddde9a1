"""Position interpolation (Chen et al. 2023): every position divided by the factor."""
from __future__ import annotations

import torch

from model.methods import register_scaling
from model.rope import default_inv_freq


@register_scaling("linear", {"factor"})
def linear_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023): positions divided by the factor, i.e. inv_freq / s."""
    return default_inv_freq(head_dim, theta) / params["factor"], 1.0


