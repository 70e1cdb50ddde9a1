"""LM-Infinite (Han et al. 2023, arXiv 2308.16137): a Lambda-shaped mask, each query seeing the first `globals`
tokens and the last `window` keys (n_local), with every distance capped at `cap`; training-free.

A global key far behind its query is encoded from the query's position clamped to `cap`, so that pair's distance is
at most cap (the window's own pairs keep theirs, all below window <= cap + 1). Defaults from L, the trained length:
window L and cap L - 1 (no distance longer than any trained), and 10 global tokens. Attention sinks (sinks.py) is
the same shape with 4 sinks and a cache of L slots; Lu et al. 2024 compare both (docs/methods.md).
"""
from __future__ import annotations

import torch

from errors import ConfigError
from model.methods import AttentionMethod, Pass, register_attention


@register_attention
class LMInfinite(AttentionMethod):
    """LM-Infinite: the first tokens and a window of L, distances capped at L (Han et al. 2023)."""

    name = "lm_infinite"
    defaults = {"globals": 10, "window": 0, "cap": 0}
    derived = {"window": lambda trained, params: trained, "cap": lambda trained, params: trained - 1}
    sets_positions = True
    sets_visibility = True

    def __init__(self, params: dict[str, float], trained: int) -> None:
        super().__init__(params, trained)
        self.window = int(params["window"])

    @classmethod
    def check_params(cls, params: dict) -> None:
        if params["cap"] < params["window"] - 1:
            raise ConfigError(f"attention method 'lm_infinite': cap = {params['cap']} must be at least window - 1 = "
                              f"{params['window'] - 1} (the window's own distances are not capped)")

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        globals_ = int(self.params["globals"])
        capped = Pass(torch.clamp(queries, max=int(self.params["cap"])), keys, lambda i, j: j < globals_)
        return [Pass(queries, keys), capped]

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (j < self.params["globals"]) | (i - j < self.window)
