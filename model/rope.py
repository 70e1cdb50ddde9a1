"""Rotary position embedding: inverse frequencies, cos/sin from explicit positions, and the rotation itself.

The RoPE scalings (position interpolation, NTK, YaRN, ...) are inference-time methods: model/methods/, one file
each, with plain RoPE's frequencies as their "default" (model.methods.ROPE_SCALINGS).
"""
from __future__ import annotations

import torch

from model import compiled as compiling
from model.compiled import Compiled


def default_inv_freq(head_dim: int, theta: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """inv_freq_i = 1 / theta^(2i/d) for i = 0 .. d/2 - 1, in float32 (the same arithmetic as transformers)
    or `dtype` (float64 for analysis)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim
    return 1.0 / (theta**exponents)


def rope_cos_sin(
    inv_freq: torch.Tensor,
    positions: torch.Tensor,
    layout: str,
    attention_factor: float = 1.0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for integer `positions` of shape (..., time), computed in float32 (or `dtype`, e.g. float64
    for analysis) whatever the autocast state.

    Returns two tensors of shape (..., time, head_dim) laid out for `layout` ("half" or "interleaved").
    """
    with torch.autocast(device_type=positions.device.type, enabled=False):
        angles = positions.to(dtype)[..., None] * inv_freq.to(positions.device, dtype)
        if layout == "half":
            angles = torch.cat((angles, angles), dim=-1)
        else:
            angles = torch.repeat_interleave(angles, 2, dim=-1)
        return angles.cos() * attention_factor, angles.sin() * attention_factor


def _rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    c1, c2 = cos.chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c0, c1 = cos[..., 0::2], cos[..., 1::2]
    s0, s1 = sin[..., 0::2], sin[..., 1::2]
    return torch.stack((x0 * c0 - x1 * s0, x1 * c1 + x0 * s1), dim=-1).flatten(-2)


# x * cos + rotate(x) * sin, where rotate is (x1, x2) -> (-x2, x1) on the two halves of the last dimension
# (transformers' rotate_half) or on each pair (2i, 2i + 1) (Meta's complex-number form). Written per half (or
# pair), no rotated copy of x is built: the same products and sums, so bitwise the same result as the textbook
# form (a + (-b) == a - b in IEEE arithmetic; tests/test_rope.py).
_ROTATE = {"half": _rotate_halves, "interleaved": _rotate_pairs}


def _in_float(rotate):
    """rotate computed in at least float32 and returned in x's dtype (apply_rope's arithmetic), as one function."""
    def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return rotate(x.to(torch.promote_types(x.dtype, torch.float32)), cos, sin).to(x.dtype)
    return rotated


# Long rotations without gradients (evaluation; above all dynamic NTK's decoding step, which rotates every cached
# key at every token) run compiled: one pass over x, its casts to float32 and back included, instead of several.
# Whether they may is the caller's choice (`compiled`): an encoding's is runtime.compiled_rope, taken when its model
# is built (PositionEncoding.compiled_rope).
_EAGER = {layout: _in_float(rotate) for layout, rotate in _ROTATE.items()}
_COMPILED = {layout: Compiled(rotate, "RoPE's rotation", "rotations run eagerly (model/rope.py)", dynamic=True)
             for layout, rotate in _EAGER.items()}


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str,
               compiled: bool = True) -> torch.Tensor:
    """x * cos + rotate(x) * sin, computed in at least float32 (float64 stays float64), returned in x's dtype.

    x: (batch, heads, time, head_dim); cos, sin: broadcastable to it. compiled=False keeps a long rotation without
    gradients eager (runtime.compiled_rope = false); the two agree within float rounding (tests/test_compiled_rope.py).
    """
    rotated = _COMPILED[layout](x, cos, sin) if compiling.worth_compiling(x, compiled) else None
    return rotated if rotated is not None else _EAGER[layout](x, cos, sin)
