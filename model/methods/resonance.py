"""Resonance YaRN (Wang et al. 2024, arXiv 2403.00071): YaRN's frequencies with every wavelength rounded to a whole
number of tokens."""
from __future__ import annotations

import math

import torch

from model.methods import register_scaling
from model.methods.yarn import YARN_KEYS, yarn_rope


@register_scaling("resonance", YARN_KEYS, plain_at_factor_one=False)
def resonance_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Resonance YaRN (Wang et al. 2024): YaRN's frequencies for the factor, each wavelength 2 pi / inv_freq then
    rounded to a whole number of tokens, so every pair repeats exactly; at factor 1 (YaRN is plain RoPE there),
    Resonance RoPE. As the authors' LlamaYaRNScaledResonanceRotaryEmbedding, with YaRN's attention factor."""
    inv_freq, attention_factor = yarn_rope(head_dim, theta, params, seq_len)
    wavelengths = torch.round(2 * math.pi / inv_freq).clamp(min=1)
    return 2 * math.pi / wavelengths, attention_factor


