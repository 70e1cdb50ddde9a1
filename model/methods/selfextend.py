"""SelfExtend (Jin et al., ICML 2024; datamllab/LongLM): exact within `neighbors`; beyond, the query at
i // G + neighbors - neighbors // G and the key at j // G."""
from __future__ import annotations

import torch

from model.methods import TwoPass, register_attention


@register_attention
class SelfExtend(TwoPass):
    """SelfExtend: exact neighbours, grouped positions beyond."""

    name = "selfextend"
    defaults = {"neighbors": 0, "group": 4}
    derived = {"neighbors": lambda trained, params: trained // 2}

    def limit(self) -> int:
        return int(self.params["neighbors"])

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        neighbors, group = self.limit(), int(self.params["group"])
        return (torch.div(queries, group, rounding_mode="floor") + neighbors - neighbors // group,
                torch.div(keys, group, rounding_mode="floor"))

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """Neighbours L / 2 and the smallest group whose largest distance, (length - 1) // G + W - W // G, stays
        below L."""
        neighbors, group = max(1, trained // 2), 1
        while (length - 1) // group + neighbors - neighbors // group > trained - 1:
            group += 1
        return {"neighbors": neighbors, "group": group}
