"""Dual chunk attention (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama; Qwen3's long-context method)."""
from __future__ import annotations

import torch

from errors import ConfigError
from model.methods import AttentionMethod, Pass, register_attention


@register_attention
class DualChunk(AttentionMethod):
    """dual chunk attention (DCA): keys at their place in a chunk, queries at one of three places (An et al. 2024)."""

    # An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models" (arXiv 2402.17463), as
    # HKUNLP/ChunkLlama's chunkllama_attn_replace.py computes it: chunks of c = chunk - local tokens; every key at
    # j mod c; a query at i mod c for the keys of its own chunk (intra), at min(i mod c + c, chunk) for the keys of
    # the chunk before (successive), and at min(2c - 1, chunk) for all earlier keys (inter). Every distance stays
    # at most `chunk`. Defaults as replace_with_chunkllama: chunk 3L/4, local L/8.
    name = "dca"
    encodings = ("rope", "xpos")
    defaults = {"chunk": 0, "local": 0}
    derived = {"chunk": lambda trained, params: trained * 3 // 4, "local": lambda trained, params: trained // 8}
    sets_positions = True

    @classmethod
    def check_params(cls, params: dict) -> None:
        if params["local"] >= params["chunk"]:
            raise ConfigError(f"attention method 'dca': local = {params['local']} must be below chunk = "
                              f"{params['chunk']} (chunks hold chunk - local tokens)")

    def passes(self, queries: torch.Tensor, keys: torch.Tensor) -> list[Pass]:
        chunk = int(self.params["chunk"])
        span = chunk - int(self.params["local"])
        inside = torch.remainder(queries, span)
        successive = torch.clamp(inside + span, max=chunk)
        inter = torch.full_like(queries, min(2 * span - 1, chunk))
        key_places = torch.remainder(keys, span)

        def chunk_of(position: torch.Tensor) -> torch.Tensor:
            return torch.div(position, span, rounding_mode="floor")

        return [Pass(inside, key_places),
                Pass(successive, key_places, lambda i, j: chunk_of(j) == chunk_of(i) - 1),
                Pass(inter, key_places, lambda i, j: chunk_of(j) < chunk_of(i) - 1)]
