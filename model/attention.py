"""Grouped-query causal self-attention through F.scaled_dot_product_attention."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.kv_cache import KVCache
from model.position import PositionEncoding


def causal_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """Boolean (q_len, k_len) mask for queries that are the last q_len of k_len positions (True = attend)."""
    query_index = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    key_index = torch.arange(k_len, device=device)[None, :]
    return key_index <= query_index


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        self.dropout = config.dropout
        self.q_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        position: PositionEncoding,
        position_state: Any,
        kv_cache: KVCache | None,
    ) -> torch.Tensor:
        batch, time, _ = x.shape
        # (batch, time, heads * head_dim) -> (batch, heads, time, head_dim)
        q = self.q_proj(x).view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = position.rotate(q, k, position_state)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_index, k, v)
        key_len = k.shape[2]
        mask = None
        is_causal = False
        if time > 1 and key_len == time:
            is_causal = True
        elif time > 1:
            mask = causal_mask(time, key_len, x.device)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        # (batch, heads, time, head_dim) -> (batch, time, heads * head_dim)
        y = y.transpose(1, 2).reshape(batch, time, self.n_heads * self.head_dim)
        return self.o_proj(y)
