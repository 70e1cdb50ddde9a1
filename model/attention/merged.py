"""merged: an attention method's passes (ReRoPE, leaky ReRoPE, SelfExtend, sinks) through a fused kernel, merged by
their log-sum-exps.

A method that encodes positions per pass gives each (query, key) pair the score of one pass: the last pass whose
select(i, j) holds, else the first (model/attention_methods.py). The explicit steps compute every pass's scores for
every pair and pick among them, which at 16-32k tokens costs minutes per layer. The same attention is a softmax
over disjoint key sets, one per pass: pass p's output o_p and log-sum-exp s_p over the pairs it owns, merged as
split-key attention merges partial softmaxes,

    o = sum_p exp(s_p - m) o_p / sum_p exp(s_p - m),   m = max_p s_p,

which is exact. Each pass runs over the key range it owns pairs in: the keys every query of a chunk owns without a
mask (SelfExtend's far keys, ReRoPE's, the sinks), the partial ones at its edges with a float mask of the pairs the pass owns. Each part runs through PyTorch's fused
CPU attention kernel, which returns its log-sum-exp (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu;
the public SDPA does not return it, and compiled FlexAttention on the CPU refuses return_lse). A row that owns no
key in a masked part gets output 0 and log-sum-exp 0 from the kernel, so its weight is set to 0 here.

Only for encodings that add nothing to the scores (RoPE, xPos), forwards without gradients, on the CPU, with no
diagnostic reading the probabilities; the explicit backend stays the reference (parity: tests/test_pass_merge.py).
"""
from __future__ import annotations

import torch

from model.attention.backend import Backend, Setting, first_reason
from model.attention.chunks import chunks, effective_window, expand_kv_heads
from model.attention.explicit import encoded_passes
from model.encodings.base import FUSED

KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


# A chunk's masked parts (the edges of each pass's key range) cost about 3 x rows^2 against the unmasked rows x keys,
# so chunks stay short; their masks, (batch x rows x keys) per part, are shared by the heads.
ROWS = 256


def available() -> bool:
    return KERNEL is not None


class Merged(Backend):
    name = "merged"

    @classmethod
    def why_not(cls, encoding, setting: Setting) -> str | None:
        checks = [
            (not setting.passes, "no attention method that encodes positions per pass"),
            (setting.sinks, "learned sink logits"),
            (encoding.attention != FUSED, "the encoding adds to the scores"),
            (setting.device != "cpu", f"its kernel is the CPU's, not {setting.device}'s"),
            (setting.grad, "gradients are wanted"),
            (setting.observed or setting.dropout, "a diagnostic reads the probabilities, or dropout"),
            (not available(), "this torch has no fused CPU kernel that returns the log-sum-exp"),
        ]
        return first_reason(checks)

    def attend(self, layer, inputs) -> torch.Tensor:
        k, v = expand_kv_heads(inputs, inputs.q.shape[1])
        encoded = encoded_passes(inputs, k)
        outputs = []
        for chunk in chunks(inputs, ROWS, effective_window(layer.window, inputs), layer.chunk):
            selects = [None if one_pass.select is None else one_pass.select(chunk.i, chunk.j)[:, None]
                       for one_pass in inputs.passes]
            outputs.append(merged_attention(
                [q_pass[:, :, chunk.rows] for q_pass, _ in encoded], [k_pass[:, :, chunk.keys] for _, k_pass in encoded],
                v[:, :, chunk.keys], owned_pairs(selects, chunk.visible), layer.score_scale))
        return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def owned_pairs(selects: list[torch.Tensor | None], visible: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Per pass, the visible pairs whose score it gives: the last pass whose selection holds, else the first (select
    None: every pair). None for a pass that owns every pair (a single pass with no mask)."""
    owned: list[torch.Tensor | None] = [None] * len(selects)
    taken = None
    for index in range(len(selects) - 1, -1, -1):
        select = selects[index]
        if select is None:
            own = None if taken is None else ~taken
        else:
            own = select if taken is None else select & ~taken
            taken = select if taken is None else taken | select
        if visible is not None:
            own = visible if own is None else own & visible
        owned[index] = own
    return owned


def key_parts(own: torch.Tensor) -> list[tuple[int, int, bool]]:
    """The key range a pass owns pairs in, as (start, stop, masked) parts: the keys every row owns (no mask needed)
    and the partial ones before and after them (masked). own: (batch|1, 1, rows, keys)."""
    flat = own.reshape(-1, own.shape[-1])
    some = torch.nonzero(flat.any(0)).flatten()
    if some.numel() == 0:
        return []
    low, high = int(some[0]), int(some[-1]) + 1
    every = torch.nonzero(flat[:, low:high].all(0)).flatten()
    if every.numel() == 0:
        return [(low, high, True)]
    start = low + int(every[0])
    gaps = torch.nonzero(every - every[0] != torch.arange(every.numel(), device=every.device)).flatten()
    stop = low + (int(every[gaps[0] - 1]) + 1 if gaps.numel() else int(every[-1]) + 1)
    parts = [(low, start, True), (start, stop, False), (stop, high, True)]
    return [part for part in parts if part[0] < part[1]]


def merged_attention(queries: list[torch.Tensor], keys: list[torch.Tensor], values: torch.Tensor,
                     owned: list[torch.Tensor | None], scale: float) -> torch.Tensor:
    """Softmax attention over every pass's owned pairs: queries[p] (batch, heads, rows, dim) and keys[p] (batch,
    heads, keys, dim) encoded for pass p, values (batch, heads, keys, dim), owned[p] (batch|1, 1, rows, keys) or
    None (every pair). Each pass runs over the key range it owns pairs in, the keys every row owns without a mask
    (key_parts). Returns (batch, heads, rows, dim) in the values' dtype."""
    outputs, lses = [], []
    width = values.shape[-1]
    for q, k, own in zip(queries, keys, owned):
        k, v = k.to(q.dtype), values.to(q.dtype)
        if q.shape[-1] != width:  # queries and keys wider than the values (PoPE's polar form): the kernel wants
            v = torch.nn.functional.pad(v, (0, q.shape[-1] - width))  # one head size; zero columns, dropped below
        if own is None:
            parts = [(0, k.shape[2], False)]
        else:
            own = own.reshape((1,) * (4 - own.dim()) + tuple(own.shape))
            parts = key_parts(own)
        for start, stop, masked in parts:
            mask = None
            if masked:
                part = own[..., start:stop]
                mask = torch.zeros(part.shape, dtype=q.dtype, device=q.device).masked_fill_(~part, float("-inf"))
            out, lse = KERNEL(q, k[:, :, start:stop], v[:, :, start:stop], 0.0, False, attn_mask=mask, scale=scale)
            if masked:  # a row with no key of its own in this part: no weight
                lse = lse.masked_fill(~part.any(-1), float("-inf"))
            outputs.append(out[..., :width])
            lses.append(lse)
    if len(outputs) <= 1:
        return outputs[0].to(values.dtype) if outputs else torch.zeros_like(queries[0][..., :width])
    stacked = torch.stack(lses)  # (parts, batch, heads, rows)
    top = stacked.max(0).values
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(stacked - top)  # 0 where a part holds no key of the row
    total = weights.sum(0).clamp_min(torch.finfo(weights.dtype).tiny)
    merged = sum(out.float() * weight[..., None] for out, weight in zip(outputs, weights))
    return (merged / total[..., None]).to(values.dtype)
