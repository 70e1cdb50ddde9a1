"""Grouped-query causal self-attention: the projections, QK-norm, the position encoding of queries and keys, the KV
cache, and the backend that computes the attention itself (model/attention/registry.py), chosen once per model view
and mode by the Transformer and handed to each forward."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from model.attention.registry import DECODE, EVALUATE, TRAIN, Backend, Inputs, Workload, choose
from model.encodings import PositionEncoding
from model.fields import ModelFields
from model.kv_cache import KVCache
from model.layers import RMSNorm, autocast_input
from model.methods import MethodContext


def mode_of(kv_cache: KVCache | None) -> str:
    """train (gradients), decode (a KV cache) or evaluate."""
    return TRAIN if torch.is_grad_enabled() else DECODE if kv_cache is not None else EVALUATE


class Attention(nn.Module):
    def __init__(self, config: ModelFields, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.head_dim
        # Logits are q.k / sqrt(head_dim) on every path, also where encoded queries and keys are wider (PoPE's 2d).
        self.score_scale = 1.0 / math.sqrt(self.head_dim)
        self.score_root = math.sqrt(self.head_dim)  # the explicit steps divide by it (bitwise as they always have)
        self.dropout = config.dropout
        self.window = config.layer_windows[layer_index]
        self.chunk = config.layer_chunks[layer_index]
        self.q_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)
        # QK-norm (model.qk_norm): RMSNorm of each head's queries and keys, a gain over head_dim shared by the heads,
        # before the position encoding.
        qk_norm = config.layer_qk_norms[layer_index]
        self.q_norm = RMSNorm(self.head_dim, config.norm_eps, config.norm_offset) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.norm_eps, config.norm_offset) if qk_norm else None
        # model.attention_scale_dim (Gemma's query_pre_attn_scalar): logits q.k / sqrt(it) instead of / sqrt(head_dim),
        # as a gain on the queries before the position encoding (RoPE's and NoPE's logits are linear in the query),
        # so that every backend keeps its own 1/sqrt(head_dim).
        scale_dim = config.attention_scale_dim
        self.query_gain = math.sqrt(self.head_dim / scale_dim) if scale_dim and scale_dim != self.head_dim else None
        # Gated attention (model.attention_gate): sigmoid(x W_g), one gate per head and output dimension (Qiu et al.
        # 2025's G1 form, as Qwen3-Next computes it beside the queries), on the attention output.
        gated = config.layer_gates[layer_index]
        self.gate_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False) if gated else None
        # Learned sink logits (model.sink_logits, gpt-oss): one per head, a key with no value in every softmax.
        sinks = config.layer_sinks[layer_index]
        self.sink_logits = nn.Parameter(torch.zeros(config.n_heads)) if sinks else None

    def dropout_now(self) -> float:
        return self.dropout if self.training else 0.0

    def workload(self, mode: str, device: torch.device, dtype: torch.dtype, methods: list = (),
                observed: bool = False, preference: str = "auto") -> Workload:
        """What this layer's backend is chosen from, for `mode` (model/attention/registry.py); `methods`: the view's
        inference-time attention methods (model/methods/): any, any that sets positions, any that sets visibility."""
        return self.workload_of(mode, device.type, dtype, (bool(methods), any(m.sets_positions for m in methods),
                                                          any(m.sets_visibility for m in methods)),
                               observed, preference)

    def workload_of(self, mode: str, device: str, dtype: torch.dtype, methods: tuple[bool, bool, bool],
                   observed: bool = False, preference: str = "auto") -> Workload:
        """The one place a Workload is built: `methods` = (any method, one that sets positions, one that sets
        visibility)."""
        return Workload(mode=mode, device=device, dtype=dtype, window=self.window, chunk=self.chunk,
                       sinks=self.sink_logits is not None, methods=methods[0], passes=methods[1],
                       visibility=methods[2], observed=observed, dropout=self.dropout_now(),
                       compiling=torch.compiler.is_compiling(), preference=preference)

    def forward(
        self,
        x: torch.Tensor,
        encoding: PositionEncoding,
        encoding_state: Any,
        kv_cache: KVCache | None,
        causal: bool = True,
        methods: MethodContext | None = None,
        pass_states: list[Any] | None = None,
        backend: Backend | None = None,
    ) -> torch.Tensor:
        """`backend`: the one the model chose for this layer in this mode; without one (a layer used on its own),
        the one the rules choose for this forward."""
        batch, time, _ = x.shape
        low = autocast_input(x)  # cast once for the three projections
        # (batch, time, heads * head_dim) -> (batch, heads, time, head_dim)
        q = self.q_proj(low).view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(low).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(low).view(batch, time, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.query_gain is not None:
            q = q * self.query_gain
        encoding_state = encoding.for_layer(x, encoding_state, self.layer_index, kv_cache)
        if pass_states is not None:
            pass_states = [encoding.for_layer(x, state, self.layer_index, kv_cache) for state in pass_states]
        scale = methods.scales[encoding.encodes_positions] if methods is not None else None
        passes = methods is not None and bool(methods.passes)
        # logn / temperature: a factor per query position, on the encoded query (here, or per pass in the backend),
        # so that it scales the logits whatever the encoding does to the query (PoPE's softplus)
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
        if backend is None:
            # a layer called alone, outside a model (which chooses once per view and mode): chosen here, with the
            # defaults of a model (no diagnostic, model.attention_backend "auto")
            workload = self.workload_of(mode_of(kv_cache), q.device.type, q.dtype,
                                      (methods is not None, bool(passes), methods is not None and methods.visible is not None))
            backend = choose(encoding, workload)
        y = backend.attend(self, Inputs(q, k, v, encoding, encoding_state, kv_cache, causal, methods, pass_states,
                                        scale if passes else None))
        # (batch, heads, time, head_dim) -> (batch, time, heads * head_dim)
        y = y.transpose(1, 2).reshape(batch, time, self.n_heads * self.head_dim)
        if self.gate_proj is not None:
            y = y * torch.sigmoid(self.gate_proj(x))
        return self.o_proj(y)
