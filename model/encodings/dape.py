"""dape: Data-Adaptive Positional Encoding (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding
for Length Extrapolation") on ALiBi's or KERPLE's bias.

The logit of query i and key j is q.k / sqrt(d) + B_ij + f([z_ij; B_ij]), with B the base encoding's bias (one value
per head), z the heads' scaled logits, and f a small MLP per layer across the heads: 2H -> mlp_width -> H with a
LeakyReLU, so the bias each head adds is rewritten from all heads' logits and biases. As the reference
(chuanyang-Zheng/DAPE, DAPE.py: AliBi_DAPE and ParallelKerpleLog_DAPE, which read the logits before the causal mask
and keep torch's default initialisation of the MLP); here logits of keys a query does not see enter the MLP as 0
(their bias is masked either way) and the MLP runs in float32.

`mlp_bias_clip` (0: off) feeds the MLP the base's bias at distance min(|i - j|, clip) instead of at |i - j|, while
the bias added to the logit stays the base's own. Both bases are non-increasing in distance, so this is the
element-wise maximum of the bias and its value at the clip. With the clip at L - 1 training is unchanged (no distance
within L exceeds it), and past L the MLP only ever sees bias values it met in training: a test of whether the MLP's
extrapolation over bias values it never saw is what changes DAPE's behaviour past L.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from errors import ConfigError
from model.encodings import (
    ALL,
    POSITION_ENCODINGS,
    EncodingSettings,
    PositionEncoding,
    Positions,
    register_encoding,
)
from model.fields import ModelFields

BASES = ("alibi", "kerple")  # the reference's bias encodings


@dataclass
class DAPESettings(EncodingSettings):
    base: str = "alibi"  # the bias the MLP adapts: alibi or kerple
    mlp_width: int = 32  # the MLP's hidden width (the reference's default)
    mlp_bias_clip: int = 0  # 0: off; else the MLP reads the base's bias at distance min(|i - j|, this)

    def check(self, config: ModelFields, where: str) -> None:
        if self.base not in BASES:
            raise ConfigError(f"{where}.base must be one of {list(BASES)}, got {self.base!r}")
        if self.mlp_width < 1:
            raise ConfigError(f"{where}.mlp_width must be >= 1, got {self.mlp_width}")
        if self.mlp_bias_clip < 0:
            raise ConfigError(f"{where}.mlp_bias_clip must be >= 0 (0: off; a distance in tokens, e.g. "
                              f"max_seq_len - 1), got {self.mlp_bias_clip}")


@register_encoding("dape")
class DAPE(PositionEncoding):
    """A base bias (ALiBi or KERPLE) plus an MLP of the heads' logits and biases, per layer."""

    Settings = DAPESettings
    has_score_bias = True
    bias_needs_scores = True
    why_explicit = "a bias that reads the scores"
    # The model's learning rate, no weight decay (the base's own parameters, KERPLE's, are vectors). Measured: 10x the
    # learning rate and decay 0.1 are within seed noise of this (docs/baselines.md).
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.base = POSITION_ENCODINGS[self.settings.base](config)
        heads, width = config.n_heads, self.settings.mlp_width
        self.mlps = nn.ModuleDict({
            str(index): nn.Sequential(nn.Linear(2 * heads, width), nn.LeakyReLU(), nn.Linear(width, heads))
            for index in self.layers_using()
        })
        # The base keeps its own buffers in float32 when the model is cast (its _apply: ALiBi's slopes).

    def reset_parameters(self) -> None:
        self.base.reset_parameters()
        for mlp in self.mlps.values():  # torch's default initialisation, as the reference
            for module in mlp:
                if isinstance(module, nn.Linear):
                    module.reset_parameters()

    @torch.no_grad()
    def constrain_(self) -> None:
        self.base.constrain_()

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> Any:
        return self.base.prepare(q_positions, k_positions, all_keys)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(device_type=q.device.type, enabled=False):
            base = self.base.score_bias(q, state, layer, rows, keys).float()  # (batch|1, heads, rows, keys)
            logits = scores.float().masked_fill(~torch.isfinite(scores), 0.0)
            mlp = self.mlps[str(layer)]
            seen = base if not self.settings.mlp_bias_clip else torch.maximum(base, self._bias_at_clip(q, layer))
            features = torch.cat((logits, seen.expand_as(logits)), dim=1).permute(0, 2, 3, 1)
            adapted = mlp(features.to(mlp[0].weight.dtype)).float().permute(0, 3, 1, 2)
        return base + adapted

    def _bias_at_clip(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """The base's bias at distance mlp_bias_clip, (1, heads, 1, 1)."""
        clip = Positions(queries=torch.tensor([[self.settings.mlp_bias_clip]], device=q.device),
                         keys=torch.zeros(1, 1, dtype=torch.long, device=q.device))
        return self.base.score_bias(q, clip, layer, slice(0, 1)).float()
