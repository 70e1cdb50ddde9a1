"""Dynamic NTK (emozilla 2023; transformers' "dynamic"): the NTK base recomputed from the current length, so each
token is scored under the base of its own prefix; unchanged up to the trained length."""
from __future__ import annotations

import torch

from model.methods import ORIGINAL, register_scaling
from model.rope import default_inv_freq


@register_scaling("dynamic", {"factor", ORIGINAL}, length_dependent=True)
def dynamic_rope(head_dim: int, theta: float, params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """Dynamic NTK: the NTK base is recomputed from the current length; unchanged up to the trained length L.

    base' = base * ((s * n / L) - (s - 1))^(d / (d - 2)) with n = max(seq_len, L), as in transformers.
    """
    factor = params["factor"]
    original = params["original_max_position_embeddings"]
    length = max(seq_len or original, original)
    base = theta * ((factor * length / original) - (factor - 1)) ** (head_dim / (head_dim - 2))
    return default_inv_freq(head_dim, base), 1.0


