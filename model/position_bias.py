"""Learned functional relative biases: KERPLE (log) and FIRE.

    kerple  Chi et al., NeurIPS 2022, the log variant: b(i, j) = -r1 * log(1 + r2 * |i - j|) with r1, r2 > 0 learned
            per head and shared by all layers, as in the reference code (chijames/KERPLE, ParallelKerpleLog: one
            module passed to every layer; r1 ~ U(0, 2), r2 ~ U(0, 1), both kept >= 0.01).
    fire    Li et al., ICLR 2024: b(i, j) = f(psi(i - j) / psi(max(T, i))) with psi(x) = log(|c x| + 1), f an MLP
            (1 -> model.fire_mlp_width -> heads, ReLU) per layer, c (initially 0.1) and the threshold T learned
            (T = |multiplier * T0|, the multiplier initially 1) as in the public code (mcleish7/arithmetic,
            cramming/architectures/embeddings.py, class FIRE), where T0 = 512; here T0 = model.fire_threshold,
            by default the trained length L, so that lengths past L are what the progressive interpolation maps
            back into the range seen in training. The MLP keeps torch's default initialisation, as there.
            Below T every normaliser is psi(T), so the bias depends on i - j alone (shift-invariant); a query
            past T is normalised by its own position: that is the method, not a leak of absolute position.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from errors import ConfigError
from model.position_base import ALL, PositionEncoding, Positions, register

if TYPE_CHECKING:
    from model.config import ModelConfig


@register("kerple")
class Kerple(PositionEncoding):
    """KERPLE-log: -r1 * log(1 + r2 * |i - j|), learned r1, r2 per head, shared by the layers."""

    has_score_bias = True
    # The reference trains them with the model's optimizer settings; they are vectors, so no weight decay.
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}
    minimum = 1e-2  # the reference's eps: r1 and r2 are clamped to at least this

    def __init__(self, config: "ModelConfig") -> None:
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


@register("fire")
class Fire(PositionEncoding):
    """FIRE: a per-layer MLP of the log-transformed distance, normalised by the query's (thresholded) position."""

    has_score_bias = True
    relative_only = False  # a query past T is normalised by its own position
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}
    eps = 1e-6  # as the reference: keeps the normaliser away from zero

    def __init__(self, config: "ModelConfig") -> None:
        super().__init__(config)
        width = config.fire_mlp_width
        # One MLP per layer that uses FIRE, keyed by layer index (a hybrid's other layers get none).
        self.mlps = nn.ModuleDict({
            str(index): nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, config.n_heads))
            for index in self.layers_using()
        })
        self.c = nn.Parameter(torch.full((config.n_layers,), 0.1))
        self.threshold_multiplier = nn.Parameter(torch.ones(config.n_layers))
        self.initial_threshold = float(config.fire_threshold)  # resolved from 0 to L by ModelConfig

    @classmethod
    def validate(cls, config: "ModelConfig") -> None:
        if config.fire_mlp_width < 1 or config.fire_threshold < 0:
            raise ConfigError("fire needs model.fire_mlp_width >= 1 and model.fire_threshold >= 0 (0 = max_seq_len)")

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
