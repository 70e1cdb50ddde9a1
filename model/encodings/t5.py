"""t5: T5's learned relative bias (Raffel et al., JMLR 2020): log-spaced distance buckets, one scalar per
(bucket, head), shared by the layers."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from errors import ConfigError
from model.encodings import ALL, EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields


def t5_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Decoder (unidirectional) bucket of `relative_position` = key - query, as in transformers' T5Attention."""
    distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    scaled = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return torch.where(is_small, distance, large)


SHARED_BIAS_ELEMENTS = 2**22  # at most this many bias elements are kept for the other layers of one forward


@dataclass
class SharedBiasPositions(Positions):
    """Positions, and the biases already built in this forward for an encoding whose bias every layer shares
    (T5): the next layers reuse them instead of gathering (and back-propagating through) the same table again.
    Bounded: past SHARED_BIAS_ELEMENTS (a long evaluation in many chunks) each layer builds its own."""

    biases: dict = field(default_factory=dict)
    kept: int = 0

    def shared(self, rows: slice, keys: slice, build) -> torch.Tensor:  # noqa: ANN001 (a zero-argument callable)
        key = (rows.start, rows.stop, keys.start, keys.stop)
        if key in self.biases:
            return self.biases[key]
        bias = build()
        if self.kept + bias.numel() <= SHARED_BIAS_ELEMENTS:
            self.biases[key] = bias
            self.kept += bias.numel()
        return bias


@dataclass
class T5Settings(EncodingSettings):
    # Distances below num_buckets / 2 have a bucket each; the rest share log-spaced buckets up to max_distance,
    # and every longer distance the last one. The T5 paper's 128 suits L = 512: at a shorter L, buckets past L are
    # never trained (docs/presets.md, "T5's penalty and its buckets at L = 64").
    num_buckets: int = 32
    max_distance: int = 128

    def check(self, config: ModelFields, where: str) -> None:
        if self.num_buckets < 2 or self.max_distance <= self.num_buckets // 2:
            raise ConfigError(f"{where}: t5 needs num_buckets >= 2 and max_distance > num_buckets / 2, got "
                              f"{self.num_buckets} and {self.max_distance}")


@register_encoding("t5")
class T5Bias(PositionEncoding):
    """T5's learned relative bias: log-spaced distance buckets, one scalar per (bucket, head), shared by layers."""

    Settings = T5Settings
    has_score_bias = True
    # Measured (docs/baselines.md, "Learned position parameters"): at train.lr Adam moves a bias by about one nat over the whole
    # schedule; 10x without weight decay lowers the full preset's validation loss by 0.26 nats (30x: by 0.23).
    optimizer_defaults = {"lr_scale": 10.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(self.settings.num_buckets, config.n_heads)

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor, all_keys: bool = False) -> Positions:
        return SharedBiasPositions(q_positions, k_positions)

    def score_bias(self, q: torch.Tensor, state: Positions, layer: int, rows: slice, keys: slice = ALL,
                   scores: torch.Tensor | None = None) -> torch.Tensor:
        def build() -> torch.Tensor:  # (batch|1, heads, rows, keys)
            buckets = t5_bucket(state.relative(rows, keys), self.settings.num_buckets, self.settings.max_distance)
            return self.relative_attention_bias(buckets).permute(0, 3, 1, 2).float()

        return state.shared(rows, keys, build) if isinstance(state, SharedBiasPositions) else build()
