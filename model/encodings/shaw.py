"""shaw: relative position representations (Shaw et al., NAACL 2018), learned key and value vectors per clipped
distance."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from errors import ConfigError
from model.encodings import ALL, EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


@dataclass
class ShawSettings(EncodingSettings):
    max_distance: int = 16  # relative distances are clipped to [-max_distance, max_distance] (the paper's k)

    def check(self, config: ModelFields, where: str) -> None:
        if self.max_distance < 1:
            raise ConfigError(f"{where}.max_distance: shaw needs at least 1, got {self.max_distance}")


@register_encoding("shaw")
class ShawRelative(PositionEncoding):
    """Shaw et al. 2018: learned key and value vectors for the clipped distance clip(j - i, -k, k), per layer,
    shared across heads. e_ij = q_i . (k_j + a^K_ij) / sqrt(d);  z_i = sum_j a_ij (v_j + a^V_ij)."""

    Settings = ShawSettings
    has_score_bias = True
    has_value_term = True
    clipped_distance = 1  # > 0: a clipped bias; each instance sets its distance from its settings (below)
    why_explicit = "a value term added to the output"
    # Measured (docs/baselines.md): 10x without weight decay is 0.018 nats better than train.lr with decay (within noise).
    optimizer_defaults = {"lr_scale": 10.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        size = 2 * self.settings.max_distance + 1
        # One table per layer that uses Shaw, keyed by the layer index ("0", "1", ...: the names a ModuleList gives,
        # so single-encoding checkpoints keep theirs); a hybrid's other layers get none (no unused parameters).
        layers = [str(index) for index in self.layers_using()]
        self.relative_keys = nn.ModuleDict({index: nn.Embedding(size, config.head_dim) for index in layers})
        self.relative_values = nn.ModuleDict({index: nn.Embedding(size, config.head_dim) for index in layers})
        self.clipped_distance = self.settings.max_distance  # causal: j - i in [-k, 0] only, as d = i - j in [0, k]

    def index(self, state: Positions, rows: slice, keys: slice) -> torch.Tensor:
        k = self.settings.max_distance
        return state.relative(rows, keys).clamp(-k, k) + k  # (batch|1, rows, keys)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        batch, heads, time, _ = q.shape
        per_distance = q @ self.relative_keys[str(layer)].weight.to(q.dtype).T  # (batch, heads, rows, 2k+1)
        index = self.index(state, rows, keys)[:, None].expand(batch, heads, time, -1)
        return torch.gather(per_distance, -1, index).float() / math.sqrt(self.config.head_dim)

    def value_term(self, probs: torch.Tensor, state: Positions, layer: int, rows: slice,
                   keys: slice = ALL) -> torch.Tensor:
        batch, heads, time, _ = probs.shape
        index = self.index(state, rows, keys)[:, None].expand(batch, heads, time, -1)
        size = 2 * self.settings.max_distance + 1
        weight_per_distance = probs.new_zeros(batch, heads, time, size).scatter_add_(-1, index, probs)
        return weight_per_distance @ self.relative_values[str(layer)].weight.to(probs.dtype)

    def clipped_tables(self, q: torch.Tensor, state: Positions, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row k - d of each table is distance d = i - j (clip(j - i, -k, k) + k = k - min(d, k) for j <= i)."""
        k = self.settings.max_distance
        vectors = self.relative_keys[str(layer)].weight[: k + 1].flip(0)
        bias = (q @ vectors.to(q.dtype).T).float() / math.sqrt(self.config.head_dim)
        return bias, self.relative_values[str(layer)].weight[: k + 1].flip(0)
