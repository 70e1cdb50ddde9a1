"""sdpa_mask: SDPA in chunks of query rows, each against the keys it can see, with the encoding's bias (and the
window) as a float mask: a bias encoding (ALiBi, T5, KERPLE, FIRE, FoX), or a window or an attention method's
visibility over an encoding without a bias."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from model.attention.chunks import chunks, effective_window, span
from model.attention.registry import Backend, Workload, register_backend
from model.encodings import EXPLICIT

# Chunks hold at most this many (batch x heads x rows x keys) mask elements: 2^24 floats (64 MiB). Chosen by
# `python -m scripts.encoding_costs` at the full preset's shape (docs/performance.md): larger chunks were as fast.
CHUNK_ELEMENTS = 2**24
# A window's chunk of r rows computes r x (r + window - 1) scores, of which r x window are seen: at r = window half the
# work is masked away, at window / 4 a fifth. Shorter chunks cost more kernel calls: on a 16k local layer of Gemma 3
# (window 512, 4 heads of 256, bfloat16, one core of a Xeon with AMX) chunks of 96-256 rows took 0.12-0.15 s, 512 rows
# 0.17-0.27 s, 64 rows 0.53 s.
WINDOW_ROWS = 4  # rows a chunk = window / this


@register_backend
class Masked(Backend):
    name = "sdpa_mask"

    @classmethod
    def why_not(cls, encoding, workload: Workload) -> str | None:
        if encoding.attention == EXPLICIT:
            return encoding.why_explicit
        if workload.passes:
            return "an attention method encodes positions per pass"
        if workload.observed:
            return "a diagnostic reads the probabilities"
        return None

    def attend(self, layer, inputs) -> torch.Tensor:
        q, k, v = inputs.q, inputs.k, inputs.v
        batch, heads = q.shape[:2]
        window = effective_window(layer.window, inputs)
        rows_per_chunk = max(1, CHUNK_ELEMENTS // (batch * heads * span(window, inputs, layer.chunk)))
        if window:
            rows_per_chunk = min(rows_per_chunk, max(1, window // WINDOW_ROWS))
        dropout = layer.dropout_now()
        outputs = []
        for chunk in chunks(inputs, rows_per_chunk, window, layer.chunk):
            q_rows = q[:, :, chunk.rows]
            k_keys, v_keys = k[:, :, chunk.keys], v[:, :, chunk.keys]
            bias = inputs.encoding.score_bias(q_rows, inputs.state, layer.layer_index, chunk.rows, chunk.keys)
            if bias is None:
                mask = chunk.visible
            else:  # (batch|1, heads, rows, keys)
                mask = bias if chunk.visible is None else bias.masked_fill(~chunk.visible, float("-inf"))
                mask = mask.to(q.dtype)
            if layer.sink_logits is not None:
                k_keys, v_keys, mask = with_sink(layer.sink_logits, k_keys, v_keys, mask, q_rows)
            outputs.append(F.scaled_dot_product_attention(
                q_rows, k_keys, v_keys, attn_mask=mask, dropout_p=dropout, scale=layer.score_scale,
                enable_gqa=k.shape[1] != heads))
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def with_sink(sink_logits: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys, values and a float mask with a sink in front: a zero key (its logit 0 before the mask) whose mask entry
    is each head's sink logit, and a zero value, so that the sink takes its share of every softmax and adds nothing
    to the output (gpt-oss's learned sinks)."""
    batch, heads, rows = q.shape[:3]
    k = torch.cat((k.new_zeros(*k.shape[:2], 1, k.shape[3]), k), dim=2)
    v = torch.cat((v.new_zeros(*v.shape[:2], 1, v.shape[3]), v), dim=2)
    keys = k.shape[2] - 1
    if mask is None:
        mask = q.new_zeros(1, 1, rows, keys)
    elif mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).to(q.dtype)
    sink = sink_logits.to(q.dtype).view(1, heads, 1, 1).expand(mask.shape[0], heads, rows, 1)
    return k, v, torch.cat((sink, mask.expand(mask.shape[0], heads, rows, keys)), dim=-1)

