"""explicit: attention in chunks of query rows through explicit steps (scores, softmax or the encoding's own
weights, probabilities @ values), for what needs the scores or the probabilities themselves: a bias that reads the
scores (CoPE, DAPE), a value term (Shaw), weights of its own (stick-breaking, ASEntmax), scores of its own (PaTH), an
attention method's passes where the merged backend does not serve, a diagnostic that reads the probabilities, or a
learned bias wanting gradients on the CPU. It computes every encoding's attention: the reference the other backends
are tested against."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from model.attention.chunks import at_least_float32, chunks, effective_window, expand_kv_heads, span
from model.attention.registry import Backend, Observer, register_backend

# Chunks hold at most 2^20 (4 MiB) (batch x heads x rows x keys) elements: the scores, softmax and probabilities @
# values each pass over the chunk, which then stays in cache (`python -m scripts.encoding_costs`, docs/performance.md).
CHUNK_ELEMENTS = 2**20
# No-grad forwards take at least this many query rows per chunk: the budget above gives a 4,096-token SmolLM2 window
# (9 heads) 28-row chunks, and SelfExtend there took 317 s against 58 s with 455-row ones (bf16, shared 2-core Zen
# 4); at 32k keys it would give 3 rows. Without gradients a chunk's scores are freed at once.
MIN_ROWS_NO_GRAD = 256



@register_backend
class Explicit(Backend):
    name = "explicit"

    def __init__(self, reason: str, observer: Observer | None = None, **options: Any) -> None:
        super().__init__(reason)
        self.observer = observer

    def attend(self, layer, inputs) -> torch.Tensor:
        q, encoding, state, index = inputs.q, inputs.encoding, inputs.state, layer.layer_index
        batch, heads = q.shape[:2]
        window = effective_window(layer.window, inputs)
        rows_per_chunk = max(1, CHUNK_ELEMENTS // (batch * heads * span(window, inputs, layer.chunk)))
        if not torch.is_grad_enabled():
            rows_per_chunk = max(rows_per_chunk, MIN_ROWS_NO_GRAD)
        k, v = expand_kv_heads(inputs, heads)
        passes = inputs.passes
        encoded = encoded_passes(inputs, k) if passes else None
        dropout = layer.dropout_now()
        outputs = []
        for chunk in chunks(inputs, rows_per_chunk, window, layer.chunk):
            rows, keys, visible = chunk.rows, chunk.keys, chunk.visible
            if passes:
                scores = None
                for one_pass, pass_state, (q_pass, k_pass) in zip(passes, inputs.pass_states, encoded):
                    pass_scores = logits(layer, q_pass[:, :, rows], k_pass[:, :, keys], encoding, pass_state,
                                         rows, keys)
                    scores = pass_scores if one_pass.select is None else \
                        torch.where(one_pass.select(chunk.i, chunk.j)[:, None], pass_scores, scores)
                if visible is not None:
                    scores = scores.masked_fill(~visible, float("-inf"))
            else:
                q_rows = q[:, :, rows]
                if encoding.own_scores:  # keys transformed per query (PaTH): all keys, the chunks in order
                    scores = encoding.attention_scores(q_rows, k, state, index, rows, keys)
                else:
                    scores = at_least_float32(q_rows @ k[:, :, keys].transpose(-1, -2)) / layer.score_root
                if visible is not None:
                    scores = scores.masked_fill(~visible, float("-inf"))
                bias = encoding.score_bias(q_rows, state, index, rows, keys,
                                           scores if encoding.bias_needs_scores else None)
                if bias is not None:
                    scores = scores + bias
            if layer.sink_logits is not None:  # gpt-oss's sink: a logit per head in the softmax, with no value
                sink = layer.sink_logits.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
                probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
            else:
                probs = encoding.attention_weights(scores, state, index, visible)
            if self.observer is not None:
                self.observer(index, rows, keys, probs)
            probs = F.dropout(probs, dropout, layer.training).to(v.dtype)
            output = probs @ v[:, :, keys]
            value = encoding.value_term(probs, state, index, rows, keys)
            outputs.append(output if value is None else output + value)
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def encoded_passes(inputs, k: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(queries, keys) encoded for each of an attention method's passes, once for all chunks, with the method's
    query scale (logn) on each pass's encoded queries."""
    return [(q_pass, inputs.encoding.encode_keys(k, state))
            for q_pass, state in zip(encoded_queries(inputs), inputs.pass_states)]


def encoded_queries(inputs) -> list[torch.Tensor]:
    """The queries encoded for each of an attention method's passes, with its query scale (logn)."""
    queries = [inputs.encoding.encode_queries(inputs.q, state) for state in inputs.pass_states]
    if inputs.pass_scale is not None:
        queries = [q_pass * inputs.pass_scale.to(q_pass.dtype) for q_pass in queries]
    return queries


def logits(layer, q: torch.Tensor, k: torch.Tensor, encoding, state: Any, rows: slice, keys: slice) -> torch.Tensor:
    """Scaled q.k logits (float32) plus the encoding's bias for this state."""
    scores = at_least_float32(q @ k.transpose(-1, -2)) / layer.score_root
    bias = encoding.score_bias(q, state, layer.layer_index, rows, keys)
    return scores if bias is None else scores + bias
