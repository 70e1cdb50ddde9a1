"""Rotary position embedding: inverse frequencies, cos/sin from explicit positions, and the rotation itself.

The scaling variants live in a registry of pure functions `name -> (inv_freq, attention_factor)`, with the
signature of transformers' ROPE_INIT_FUNCTIONS, so a config means the same thing here and there.
"""
from __future__ import annotations

from typing import Callable

import torch


def default_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """inv_freq_i = 1 / theta^(2i/d) for i = 0 .. d/2 - 1, in float32 (the same arithmetic as transformers)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponents)


def default_rope(head_dim: int, theta: float, scaling: dict | None = None) -> tuple[torch.Tensor, float]:
    return default_inv_freq(head_dim, theta), 1.0


# name -> function(head_dim, theta, scaling_params) -> (inv_freq, attention_factor)
ROPE_SCALINGS: dict[str, Callable[..., tuple[torch.Tensor, float]]] = {
    "default": default_rope,
}


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, layout: str, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for integer `positions` of shape (..., time), computed in float32 whatever the autocast state.

    Returns two tensors of shape (..., time, head_dim) laid out for `layout` ("half" or "interleaved").
    """
    with torch.autocast(device_type=positions.device.type, enabled=False):
        angles = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device, torch.float32)
        if layout == "half":
            angles = torch.cat((angles, angles), dim=-1)
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)
        return angles.cos() * attention_factor, angles.sin() * attention_factor


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...): the complex-number form of Meta's reference code."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


ROTATIONS = {"half": rotate_half, "interleaved": rotate_interleaved}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """x * cos + rotate(x) * sin, computed in float32 and returned in x's dtype.

    x: (batch, heads, time, head_dim); cos, sin: broadcastable to it.
    """
    x32 = x.float()
    return (x32 * cos + ROTATIONS[layout](x32) * sin).to(x.dtype)
