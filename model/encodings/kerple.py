"""kerple: KERPLE (Chi et al., NeurIPS 2022), the log variant: b(i, j) = -r1 * log(1 + r2 * |i - j|) with
r1, r2 > 0 learned per head and shared by all layers, as in the reference code (chijames/KERPLE,
ParallelKerpleLog: one module passed to every layer; r1 ~ U(0, 2), r2 ~ U(0, 1), both kept >= 0.01).
"""
from __future__ import annotations

import torch
from torch import nn

from model.encodings import ALL, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


@register_encoding("kerple")
class Kerple(PositionEncoding):
    """KERPLE-log: -r1 * log(1 + r2 * |i - j|), learned r1, r2 per head, shared by the layers."""

    has_score_bias = True
    # The reference trains them with the model's optimizer settings; they are vectors, so no weight decay.
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}
    minimum = 1e-2  # the reference's eps: r1 and r2 are clamped to at least this

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.r1 = nn.Parameter(torch.rand(config.n_heads) * 2.0)
        self.r2 = nn.Parameter(torch.rand(config.n_heads) * 1.0)

    @torch.no_grad()
    def constrain_(self) -> None:
        self.r1.clamp_(min=self.minimum)
        self.r2.clamp_(min=self.minimum)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        distance = state.relative(rows, keys).abs().to(torch.float32)[:, None]  # (batch|1, 1, rows, keys)
        r1 = self.r1.clamp(min=self.minimum).float()[None, :, None, None]
        r2 = self.r2.clamp(min=self.minimum).float()[None, :, None, None]
        return -r1 * torch.log1p(r2 * distance)
