"""learned: a learned table of absolute position embeddings added to the token embeddings (GPT-2)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from errors import ConfigError, PositionRangeError
from model.encodings import EncodingSettings, PositionEncoding, register_encoding
from model.fields import ModelFields


@dataclass
class LearnedSettings(EncodingSettings):
    max_positions: int = 0  # the table's size (0 = model.max_seq_len)
    # Positions past the table are an error unless clamp reuses its last row (the `clamp` inference-time method).
    clamp: bool = False

    def check(self, config: ModelFields, where: str) -> None:
        if self.max_positions < 0:
            raise ConfigError(f"{where}.max_positions must be >= 0 (0 = max_seq_len), got {self.max_positions}")
        if self.max_positions and self.max_positions < config.max_seq_len:
            raise ConfigError(f"model.max_seq_len ({config.max_seq_len}) is beyond the learned table of "
                              f"{self.max_positions} positions ({where}.max_positions); raise the table size")
        table = self.max_positions or config.max_seq_len
        if config.random_positions > table:
            raise ConfigError(f"model.random_positions draws positions up to {config.random_positions - 1}, beyond "
                              f"the learned table of {table} positions; set {where}.max_positions="
                              f"{config.random_positions}")


@register_encoding("learned")
class LearnedAbsolute(PositionEncoding):
    """A learned table of absolute position embeddings (GPT-2). It has no rows past its size: such positions
    are an error unless the `clamp` setting reuses the last row."""

    Settings = LearnedSettings
    per_layer = False
    # Measured (docs/baselines.md): weight decay changes nothing (0.0015 nats); 10x the learning rate is 0.48 nats worse.
    optimizer_defaults = {"lr_scale": 1.0, "weight_decay": 0.0}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.size = self.settings.max_positions or config.max_seq_len
        self.table = nn.Embedding(self.size, config.dim)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Compiled, the range check would break the graph at a data-dependent int(): it is skipped there (a compiled
        # training step never goes past the table, which check() keeps at least max_seq_len long).
        if self.settings.clamp:
            positions = positions.clamp(max=self.size - 1)
        elif not torch.compiler.is_compiling() and int(positions.max()) >= self.size:
            raise PositionRangeError(
                f"position {int(positions.max())} is beyond the learned table of {self.size} positions "
                "(model.position_args.learned.max_positions); evaluate at <= "
                f"{self.size} tokens, or set model.position_args.learned.clamp=true to reuse the last row for "
                "later positions"
            )
        return x + self.table(positions)
