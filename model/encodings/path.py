"""path: PaTH attention (Yang et al., NeurIPS 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations", arXiv 2505.16381): transforms computed from the content in place of RoPE's fixed rotations.

Each token t gives, per KV head, a unit vector w_t and a strength beta_t in (0, 2), both from the layer input, and
with them H_t = I - beta_t w_t w_t^T. The logit of query i and key j <= i is q_i^T H_i H_{i-1} ... H_{j+1} k_j /
sqrt(d): the key is carried to the query through every transform between them (none for j = i). Each H_t has the
eigenvalues 1 and 1 - beta_t in (-1, 1), so the products never grow. As the reference (fla-org/flash-linear-attention,
fla/layers/path_attn.py, PaTHAttention with its defaults): w_t = normalise(silu(conv(W_up W_down x_t))), a rank-32
projection, a causal depthwise convolution of width 3 over the tokens, unit length (eps 1e-6); beta_t = 2
sigmoid(b . x_t + c); no other position signal; no forget gate (the reference's option, PaTH-FoX).

The logits are computed in blocks of query rows, as the reference's chunked form (fla/ops/path_attn/naive.py): with
the block's w as the rows of W and L = I + diag(beta) strictly_lower(W W^T), the transforms of the block's tokens
after key j and up to row i carry k_j to k_j - sum_{a <= i} w_a [L^-1 diag(beta) (W k_j, rows after j)]_a, and every
key leaves the block carried through all of it. So a block's queries see the keys of earlier blocks already carried
to the block's start. A KV cache keeps the keys carried up to the latest token (kv_cache.rewrite_keys, as the
reference's decoding updates its cached keys by each new token's transform), and the convolution's inputs of the
cached tokens, so a cached step computes what the full forward does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from model.encodings import EncodingSettings, PositionEncoding, Positions, register_encoding
from model.fields import ModelFields

BLOCK = 64  # query rows per block of the chunked form (the reference's chunk size)
EPS = 1e-6  # in w's normalisation, as the reference's l2_norm


@dataclass
class PathSettings(EncodingSettings):
    rank: int = 32  # w's projection passes through this many dimensions (0: one full matrix), the reference's 32
    conv: int = 3  # the width of the causal convolution of w over the tokens (0: none, and no silu)

    def check(self, config: ModelFields, where: str) -> None:
        if self.rank < 0:
            raise ConfigError(f"{where}.rank must be >= 0 (0: a full projection), got {self.rank}")
        if self.conv < 0:
            raise ConfigError(f"{where}.conv must be >= 0 (0: no convolution), got {self.conv}")


@dataclass
class PathState(Positions):
    """One layer's state: the new tokens' w (batch, heads, queries, head_dim) and beta (batch, heads, queries), those
    of each KV head repeated over the query heads of its group; the KV cache; and, as the chunks of query rows come,
    every key carried to the next row (batch, heads, keys, head_dim); float32 (float64 in a float64 model)."""

    w: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    kv_cache: Any = None
    carried: torch.Tensor | None = None
    next_row: int = 0


class Transforms(nn.Module):
    """One layer's projections of the input to w (through a rank, then a causal convolution) and to beta."""

    def __init__(self, config: ModelFields, settings: PathSettings) -> None:
        super().__init__()
        channels = config.n_kv_heads * config.head_dim
        self.w_down = nn.Linear(config.dim, settings.rank, bias=False) if settings.rank else None
        self.w_up = nn.Linear(settings.rank or config.dim, channels, bias=False)
        self.w_conv = nn.Parameter(torch.empty(channels, 1, settings.conv)) if settings.conv else None
        self.beta = nn.Linear(config.dim, config.n_kv_heads, bias=True)


def carry(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, beta: torch.Tensor,
          key_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One block of C query rows (float32): q (batch, heads, C, d) its queries, k (batch, heads, K, d) keys, those
    before the block carried to its start, w (batch, heads, C, d) and beta (batch, heads, C) its tokens' transforms,
    key_index (K,) each key's index less the block's first token's (negative before the block). Returns the logits
    q_i^T H_i ... H_{j+1} k_j (batch, heads, C, K), not yet divided by sqrt(d), for the keys up to each query (later
    ones get q_i . k_j, for the mask to hide), and what carrying each key through the whole block takes off it,
    k_j - H_{C-1} ... H_{j+1} k_j (batch, heads, K, d)."""
    size = w.shape[2]
    rows = torch.arange(size, device=w.device)
    after = rows[:, None] > key_index[None, :]  # (C, K): token a of the block comes after key j
    acting = beta[..., None] * (w @ k.transpose(-1, -2)) * after  # beta_a (w_a . k_j) where H_a acts on k_j
    lower = beta[..., None] * (w @ w.transpose(-1, -2)).tril(-1)  # L less its unit diagonal
    identity = torch.eye(size, device=w.device, dtype=w.dtype)
    inverse = torch.linalg.solve_triangular(lower, identity, upper=False, unitriangular=True)  # L^-1
    # Row a of L^-1 acting is what w_a takes off each key; query i sees the rows a <= i of it.
    scores = q @ k.transpose(-1, -2) - ((q @ w.transpose(-1, -2)).tril() @ inverse) @ acting
    return scores, acting.transpose(-1, -2) @ (inverse.transpose(-1, -2) @ w)


@register_encoding("path")
class PaTH(PositionEncoding):
    """Keys carried to each query through accumulated Householder-like transforms from the content."""

    Settings = PathSettings
    own_scores = True
    why_explicit = "scores of its own (each key transformed on its way to each query)"
    reads_positions = False
    # No settings of its own for the optimizer: the model's learning rate and weight decay, as for the reference's
    # projections, which are ordinary linear layers of its model.

    def __init__(self, config: ModelFields) -> None:
        super().__init__(config)
        self.transforms = nn.ModuleDict({str(index): Transforms(config, self.settings)
                                         for index in self.layers_using()})

    def reset_parameters(self) -> None:
        for transforms in self.transforms.values():  # matrices as the model's (the reference's normal init)
            nn.init.zeros_(transforms.beta.bias)

    def for_layer(self, x: torch.Tensor, state: Positions, layer: int, kv_cache: Any = None) -> PathState:
        transforms = self.transforms[str(layer)]
        batch, time, _ = x.shape
        heads, head_dim = self.config.n_kv_heads, self.config.head_dim
        exact = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for a reference
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(exact)
            inner = x if transforms.w_down is None else F.linear(x, transforms.w_down.weight.to(exact))
            w = F.linear(inner, transforms.w_up.weight.to(exact)).transpose(1, 2)  # (batch, channels, time)
            if transforms.w_conv is not None:
                new = slice(None)
                if kv_cache is not None:  # the convolution reads the inputs of the cached tokens before these
                    w, new = kv_cache.update_extra(layer, "path_w", w)
                width = transforms.w_conv.shape[-1]
                w = F.conv1d(w, transforms.w_conv.to(exact), padding=width - 1, groups=w.shape[1])[:, :, : w.shape[2]]
                w = F.silu(w[:, :, new])
            w = w.reshape(batch, heads, head_dim, time).transpose(2, 3)  # channels are (head, dim)
            w = w * torch.rsqrt(w.square().sum(-1, keepdim=True) + EPS)
            beta = 2 * torch.sigmoid(F.linear(x, transforms.beta.weight.to(exact), transforms.beta.bias.to(exact)))
        groups = self.config.n_heads // heads  # each query head reads its group's KV head
        return PathState(state.queries, state.keys, w.repeat_interleave(groups, 1),
                         beta.transpose(1, 2).repeat_interleave(groups, 1), kv_cache)

    def attention_scores(self, q: torch.Tensor, k: torch.Tensor, state: PathState, layer: int, rows: slice,
                         keys: slice) -> torch.Tensor:
        if rows.start != state.next_row:
            raise RuntimeError(f"PaTH's query rows come in order: expected row {state.next_row}, got {rows.start}")
        cache, queries, total = state.kv_cache, state.w.shape[2], k.shape[2]
        static = cache is not None and cache.static
        # The forward's first query among the keys: a static cache's write position, else the keys before it.
        first = cache.start(k.device) if static else total - queries
        index = torch.arange(total, device=k.device)
        with torch.autocast(device_type=q.device.type, enabled=False):
            q = q.to(torch.promote_types(q.dtype, torch.float32))
            if rows.start == 0:  # the keys before this forward come carried to its first query (by the cache)
                state.carried = k.to(torch.promote_types(k.dtype, torch.float32), copy=True)
            blocks = []
            for start in range(rows.start, rows.stop, BLOCK):
                stop = min(rows.stop, start + BLOCK)
                span = total if static else keys.stop  # the keys this chunk may see; none after them moves
                scores, carried_off = carry(q[:, :, start - rows.start : stop - rows.start],
                                            state.carried[:, :, :span], state.w[:, :, start:stop],
                                            state.beta[:, :, start:stop], index[:span] - (first + start))
                blocks.append(scores[..., keys.start :])
                if torch.is_grad_enabled():
                    carried = state.carried[:, :, :span] - carried_off
                    state.carried = carried if span == total else torch.cat((carried, state.carried[:, :, span:]), 2)
                else:
                    state.carried[:, :, :span] -= carried_off
            state.next_row = rows.stop
            if cache is not None and rows.stop == queries:
                cache.rewrite_keys(layer, state.carried[:, :: self.config.n_heads // self.config.n_kv_heads])
            return torch.cat(blocks, dim=2) / math.sqrt(q.shape[-1])
