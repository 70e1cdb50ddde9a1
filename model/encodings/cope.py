"""cope: CoPE, contextual position encoding (Golovneva et al. 2024), as in the reference code (facebookresearch/RAM,
projects/cope/src/cope/context_position.py, default settings):

    gates      g_ij = sigmoid(q_i . k_j / sqrt(d)), zero for keys the query may not attend
    positions  p_ij = sum_{t = j..i} g_it, clamped to npos - 1 (the `positions` setting; 0 = L + 1, the reference's)
    bias       (q_i . e[p_ij]) / sqrt(d), with e interpolated linearly between the integer positions floor(p_ij)
               and ceil(p_ij); e is (head_dim x npos) per layer, shared by the heads, initialised to zero.

The bias depends on q and k, so the attention computes the scores explicitly (`bias_needs_scores`) in chunks of
query rows. Token positions are never used: the encoding is shift-invariant by construction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from errors import ConfigError
from model.encodings import ALL, EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


def cope_positions(gates: torch.Tensor, limit: int) -> torch.Tensor:
    """p_ij = sum over keys t from j to the last key of g_it (gates of hidden keys are zero), at most limit."""
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=limit)


@dataclass
class CoPESettings(EncodingSettings):
    positions: int = 0  # the number of position embeddings npos (0 = max_seq_len + 1, the reference's default)

    def check(self, config: ModelFields, where: str) -> None:
        if self.positions < 0 or self.positions == 1:
            raise ConfigError(f"{where}.positions: cope needs at least 2 (0 = max_seq_len + 1), got {self.positions}")

    def complete(self, config: ModelFields) -> None:
        self.positions = self.positions or config.max_seq_len + 1  # a number, so that an extension cannot move it


@register_encoding("cope")
class CoPE(PositionEncoding):
    Settings = CoPESettings
    has_score_bias = True
    reads_positions = False
    bias_needs_scores = True
    why_explicit = "a bias that reads the scores"
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.npos = self.settings.positions  # 0 completed to L + 1
        self.embeddings = nn.Parameter(torch.zeros(config.n_layers, config.head_dim, self.npos))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.embeddings)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        gates = torch.sigmoid(scores.float())  # sigmoid(-inf) = 0 for hidden keys
        positions = cope_positions(gates, self.npos - 1)  # (batch, heads, rows, keys)
        with torch.autocast(device_type=q.device.type, enabled=False):
            per_position = q.float() @ self.embeddings[layer].float()  # (batch, heads, rows, npos)
        floor = positions.floor()
        weight = positions - floor  # differentiable, as in the reference
        low = per_position.gather(-1, floor.long())
        high = per_position.gather(-1, positions.ceil().long())
        return (high * weight + low * (1 - weight)) / math.sqrt(self.config.head_dim)
