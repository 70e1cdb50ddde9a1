"""YaRN (Peng et al. 2023, arXiv 2309.00071): NTK-by-parts interpolation (pairs whose wavelength fits the trained
length many times keep their frequency, long ones are interpolated, a linear ramp between) and an attention
temperature 0.1 ln(s) + 1, as transformers' _compute_yarn_parameters."""
from __future__ import annotations

import math

import torch

from model.methods import ORIGINAL, register_scaling


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(params: dict) -> float:
    """Explicit attention_factor, else mscale/mscale_all_dim when both are set, else 0.1 ln(s) + 1."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    factor = params["factor"]
    if params.get("mscale") and params.get("mscale_all_dim"):
        return yarn_mscale(factor, params["mscale"]) / yarn_mscale(factor, params["mscale_all_dim"])
    return yarn_mscale(factor)


def yarn_correction_range(head_dim: int, theta: float, params: dict) -> tuple[float, float]:
    """The (low, high) pair indices between which YaRN blends interpolation and extrapolation.

    A pair whose wavelength fits more than beta_fast times in the original length keeps its frequency;
    one that fits fewer than beta_slow times is interpolated (divided by the factor).
    """
    original = params["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = correction_dim(params.get("beta_fast") or 32)
    high = correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def yarn_ramp(head_dim: int, theta: float, params: dict) -> torch.Tensor:
    """0 for pairs that keep their frequency, 1 for pairs that are fully interpolated, linear in between."""
    low, high = yarn_correction_range(head_dim, theta, params)
    if low == high:
        high += 0.001
    return ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)


YARN_KEYS = {"factor", ORIGINAL, "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}


@register_scaling("yarn", YARN_KEYS)
def yarn_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): NTK-by-parts interpolation plus the attention temperature."""
    factor = params["factor"]
    wavelengths = theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrapolation = 1.0 / wavelengths
    interpolation = 1.0 / (factor * wavelengths)
    interpolated = yarn_ramp(head_dim, theta, params)
    inv_freq = interpolation * interpolated + extrapolation * (1 - interpolated)
    return inv_freq, yarn_attention_factor(params)


