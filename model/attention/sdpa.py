"""sdpa: F.scaled_dot_product_attention fused over the whole sequence (is_causal, or a boolean mask for a static KV
cache), for an encoding that adds nothing to the scores (RoPE, xPos, NoPE, SSMax, the absolute ones)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from model.attention.chunks import visible_keys
from model.attention.registry import Backend, Workload, register_backend
from model.encodings import FUSED


@register_backend
class Sdpa(Backend):
    name = "sdpa"

    @classmethod
    def why_not(cls, encoding, workload: Workload) -> str | None:
        if encoding.attention != FUSED:
            return "the encoding adds to the scores"
        if workload.window or workload.chunk or workload.visibility:
            return "a window or a chunk limits the keys"
        if workload.passes:
            return "an attention method encodes positions per pass"
        if workload.observed:
            return "a diagnostic reads the probabilities"
        if workload.sinks:
            return "learned sink logits, which join the softmax through a mask column"
        return None

    def attend(self, layer, inputs) -> torch.Tensor:
        q, k, v, kv_cache, causal = inputs.q, inputs.k, inputs.v, inputs.kv_cache, inputs.causal
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
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             is_causal=causal and plain and q_len > 1 and k_len == q_len,
                                             dropout_p=layer.dropout_now(), scale=layer.score_scale,
                                             enable_gqa=k.shape[1] != q.shape[1])
        return out[..., :width] if out.shape[-1] != width else out
