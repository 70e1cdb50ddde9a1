"""Llama 3.1's RoPE scaling (transformers' "llama3"): long wavelengths divided by the factor, short ones kept, a
smooth blend in between."""
from __future__ import annotations

import math

import torch

from model.methods import ORIGINAL, register_scaling
from model.rope import default_inv_freq


# the smoothing bounds are written out, so configs read the same here and in transformers (which requires them)
@register_scaling("llama3", {"factor", ORIGINAL, "low_freq_factor", "high_freq_factor"},
         defaults={"low_freq_factor": 1.0, "high_freq_factor": 4.0})
def llama3_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Llama 3.1: long wavelengths divided by the factor, short ones kept, a smooth blend in between."""
    factor = params["factor"]
    low_freq_factor = params.get("low_freq_factor", 1.0)
    high_freq_factor = params.get("high_freq_factor", 4.0)
    original = params["original_max_position_embeddings"]
    inv_freq = default_inv_freq(head_dim, theta)
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original / low_freq_factor
    high_freq_wavelength = original / high_freq_factor
    scaled = torch.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelength < high_freq_wavelength) * ~(wavelength > low_freq_wavelength)
    return torch.where(is_medium, smoothed, scaled), 1.0


