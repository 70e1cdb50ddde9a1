"""A sliding window: keys within the last `window` positions, and the first `first` tokens (the baseline the others
are compared against; with first = 1, the window control of the retrieval tasks, eval/retrieval.py)."""
from __future__ import annotations

import torch

from model.methods import AttentionMethod, register_attention


@register_attention
class Window(AttentionMethod):
    """sliding window: the most recent keys only (and the first `first` tokens, kept visible as they are)."""

    name = "window"
    defaults = {"window": 0, "first": 0}
    derived = {"window": lambda trained, params: trained}
    sets_visibility = True

    def __init__(self, params: dict[str, float], trained: int) -> None:
        super().__init__(params, trained)
        self.span, self.first = int(params["window"]), int(params["first"])
        self.window = 0 if self.first else self.span  # with first tokens kept, no key range can be skipped

    def visible(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (i - j < self.span) | (j < self.first)
