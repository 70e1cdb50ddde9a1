"""STRING (An et al. 2024, arXiv 2410.18745): exact below `shift`; from it, distance d read as d - shift + local."""
from __future__ import annotations

import torch

from model.methods import TwoPass, register_attention


@register_attention
class String(TwoPass):
    """STRING: distances from `shift` on read as distance - shift + local (An et al. 2024)."""

    # An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?" (arXiv 2410.18745): the large,
    # rarely trained distances are dropped and the well-trained small ones shifted over them; `local` restores
    # distinct positions for the nearest of the shifted keys. A pair at distance d >= shift takes the query at
    # i - shift + local (the key stays at j); nearer pairs are exact. The reference code (HKUNLP/STRING,
    # string_for_llama.py) gives the pair at d = shift to both passes; here each pair has one.
    name = "string"
    defaults = {"local": 0, "shift": 0}
    derived = {"local": lambda trained, params: min(128, max(1, trained // 8)),  # the paper's 128 at L = 128k
               "shift": lambda trained, params: trained // 3}  # its shifted_offset = 0.33 L

    def limit(self) -> int:
        return int(self.params["shift"])

    def far(self, queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return queries - self.limit() + int(self.params["local"]), keys

    @classmethod
    def for_length(cls, length: int, trained: int) -> dict:
        """Past L: the smallest shift that keeps every shifted distance below L (length - L + local), at least the
        paper's L / 3; when no shift can keep both parts below L (length > 2L - local), the one that balances them."""
        local = cls.derived["local"](trained, {})
        shift = max(trained // 3, length - trained + local)
        if shift > trained:
            shift = (length + local) // 2
        return {"local": local, "shift": shift}
