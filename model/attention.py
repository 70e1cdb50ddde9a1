"""Grouped-query causal self-attention, on the path model/attention_path.py chooses for each forward.

An encoding whose attention is FUSED (RoPE, xPos, NoPE, SSMax, the absolute ones: it changes the queries and keys,
or the input, and adds nothing to the scores) takes the fused SDPA path with no (time x time) mask. A BIAS encoding
(ALiBi, T5, KERPLE, FIRE, FoX), an EXPLICIT one (CoPE and DAPE, whose bias reads the scores; Shaw's value term;
stick-breaking's and ASEntmax's own weights; PaTH's own scores), and a layer with a sliding window are computed in
chunks of query rows, each against only the keys it can see (the causal prefix, or the window), so the (heads x rows
x keys) bias and mask stay bounded at long lengths and a window costs O(time x window): through SDPA with a float
mask, or through explicit steps where the scores or the probabilities themselves are needed. A long evaluation
forward of an encoding with a `flex_kind` takes compiled FlexAttention (model/flex.py).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import model.flex as flex
import model.pass_merge as pass_merge
from model.attention_methods import MethodContext
from model.attention_path import EXPLICIT, FLEX, MERGED, SDPA, Forward, Path, choose
from model.config import ModelConfig
from model.encodings.base import PositionEncoding
from model.kv_cache import KVCache
from model.layers import RMSNorm
from model.runtime import runtime_config

# Chunks hold at most this many (batch x heads x rows x keys) elements: 2^24 floats (64 MiB) through SDPA with
# a float mask; 2^20 (4 MiB) through the explicit steps (scores, softmax, probabilities @ values, each a pass over
# the chunk), which then stay in cache. Both sizes were chosen by `python -m scripts.encoding_costs` at the full
# preset's shape (docs/performance.md): the explicit steps are much faster with the smaller chunks, the SDPA path
# the same within noise, so it keeps the larger.
BIAS_CHUNK_ELEMENTS = 2**24
EXPLICIT_CHUNK_ELEMENTS = 2**20
# No-grad explicit forwards take at least this many query rows per chunk: the budget above gives a 4,096-token
# SmolLM2 window (9 heads) 28-row chunks, and SelfExtend there took 317 s against 58 s with 455-row ones (bf16,
# shared 2-core Zen 4); at 32k keys it would give 3 rows. Without gradients a chunk's scores are freed at once.
EXPLICIT_MIN_ROWS_NO_GRAD = 256
# The merged path (an attention method's passes through the fused kernel): a chunk's masked parts (the edges of
# each pass's key range, model/pass_merge.py) cost about 3 x rows^2 per chunk against the unmasked rows x keys, so
# chunks stay short; its masks, (batch x rows x keys) per part, are shared by the heads.
MERGED_ROWS = 256


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Scores in float32, or float64 for a float64 model (a reference computation), never lower."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def token_slots(q_len: int, k_len: int, device: torch.device,
                kv_cache: KVCache | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The token index of each query (q_len,) and of each key (k_len, or a static cache's max_len): where each
    token stands in the sequence, whatever position id the encoding is given (randomized positions differ)."""
    if kv_cache is not None and kv_cache.static:
        start = kv_cache.start(device)
        return start + torch.arange(q_len, device=device), torch.arange(kv_cache.max_len, device=device)
    return torch.arange(k_len - q_len, k_len, device=device), torch.arange(k_len, device=device)


def visible_keys(q_len: int, k_len: int, device: torch.device, kv_cache: KVCache | None,
                 rows: slice | None = None, keys: slice | None = None, window: int = 0) -> torch.Tensor:
    """(rows, keys) True where a query may attend a key: causal, only filled slots of a static cache, and within
    `window` slots of the query (itself and the window - 1 before it) when window > 0."""
    rows = rows if rows is not None else slice(None)
    keys = keys if keys is not None else slice(None)
    query_slot, key_slot = token_slots(q_len, k_len, device, kv_cache)
    distance = query_slot[rows, None] - key_slot[None, keys]  # >= 0 for keys at or before the query
    visible = distance >= 0
    if window:
        visible = visible & (distance < window)
    return visible


def key_range(q_len: int, k_len: int, rows: slice, causal: bool, window: int, static: bool) -> slice:
    """The keys a chunk of query rows can see: from the window's start (or 0) to the last row's own key."""
    if static or not causal:
        return slice(0, k_len)
    offset = k_len - q_len  # queries are the last q_len of the k_len positions
    start = max(0, offset + rows.start - window + 1) if window else 0
    return slice(start, offset + rows.stop)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        # Logits are q.k / sqrt(head_dim) on every path, also where encoded queries and keys are wider (PoPE's 2d).
        self.score_scale = 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.dropout
        self.window = config.layer_windows()[layer_index]
        # Diagnostics (eval/attention_diagnostics.py): when set, attention is computed explicitly in chunks and
        # observer(layer, rows, keys, probs) sees each chunk's probabilities (batch, heads, rows, keys).
        self.observer: Any = None
        self.last_path: Path | None = None  # the path of the latest forward (the trainer and evaluation log it)
        self.q_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)
        # QK-norm (model.qk_norm): RMSNorm of each head's queries and keys, a gain over head_dim shared by the heads,
        # before the position encoding.
        qk_norm = config.layer_qk_norms()[layer_index]
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        encoding: PositionEncoding,
        encoding_state: Any,
        kv_cache: KVCache | None,
        causal: bool = True,
        methods: MethodContext | None = None,
        pass_states: list[Any] | None = None,
    ) -> torch.Tensor:
        batch, time, _ = x.shape
        # (batch, time, heads * head_dim) -> (batch, heads, time, head_dim)
        q = self.q_proj(x).view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        encoding_state = encoding.for_layer(x, encoding_state, self.layer_index, kv_cache)
        if pass_states is not None:
            pass_states = [encoding.for_layer(x, state, self.layer_index, kv_cache) for state in pass_states]
        scale = methods.scale_for(encoding.encodes_positions) if methods is not None else None
        passes = methods is not None and bool(methods.passes)
        # logn / temperature: a factor per query position, on the encoded query (here, or per pass in the chunks), so
        # that it scales the logits whatever the encoding does to the query (PoPE's softplus)
        if passes:  # positions are encoded per pass at score time: the cache holds raw keys
            if kv_cache is not None:
                k, v = kv_cache.update(self.layer_index, k, v)
        else:
            q = encoding.encode_queries(q, encoding_state)
            if scale is not None:
                q = q * scale.to(q.dtype)
            if encoding.caches_encoded_keys:
                k = encoding.encode_keys(k, encoding_state)
            if kv_cache is not None:
                k, v = kv_cache.update(self.layer_index, k, v)
            if not encoding.caches_encoded_keys:
                k = encoding.encode_keys(k, encoding_state)
        forward = Forward(
            device=q.device.type, grad=torch.is_grad_enabled(), dtype=q.dtype, batch=batch, queries=q.shape[2],
            keys=k.shape[2], cache="none" if kv_cache is None else "static" if kv_cache.static else "dynamic",
            window=self.window, methods=methods is not None, passes=passes,
            visibility=methods is not None and methods.visible is not None, observed=self.observer is not None,
            dropout=self.dropout if self.training else 0.0, compiling=torch.compiler.is_compiling(), causal=causal,
            flex_enabled=runtime_config().flex_attention, flex_cuda=runtime_config().flex_cuda)
        path = choose(encoding, forward, lambda: flex.consecutive(encoding_state))
        y = None
        if path.kind == FLEX:
            y = flex.attention(q, k, v, encoding, encoding_state, self.layer_index, self.window)
            if y is None:  # compiling failed: every later forward takes the chunked path (choose knows)
                path = choose(encoding, forward)
        if path.kind == SDPA:
            y = self.fused_attention(q, k, v, causal, kv_cache)
        elif y is None:
            y = self.chunked_attention(q, k, v, encoding, encoding_state, causal, kv_cache, methods,
                                       pass_states, explicit=path.kind == EXPLICIT, merged=path.kind == MERGED,
                                       pass_scale=scale if passes else None)
        self.last_path = path
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
        # Queries and keys wider than the values (PoPE's polar form): SDPA's fused kernels want one head width, and
        # without them it falls back to materialising every score. Zero columns appended to the values change no
        # output column and keep the fused kernel; the extra columns are dropped.
        width = v.shape[-1]
        if q.shape[-1] != width:
            v = F.pad(v, (0, q.shape[-1] - width))
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal and plain and q_len > 1 and k_len == q_len,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.score_scale,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        return out[..., :width] if out.shape[-1] != width else out

    def chunked_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        encoding: PositionEncoding,
        state: Any,
        causal: bool,
        kv_cache: KVCache | None = None,
        methods: MethodContext | None = None,
        pass_states: list[Any] | None = None,
        *,
        explicit: bool,
        merged: bool = False,
        pass_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention in chunks of query rows, each against the keys it can see, with the encoding's bias: through
        explicit steps (scores, softmax, probabilities @ values) or SDPA with a float mask, as the path says; with
        an attention method's passes (q and k raw here), each pass encodes positions its own way and the pairs it
        selects take their scores from it (`merged`: each pass through the fused kernel over the pairs it owns, the
        passes merged by log-sum-exp, model/pass_merge.py); `pass_scale`, a query scale (logn), multiplies each
        pass's encoded queries."""
        batch, heads, q_len, _ = q.shape
        k_len = k.shape[2]
        static = kv_cache is not None and kv_cache.static
        passes = methods.passes if methods is not None else None
        window = min(w for w in (self.window, methods.window if methods is not None else 0, k_len + 1) if w)
        window = 0 if window > k_len else window
        span = min(k_len, 2 * window) if window and not static else k_len
        budget = EXPLICIT_CHUNK_ELEMENTS if explicit else BIAS_CHUNK_ELEMENTS
        rows_per_chunk = max(1, budget // (batch * heads * span))
        if merged:
            rows_per_chunk = MERGED_ROWS
        if explicit and not torch.is_grad_enabled():
            rows_per_chunk = max(rows_per_chunk, EXPLICIT_MIN_ROWS_NO_GRAD)
        if window:
            rows_per_chunk = min(rows_per_chunk, window)
        if (explicit or merged) and self.n_kv_heads != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        encoded = None
        if passes:  # (queries, keys) encoded for each pass, once for all chunks
            encoded = [(encoding.encode_queries(q, pass_state), encoding.encode_keys(k, pass_state))
                       for pass_state in pass_states]
            if pass_scale is not None:  # the query scale on each pass's encoded queries
                encoded = [(q_pass * pass_scale.to(q_pass.dtype), k_pass) for q_pass, k_pass in encoded]
        dropout = self.dropout if self.training else 0.0
        outputs = []
        for start in range(0, q_len, rows_per_chunk):
            rows = slice(start, min(q_len, start + rows_per_chunk))
            keys = key_range(q_len, k_len, rows, causal, window, static)
            q_rows, k_keys, v_keys = q[:, :, rows], k[:, :, keys], v[:, :, keys]
            visible = visible_keys(q_len, k_len, q.device, kv_cache, rows, keys, window) if causal else None
            if methods is not None:
                i = methods.q_positions[:, rows, None]  # true positions (batch|1, rows, 1) and (batch|1, 1, keys)
                j = methods.k_positions[:, None, keys]
                if methods.visible is not None:  # which keys a query sees: counted in tokens, not position ids
                    query_slot, key_slot = token_slots(q_len, k_len, q.device, kv_cache)
                    seen = methods.visible(query_slot[None, rows, None], key_slot[None, None, keys])[:, None]
                    visible = seen if visible is None else visible & seen
            if merged:
                selects = [None if one_pass.select is None else one_pass.select(i, j)[:, None] for one_pass in passes]
                outputs.append(pass_merge.merged_attention(
                    [q_pass[:, :, rows] for q_pass, _ in encoded], [k_pass[:, :, keys] for _, k_pass in encoded],
                    v_keys, pass_merge.owned_pairs(selects, visible), self.score_scale))
                continue
            if explicit:
                if passes:
                    scores = None
                    for one_pass, pass_state, (q_pass, k_pass) in zip(passes, pass_states, encoded):
                        pass_scores = self.logits(q_pass[:, :, rows], k_pass[:, :, keys], encoding, pass_state,
                                                  rows, keys)
                        scores = pass_scores if one_pass.select is None else \
                            torch.where(one_pass.select(i, j)[:, None], pass_scores, scores)
                    if visible is not None:
                        scores = scores.masked_fill(~visible, float("-inf"))
                else:
                    if encoding.own_scores:  # keys transformed per query (PaTH): all keys, the chunks in order
                        scores = encoding.attention_scores(q_rows, k, state, self.layer_index, rows, keys)
                    else:
                        scores = at_least_float32(q_rows @ k_keys.transpose(-1, -2)) / math.sqrt(self.head_dim)
                    if visible is not None:
                        scores = scores.masked_fill(~visible, float("-inf"))
                    bias = encoding.score_bias(q_rows, state, self.layer_index, rows, keys,
                                               scores if encoding.bias_needs_scores else None)
                    if bias is not None:
                        scores = scores + bias
                probs = encoding.attention_weights(scores, state, self.layer_index, visible)
                if self.observer is not None:
                    self.observer(self.layer_index, rows, keys, probs)
                probs = F.dropout(probs, dropout, self.training).to(v.dtype)
                output = probs @ v_keys
                value = encoding.value_term(probs, state, self.layer_index, rows, keys)
                outputs.append(output if value is None else output + value)
                continue
            bias = encoding.score_bias(q_rows, state, self.layer_index, rows, keys)  # (batch|1, heads, rows, keys)
            if bias is None:
                mask = visible
            else:
                mask = bias if visible is None else bias.masked_fill(~visible, float("-inf"))
                mask = mask.to(q.dtype)
            outputs.append(F.scaled_dot_product_attention(q_rows, k_keys, v_keys, attn_mask=mask, dropout_p=dropout,
                                                          scale=self.score_scale,
                                                          enable_gqa=self.n_kv_heads != self.n_heads))
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]

    def logits(self, q: torch.Tensor, k: torch.Tensor, encoding: PositionEncoding, state: Any, rows: slice,
               keys: slice) -> torch.Tensor:
        """Scaled q.k logits (float32) plus the encoding's bias for this state."""
        scores = at_least_float32(q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        bias = encoding.score_bias(q, state, self.layer_index, rows, keys)
        return scores if bias is None else scores + bias
