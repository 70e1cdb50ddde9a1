"""fire: FIRE (Li et al., ICLR 2024): b(i, j) = f(psi(i - j) / psi(max(T, i))) with psi(x) = log(|c x| + 1), f an
MLP (1 -> mlp_width -> heads, ReLU) per layer, c (initially 0.1) and the threshold T learned (T = |multiplier * T0|,
the multiplier initially 1) as in the public code (mcleish7/arithmetic, cramming/architectures/embeddings.py, class
FIRE), where T0 = 512; here T0 = the `threshold` setting, by default the trained length L, so that lengths past L are
what the progressive interpolation maps back into the range seen in training. The MLP keeps torch's default
initialisation, as there. Below T every normaliser is psi(T), so the bias depends on i - j alone (shift-invariant); a
query past T is normalised by its own position: that is the method, not a leak of absolute position.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from errors import ConfigError
from model.encodings import ALL, EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


@dataclass
class FireSettings(EncodingSettings):
    mlp_width: int = 32  # the MLP's hidden width
    threshold: int = 0  # T's initial value T0 (0 = max_seq_len; the public code uses 512)

    def check(self, config: ModelFields, where: str) -> None:
        if self.mlp_width < 1 or self.threshold < 0:
            raise ConfigError(f"{where}: fire needs mlp_width >= 1 and threshold >= 0 (0 = max_seq_len), got "
                              f"{self.mlp_width} and {self.threshold}")

    def complete(self, config: ModelFields) -> None:
        self.threshold = self.threshold or config.max_seq_len  # a number, so that an extension cannot move it


@register_encoding("fire")
class Fire(PositionEncoding):
    """FIRE: a per-layer MLP of the log-transformed distance, normalised by the query's (thresholded) position."""

    Settings = FireSettings
    has_score_bias = True
    relative_only = False  # a query past T is normalised by its own position
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}
    eps = 1e-6  # as the reference: keeps the normaliser away from zero

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        width = self.settings.mlp_width
        # One MLP per layer that uses FIRE, keyed by layer index (a hybrid's other layers get none).
        self.mlps = nn.ModuleDict({
            str(index): nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, config.n_heads))
            for index in self.layers_using()
        })
        self.c = nn.Parameter(torch.full((config.n_layers,), 0.1))
        self.threshold_multiplier = nn.Parameter(torch.ones(config.n_layers))
        self.initial_threshold = float(self.settings.threshold)  # 0 completed to L

    def reset_parameters(self) -> None:
        for mlp in self.mlps.values():
            for module in mlp:
                if isinstance(module, nn.Linear):
                    module.reset_parameters()

    def normalized_distance(self, state: Positions, layer: int, rows: slice, keys: slice) -> torch.Tensor:
        """psi(i - j) / (psi(max(T, i)) + eps), (batch|1, rows, keys), float32."""
        c = self.c[layer].float()
        distance = (-state.relative(rows, keys)).to(torch.float32)  # i - j >= 0 where attended
        threshold = (self.threshold_multiplier[layer].float() * self.initial_threshold).abs()
        query = state.queries[:, rows].to(torch.float32)
        normaliser = torch.maximum(query, threshold)[..., None]  # (batch|1, rows, 1)
        return torch.log(torch.abs(c * distance) + 1) / (torch.log(torch.abs(c * normaliser) + 1) + self.eps)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        mlp = self.mlps[str(layer)]
        with torch.autocast(device_type=q.device.type, enabled=False):
            distance = self.normalized_distance(state, layer, rows, keys)[..., None]
            bias = mlp(distance.to(mlp[0].weight.dtype)).float()
        return bias.permute(0, 3, 1, 2)  # (batch|1, heads, rows, keys)
