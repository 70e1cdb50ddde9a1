"""Attention sinks (StreamingLLM, Xiao et al. 2023): keys j < `sinks` and the last `window` keys; a sink seen from the
query's place in a cache of sinks + window slots."""
from __future__ import annotations

import torch

from model.methods import AttentionMethod, Pass, register_attention


@register_attention
class Sinks(AttentionMethod):
    """attention sinks (StreamingLLM): the first tokens and a recent window, positions as in the cache."""

    name = "sinks"
    defaults = {"sinks": 4, "window": 0}
    derived = {"window": lambda trained, params: trained - int(params["sinks"])}  # a cache of L slots
    sets_positions = True
    sets_visibility = True

    def __init__(self, params: dict[str, float], trained: int) -> None:
        super().__init__(params, trained)
        self.window = int(params["window"])

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        sinks = int(self.params["sinks"])
        last_slot = sinks + self.window - 1  # the query's place in a cache of sinks + window slots
        seen_from_cache = Pass(torch.clamp(queries, max=last_slot), keys, lambda i, j: j < sinks)
        return [Pass(queries, keys), seen_from_cache]

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (j < self.params["sinks"]) | (i - j < self.window)
