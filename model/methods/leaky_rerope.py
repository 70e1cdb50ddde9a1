"""Leaky ReRoPE (Su 2023): distances below `window` exact, beyond it growing as window + (i - j - window) / k."""
from __future__ import annotations

import torch

from model.methods import TwoPass, register_attention


@register_attention
class LeakyReRoPE(TwoPass):
    """leaky ReRoPE: distances past the window grow with slope 1 / k."""

    name = "leaky_rerope"
    defaults = {"window": 0, "k": 16.0}
    derived = {"window": lambda trained, params: trained // 2}

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window, k = self.params["window"], self.params["k"]
        # (i / k + window (1 - 1 / k)) - j / k = window + (i - j - window) / k
        return queries.to(torch.float32) / k + window * (1 - 1 / k), keys.to(torch.float32) / k

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """Window L / 2 and the k that maps the longest distance below L."""
        half = max(1, trained // 2)
        return {"window": half, "k": max(1.0, (length - half) / max(1, trained - half))}
