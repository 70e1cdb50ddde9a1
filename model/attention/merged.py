"""merged: an attention method's passes (ReRoPE, leaky ReRoPE, SelfExtend, sinks) through a fused kernel, merged by
their log-sum-exps.

A method that encodes positions per pass gives each (query, key) pair the score of one pass: the last pass whose
select(i, j) holds, else the first (model/methods/). The explicit steps compute every pass's scores for
every pair and pick among them, which at 16-32k tokens costs minutes per layer. The same attention is a softmax
over disjoint key sets, one per pass: pass p's output o_p and log-sum-exp s_p over the pairs it owns, merged as
split-key attention merges partial softmaxes,

    o = sum_p exp(s_p - m) o_p / sum_p exp(s_p - m),   m = max_p s_p,

which is exact. Each pass runs over the key range it owns pairs in: the keys every query of a chunk owns without a
mask (SelfExtend's far keys, ReRoPE's, the sinks), the partial ones at its edges with a float mask of the pairs the pass owns. Each part runs through PyTorch's fused
CPU attention kernel, which returns its log-sum-exp (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu;
the public SDPA does not return it, and compiled FlexAttention on the CPU refuses return_lse). A row that owns no
key in a masked part gets output 0 and log-sum-exp 0 from the kernel, so its weight is set to 0 here.

Each pass encodes every key at its own positions, so a decoding step would encode every cached key again; with a
KV cache the encoded keys (and the values repeated for the query heads) are kept in it between forwards
(KVCache.derived), and a step encodes its new key only, while the slots before it are unwritten and the encoding's
key tables there unchanged.

Only for encodings that add nothing to the scores (RoPE, xPos), forwards without gradients, on the CPU, with no
diagnostic reading the probabilities; the explicit backend stays the reference (parity: tests/test_pass_merge.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model.attention.chunks import chunks, effective_window, repeat_heads
from model.attention.explicit import encoded_queries
from model.attention.registry import TRAIN, Backend, Workload, register_backend
from model.encodings import FUSED
from model.kv_cache import Derived

KERNEL = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


# A chunk's masked parts (the edges of each pass's key range) cost about 3 x rows^2 against the unmasked rows x keys,
# so chunks stay short; their masks, (batch x rows x keys) per part, are shared by the heads.
ROWS = 512


def available() -> bool:
    return KERNEL is not None


@register_backend
class Merged(Backend):
    name = "merged"

    @classmethod
    def why_not(cls, encoding, workload: Workload) -> str | None:
        checks = [
            (not workload.passes, "no attention method that encodes positions per pass"),
            (workload.sinks, "learned sink logits"),
            (encoding.attention != FUSED, "the encoding adds to the scores"),
            (workload.device != "cpu", f"its kernel is the CPU's, not {workload.device}'s"),
            (workload.mode == TRAIN, "gradients are wanted"),
            (workload.observed or workload.dropout, "a diagnostic reads the probabilities, or dropout"),
            (not available(), "this torch has no fused CPU kernel that returns the log-sum-exp"),
        ]
        # first_reason's rule, read here: the registry asks this while it chooses, and the choice calls no helper of
        # the registry's file back (one pass from the registry to a backend's file: scripts.kernel_route)
        return next((reason for failed, reason in checks if failed), None)

    def attend(self, layer, inputs) -> torch.Tensor:
        queries = encoded_queries(inputs)
        dtype, heads = queries[0].dtype, inputs.q.shape[1]
        encoded = [(q_pass, pass_keys(inputs, layer.layer_index, index, state, dtype, heads))
                   for index, (q_pass, state) in enumerate(zip(queries, inputs.pass_states))]
        v = kept(inputs, layer.layer_index, "values", (), lambda start: repeat_heads(
            inputs.v[:, :, start:].to(dtype), heads), dtype, heads)
        outputs = []
        for rows, keys, parts in chunk_plan(inputs, effective_window(layer.window, inputs), layer.chunk):
            outputs.append(merge_parts(
                [q_pass[:, :, rows] for q_pass, _ in encoded], [k_pass[:, :, keys] for _, k_pass in encoded],
                v[:, :, keys], parts, layer.score_scale))
        return (torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]).to(inputs.v.dtype)


def pass_keys(inputs, layer: int, index: int, state, dtype: torch.dtype, heads: int) -> torch.Tensor:
    """Pass `index`'s keys encoded, in the queries' dtype (the kernel's), repeated for the query heads that share
    them: encoded on the key heads (encoding is per head, so this equals encoding the repeated keys), and with a KV
    cache kept in it between forwards (kept), so that a decoding step encodes its new key only, not every cached one
    again at each step."""
    encoding = inputs.encoding
    tables = encoding.key_tables(state)
    if tables is not None and any(table.shape[-2] != inputs.k.shape[2] for table in tables):
        tables = None
    return kept(inputs, layer, index, tables, lambda start: repeat_heads(encoding.encode_keys(
        inputs.k[:, :, start:], encoding.keys_from(state, start) if start else state).to(dtype), heads), dtype, heads)


def kept(inputs, layer: int, name, tables: tuple | None, compute, dtype: torch.dtype, heads: int) -> torch.Tensor:
    """compute(start) for the cached slots from `start` on, (batch, heads, slots - start, dim), joined to what an
    earlier forward of the same KV cache computed for the slots before it: the slots it computed, while none has
    been written since (KVCache.invalidate) and `tables` (what the computation reads besides the cache) are unchanged
    there. Everything computed afresh without a cache that keeps it (none, static), or with tables None."""
    cache, slots = inputs.kv_cache, inputs.k.shape[2]
    if cache is None or cache.static or tables is None:
        return compute(0)
    derived = cache.derived.setdefault(layer, {}).get(name)
    start = 0
    if derived is not None and derived.buffer.dtype == dtype and derived.buffer.shape[1] == heads:
        start = min(derived.valid, slots)
        same = ("same tables", name, start, tuple(id(table) for table in derived.tables))
        memo = inputs.methods.memo
        if same not in memo:  # the tables are the forward's, shared by the layers: compared once
            memo[same] = all(torch.equal(old[..., :start, :], new[..., :start, :])
                             for old, new in zip(derived.tables, tables))
        start = start if memo[same] else 0
    fresh = compute(start)
    if derived is None or derived.buffer.dtype != dtype or derived.buffer.shape[1] != heads:
        buffer = fresh.new_empty(fresh.shape[0], heads, cache.max_len, fresh.shape[-1])
        derived = cache.derived[layer][name] = Derived(buffer)
    derived.buffer[:, :, start:slots] = fresh
    derived.valid, derived.tables = slots, tables
    return derived.buffer[:, :, :slots]


@dataclass
class Part:
    """A key range [start, stop) of one pass in one chunk; `owned` (batch|1, 1, rows, keys) the pairs the pass owns
    there, None where every row owns every key (no mask)."""

    start: int
    stop: int
    owned: torch.Tensor | None
    masks: dict = field(default_factory=dict, repr=False)  # dtype -> the additive float mask (0 or -inf)

    def mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.owned is None:
            return None
        if dtype not in self.masks:
            self.masks[dtype] = torch.zeros(self.owned.shape, dtype=dtype, device=self.owned.device).masked_fill_(
                ~self.owned, float("-inf"))
        return self.masks[dtype]


def pass_parts(owned: torch.Tensor | None, keys: int) -> list[Part]:
    """One pass's parts in a chunk of `keys` keys (key_parts), each with the pairs it owns where it needs a mask."""
    if owned is None:
        return [Part(0, keys, None)]
    owned = owned.reshape((1,) * (4 - owned.dim()) + tuple(owned.shape))
    return [Part(start, stop, owned[..., start:stop] if masked else None) for start, stop, masked in key_parts(owned)]


def chunk_plan(inputs, window: int, chunk_tokens: int) -> list[tuple[slice, slice, list[list[Part]]]]:
    """(rows, keys, each pass's parts) of every chunk of query rows. They depend on the positions, the method and
    the layer's window, not on the layer's queries and keys: computed once per forward and kept in the method
    context, which every layer of the forward shares (selecting the pairs costs as much as the attention itself)."""
    key = ("merged", window, chunk_tokens, inputs.q.shape[2], inputs.k.shape[2], inputs.q.device)
    memo = inputs.methods.memo
    if key not in memo:
        plan = []
        for chunk in chunks(inputs, ROWS, window, chunk_tokens):
            selects = [None if one_pass.select is None else one_pass.select(chunk.i, chunk.j)[:, None]
                       for one_pass in inputs.passes]
            keys = chunk.keys.stop - chunk.keys.start
            plan.append((chunk.rows, chunk.keys, [pass_parts(own, keys) for own in owned_pairs(selects, chunk.visible)]))
        memo[key] = plan
    return memo[key]


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
    None (every pair). Returns (batch, heads, rows, dim) in the values' dtype."""
    return merge_parts(queries, keys, values, [pass_parts(own, values.shape[2]) for own in owned], scale)


def merge_parts(queries: list[torch.Tensor], keys: list[torch.Tensor], values: torch.Tensor,
                parts: list[list[Part]], scale: float) -> torch.Tensor:
    """merged_attention with each pass's key range already split into parts (pass_parts): each part through the
    fused kernel (the keys every row owns without a mask), the partial softmaxes merged by their log-sum-exps."""
    outputs, lses = [], []
    width = values.shape[-1]
    for q, k, pieces in zip(queries, keys, parts):
        k, v = k.to(q.dtype), values.to(q.dtype)
        if q.shape[-1] != width:  # queries and keys wider than the values (PoPE's polar form): the kernel wants
            v = torch.nn.functional.pad(v, (0, q.shape[-1] - width))  # one head size; zero columns, dropped below
        for part in pieces:
            start, stop = part.start, part.stop
            out, lse = KERNEL(q, k[:, :, start:stop], v[:, :, start:stop], 0.0, False, attn_mask=part.mask(q.dtype),
                              scale=scale)
            if part.owned is not None:  # a row with no key of its own in this part: no weight
                lse = lse.masked_fill(~part.owned.any(-1), float("-inf"))
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
