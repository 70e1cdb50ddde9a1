"""sdpa_mask: SDPA in chunks of query rows, each against the keys it can see, with the encoding's bias (and the
window) as a float mask: a bias encoding (ALiBi, T5, KERPLE, FIRE, FoX), or a window or an attention method's
visibility over an encoding without a bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from model.attention.backend import Backend, Setting
from model.attention.chunks import chunks, effective_window, span
from model.encodings.base import EXPLICIT

# Chunks hold at most this many (batch x heads x rows x keys) mask elements: 2^24 floats (64 MiB). Chosen by
# `python -m scripts.encoding_costs` at the full preset's shape (docs/performance.md): larger chunks were as fast.
CHUNK_ELEMENTS = 2**24


class Masked(Backend):
    name = "sdpa_mask"

    @classmethod
    def why_not(cls, encoding, setting: Setting) -> str | None:
        if encoding.attention == EXPLICIT:
            return encoding.why_explicit
        if setting.passes:
            return "an attention method encodes positions per pass"
        if setting.observed:
            return "a diagnostic reads the probabilities"
        return None

    def attend(self, layer, inputs) -> torch.Tensor:
        q, k, v = inputs.q, inputs.k, inputs.v
        batch, heads = q.shape[:2]
        window = effective_window(layer.window, inputs)
        rows_per_chunk = max(1, CHUNK_ELEMENTS // (batch * heads * span(window, inputs, layer.chunk)))
        dropout = layer.dropout_now()
        outputs = []
        for chunk in chunks(inputs, rows_per_chunk, window, layer.chunk):
            q_rows = q[:, :, chunk.rows]
            bias = inputs.encoding.score_bias(q_rows, inputs.state, layer.layer_index, chunk.rows, chunk.keys)
            if bias is None:
                mask = chunk.visible
            else:  # (batch|1, heads, rows, keys)
                mask = bias if chunk.visible is None else bias.masked_fill(~chunk.visible, float("-inf"))
                mask = mask.to(q.dtype)
            outputs.append(F.scaled_dot_product_attention(
                q_rows, k[:, :, chunk.keys], v[:, :, chunk.keys], attn_mask=mask, dropout_p=dropout,
                scale=layer.score_scale, enable_gqa=k.shape[1] != heads))
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
