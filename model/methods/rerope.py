"""ReRoPE (Su 2023, kexue.fm/archives/9708): distances below `window` exact, clamped to `window` beyond; bojone/rerope
always adds log-n: that is `rerope` + `logn` here."""
from __future__ import annotations

import torch

from model.methods import TwoPass, register_attention


@register_attention
class ReRoPE(TwoPass):
    """ReRoPE: distances past the window clamped to it."""

    name = "rerope"
    defaults = {"window": 0}
    derived = {"window": lambda trained, params: trained // 2}

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full_like(queries, self.limit()), torch.zeros_like(keys)
