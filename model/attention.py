"""Grouped-query causal self-attention through F.scaled_dot_product_attention.

Encodings without a score bias take the fused SDPA path with no (time x time) mask. Encodings with a bias
(ALiBi, T5, Shaw) are computed in chunks of query rows, so the (heads x rows x keys) bias stays bounded
at long lengths; an encoding with a value term (Shaw) needs the attention probabilities explicitly.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.kv_cache import KVCache
from model.position import PositionEncoding

# Bias-path chunks hold at most this many (batch x heads x rows x keys) elements (2^24 floats = 64 MiB).
BIAS_CHUNK_ELEMENTS = 2**24


def causal_mask(q_len: int, k_len: int, device: torch.device, rows: slice | None = None) -> torch.Tensor:
    """Boolean (rows, k_len) mask for queries that are the last q_len of k_len positions (True = attend)."""
    query_index = torch.arange(k_len - q_len, k_len, device=device)[rows if rows is not None else slice(None)]
    key_index = torch.arange(k_len, device=device)
    return key_index[None, :] <= query_index[:, None]


def visible_keys(q_len: int, k_len: int, device: torch.device, kv_cache: KVCache | None,
                 rows: slice | None = None) -> torch.Tensor:
    """(rows, k_len) True where a query may attend a key: causal, and only filled slots of a static cache."""
    if kv_cache is not None and kv_cache.static:
        return kv_cache.visible(q_len, device)[rows if rows is not None else slice(None)]
    return causal_mask(q_len, k_len, device, rows)


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
        causal: bool = True,
    ) -> torch.Tensor:
        batch, time, _ = x.shape
        # (batch, time, heads * head_dim) -> (batch, heads, time, head_dim)
        q = self.q_proj(x).view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = position.rotate_queries(q, position_state)
        if position.caches_rotated_keys:
            k = position.rotate_keys(k, position_state)
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer_index, k, v)
        if not position.caches_rotated_keys:
            k = position.rotate_keys(k, position_state)
        if position.has_score_bias or position.has_value_term:
            y = self.biased_attention(q, k, v, position, position_state, causal, kv_cache)
        else:
            y = self.fused_attention(q, k, v, causal, kv_cache)
        # (batch, heads, time, head_dim) -> (batch, time, heads * head_dim)
        y = y.transpose(1, 2).reshape(batch, time, self.n_heads * self.head_dim)
        return self.o_proj(y)

    def fused_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, kv_cache: KVCache | None
    ) -> torch.Tensor:
        q_len, k_len = q.shape[2], k.shape[2]
        # Plain causal attention needs no mask (SDPA's is_causal); a static cache always needs one.
        plain = kv_cache is None or not kv_cache.static
        mask = None
        if causal and not (plain and (q_len == 1 or k_len == q_len)):
            mask = visible_keys(q_len, k_len, q.device, kv_cache)
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal and plain and q_len > 1 and k_len == q_len,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )

    def biased_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position: PositionEncoding,
        state: Any,
        causal: bool,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        batch, heads, q_len, _ = q.shape
        k_len = k.shape[2]
        rows_per_chunk = max(1, BIAS_CHUNK_ELEMENTS // (batch * heads * k_len))
        if position.has_value_term and self.n_kv_heads != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        outputs = []
        for start in range(0, q_len, rows_per_chunk):
            rows = slice(start, min(q_len, start + rows_per_chunk))
            q_rows = q[:, :, rows]
            bias = position.score_bias(q_rows, state, self.layer_index, rows)  # (batch|1, heads, rows, keys)
            if causal:
                bias = bias.masked_fill(~visible_keys(q_len, k_len, q.device, kv_cache, rows), float("-inf"))
            if not position.has_value_term:
                outputs.append(
                    F.scaled_dot_product_attention(
                        q_rows,
                        k,
                        v,
                        attn_mask=bias.to(q.dtype),
                        dropout_p=self.dropout if self.training else 0.0,
                        enable_gqa=self.n_kv_heads != self.n_heads,
                    )
                )
                continue
            scores = (q_rows @ k.transpose(-1, -2)) / math.sqrt(self.head_dim) + bias
            probs = F.dropout(torch.softmax(scores.float(), dim=-1), self.dropout, self.training)
            output = probs.to(v.dtype) @ v + position.value_term(probs.to(v.dtype), state, self.layer_index, rows)
            outputs.append(output)
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
