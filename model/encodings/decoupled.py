"""decoupled: DeepSeek's decoupled RoPE, the position part of Multi-head Latent Attention (DeepSeek-AI 2024,
"DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language Model", arXiv 2405.04434, section
2.1.3; used unchanged by DeepSeek-V3, arXiv 2412.19437).

The model's own queries and keys (q_proj, k_proj) carry no position ("nope" parts). Beside them each layer has a
rotary query q_r = W_qr x of d_r dimensions per head and ONE rotary key k_r = W_kr x of d_r dimensions shared by
all heads, both from the layer's input x and rotated by RoPE at their positions. The logit of query i and key j is

    (q_i . k_j + rot_i(q_r,i) . rot_j(k_r,j)) / sqrt(head_dim + d_r),

DeepSeek's softmax_scale = 1 / sqrt(q_head_dim), q_head_dim = qk_nope_head_dim + qk_rope_head_dim. Values are
untouched. Position enters only through the rotary part, so a head can match content without any positional
interference (the nope part) and by relative position (the rotary part) side by side.

Here: encode_queries returns [q, rot(q_r)] (head_dim + d_r wide) and encode_keys [k, rot(k_r)] with k_r repeated
over the KV heads, so every backend (SDPA, masked, explicit, merged passes) computes the concatenated dot product as
it does PoPE's wider queries and keys. The attention scales logits by 1 / sqrt(head_dim) on every path
(Attention.score_scale), so the queries are multiplied by sqrt(head_dim / (head_dim + d_r)) to give DeepSeek's
1 / sqrt(head_dim + d_r).

What is left out: the low-rank (latent) compression of keys, values and queries, which is about the KV cache's size
and not about positions; the nope parts are the model's ordinary projections. model.rope_layout is not read: the
rotary part is a projection of its own, in the rotate-half layout, and DeepSeek's interleaved layout
(transformers' `rope_interleave`) is the same model with the rows of W_qr and W_kr permuted. The rotation is
model/rope.py's (default_inv_freq, rope_cos_sin, apply_rope: the functions RoPE in rotary.py uses) over d_r
dimensions with base model.rope_theta.

KV cache: the cache holds keys as wide as the values (model/kv_cache.py allocates one width for both), so, as
PoPE's, the keys are cached raw: the nope keys in the cache, each token's raw k_r beside them in the cache's extras
(kv_cache.update_extra, as FoX keeps its gates), computed once from the forward that brought the token; at every
step the rotary keys of all cached tokens are rotated at their positions (O(keys x d_r)) and joined to the keys.
Rotating at score time also serves attention methods that re-encode positions per pass (SelfExtend, ReRoPE): the
rotary part takes each pass's positions, the nope part none.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from errors import ConfigError
from model.encodings import EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields
from model.rope import apply_rope, default_inv_freq, rope_cos_sin

LAYOUT = "half"  # rotate-half (transformers' rotate_half); see the module docstring for the interleaved layout


def derived_rope_dim(rope_dim: int, head_dim: int) -> int:
    """d_r: the setting, or (0) head_dim // 2, DeepSeek-V2/V3's 64 rotary dimensions beside 128 nope ones."""
    return rope_dim or head_dim // 2


@dataclass
class DecoupledSettings(EncodingSettings):
    # d_r, the rotary dimensions per query head and of the one shared rotary key (DeepSeek's qk_rope_head_dim);
    # 0 = head_dim // 2, written into the saved config.
    rope_dim: int = 0

    def check(self, config: ModelFields, where: str) -> None:
        rope_dim = derived_rope_dim(self.rope_dim, config.head_dim)
        if self.rope_dim < 0 or rope_dim < 2 or rope_dim % 2:
            raise ConfigError(f"{where}.rope_dim = {self.rope_dim} gives {rope_dim} rotary dimensions (0: head_dim "
                              f"// 2 = {config.head_dim // 2}); it must give an even number >= 2")

    def complete(self, config: ModelFields) -> None:
        self.rope_dim = derived_rope_dim(self.rope_dim, config.head_dim)


@dataclass
class DecoupledState(Positions):
    """The rotary tables of this forward (batch|1, 1, time, d_r) for the queries and for the keys (all keys
    attended: the keys are rotated at score time), and, for one layer, its raw rotary queries (batch, heads,
    q_time, d_r) and rotary keys of every key attended (batch, 1, k_time, d_r)."""

    q_cos: torch.Tensor | None = None
    q_sin: torch.Tensor | None = None
    k_cos: torch.Tensor | None = None
    k_sin: torch.Tensor | None = None
    q_rope: torch.Tensor | None = None
    k_rope: torch.Tensor | None = None


@register_encoding("decoupled")
class DecoupledRoPE(PositionEncoding):
    """DeepSeek's decoupled RoPE (MLA's position part): per-layer rotary projections beside position-free q, k."""

    Settings = DecoupledSettings
    model_settings = ("rope_theta",)
    # The keys are cached as wide as the values (the nope part); the rotary keys, kept raw beside them, are rotated
    # and joined at every step (module docstring).
    caches_encoded_keys = False
    exact_buffers = ("inv_freq",)
    # W_qr and W_kr are weight matrices like q_proj and k_proj: the model's learning rate and weight decay.
    optimizer_defaults: dict[str, float] = {}

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.rope_dim = self.settings.rope_dim
        # DeepSeek's softmax_scale is 1 / sqrt(head_dim + d_r); the attention divides by sqrt(head_dim) on every
        # path, so the encoded queries are multiplied by sqrt(head_dim / (head_dim + d_r)).
        self.query_scale = math.sqrt(config.head_dim / (config.head_dim + self.rope_dim))
        self.register_buffer("inv_freq", default_inv_freq(self.rope_dim, config.rope_theta), persistent=False)
        # W_qr (dim -> heads x d_r) and W_kr (dim -> d_r), one pair per layer that uses this encoding (a hybrid's
        # other layers get none); normal(0, init_std) as every matrix of the model.
        layers = self.layers_using()
        self.q_rope_proj = nn.ModuleDict({str(index): nn.Linear(config.dim, config.n_heads * self.rope_dim, bias=False)
                                          for index in layers})
        self.k_rope_proj = nn.ModuleDict({str(index): nn.Linear(config.dim, self.rope_dim, bias=False)
                                          for index in layers})

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (batch|1, 1, time, d_r), float32."""
        cos, sin = rope_cos_sin(self.inv_freq, positions, LAYOUT)
        return cos[:, None], sin[:, None]

    def prepare(self, q_positions: torch.Tensor, k_positions: torch.Tensor,
                all_keys: bool = False) -> DecoupledState:
        q_cos, q_sin = self.tables(q_positions)
        k_cos, k_sin = (q_cos, q_sin) if k_positions is q_positions else self.tables(k_positions)
        return DecoupledState(q_positions, k_positions, q_cos, q_sin, k_cos, k_sin)

    def for_layer(self, x: torch.Tensor, state: DecoupledState, layer: int, kv_cache: Any = None) -> DecoupledState:
        batch, time, _ = x.shape
        # (batch, time, heads * d_r) -> (batch, heads, time, d_r)
        q_rope = self.q_rope_proj[str(layer)](x).view(batch, time, self.config.n_heads, self.rope_dim).transpose(1, 2)
        k_rope = self.k_rope_proj[str(layer)](x).transpose(1, 2)  # (batch, d_r, time)
        if kv_cache is not None:  # the raw rotary keys of every cached token, this forward's written after them
            k_rope, _ = kv_cache.update_extra(layer, "decoupled_k_rope", k_rope)
        k_rope = k_rope.transpose(1, 2)[:, None]  # (batch, 1, keys, d_r)
        return dataclasses.replace(state, q_rope=q_rope, k_rope=k_rope)

    def encode_queries(self, q: torch.Tensor, state: DecoupledState) -> torch.Tensor:
        """[q, rot(q_r)] * sqrt(head_dim / (head_dim + d_r)): (batch, heads, q_time, head_dim + d_r)."""
        rotated = apply_rope(state.q_rope, state.q_cos, state.q_sin, LAYOUT, self.compiled_rope).to(q.dtype)
        return torch.cat((q, rotated), dim=-1) * self.query_scale

    def encode_keys(self, k: torch.Tensor, state: DecoupledState) -> torch.Tensor:
        """[k, rot(k_r)], the one rotary key repeated over the KV heads: (batch, kv_heads, keys, head_dim + d_r)."""
        rotated = apply_rope(state.k_rope, state.k_cos, state.k_sin, LAYOUT, self.compiled_rope).to(k.dtype)
        return torch.cat((k, rotated.expand(-1, k.shape[1], -1, -1)), dim=-1)
