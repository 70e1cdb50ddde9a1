"""alibi: attention with linear biases (Press et al., ICLR 2022), a fixed logit bias -m_h * (i - j)."""
from __future__ import annotations

import math

import torch

from model.encodings import ALL, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head slopes of the ALiBi reference code: a geometric sequence from 2^(-8/n) for a power of two n;
    otherwise the slopes for the nearest lower power of two c, then every other slope of 2c."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two_slopes(n_heads))
    closest = 2 ** math.floor(math.log2(n_heads))
    extra = power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(power_of_two_slopes(closest) + extra)


@register_encoding("alibi")
class ALiBi(PositionEncoding):
    """Attention with linear biases (Press et al. 2022): logit bias -m_h * (i - j) for key j <= query i."""

    has_score_bias = True
    exact_buffers = ("slopes",)

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_heads), persistent=False)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        distance = state.relative(rows, keys).to(torch.float32)  # j - i <= 0 where attended
        return self.slopes[None, :, None, None] * distance[:, None]
