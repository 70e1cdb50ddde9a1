"""What the chunked backends share: which keys a query sees, and the chunks of query rows they loop over.

A chunk is a slice of query rows with the slice of keys any of them can see (the causal prefix, or the window), so
that the (heads x rows x keys) bias and mask stay bounded at long lengths and a window costs O(time x window)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from model.kv_cache import KVCache

if TYPE_CHECKING:
    from model.attention.registry import Inputs


@dataclass
class Chunk:
    rows: slice  # query rows
    keys: slice  # the keys they can see
    visible: torch.Tensor | None  # (batch|1, 1|heads, rows, keys) or (rows, keys): True where a query sees a key
    i: torch.Tensor | None  # an attention method's true positions of the rows (batch|1, rows, 1) ...
    j: torch.Tensor | None  # ... and of the keys (batch|1, 1, keys); None without a method


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
                 rows: slice | None = None, keys: slice | None = None, window: int = 0,
                 chunk: int = 0) -> torch.Tensor:
    """(rows, keys) True where a query may attend a key: causal, only filled slots of a static cache, within
    `window` slots of the query (itself and the window - 1 before it) when window > 0, and in the query's own chunk
    of `chunk` tokens (slots [c * chunk, (c + 1) * chunk)) when chunk > 0."""
    rows = rows if rows is not None else slice(None)
    keys = keys if keys is not None else slice(None)
    query_slot, key_slot = token_slots(q_len, k_len, device, kv_cache)
    distance = query_slot[rows, None] - key_slot[None, keys]  # >= 0 for keys at or before the query
    visible = distance >= 0
    if window:
        visible = visible & (distance < window)
    if chunk:
        visible = visible & (torch.div(query_slot[rows, None], chunk, rounding_mode="floor")
                             == torch.div(key_slot[None, keys], chunk, rounding_mode="floor"))
    return visible


def key_range(q_len: int, k_len: int, rows: slice, causal: bool, window: int, static: bool,
              chunk: int = 0) -> slice:
    """The keys a chunk of query rows can see: from the window's start, or the first row's attention chunk's start
    (or 0), to the last row's own key."""
    if static or not causal:
        return slice(0, k_len)
    offset = k_len - q_len  # queries are the last q_len of the k_len positions
    start = max(0, offset + rows.start - window + 1) if window else 0
    if chunk:
        start = (offset + rows.start) // chunk * chunk
    return slice(start, offset + rows.stop)


def effective_window(layer_window: int, inputs: Inputs) -> int:
    """The window a query sees: the layer's or the method's, the smaller; 0 when none limits the keys."""
    k_len = inputs.k.shape[2]
    method_window = inputs.methods.window if inputs.methods is not None else 0
    window = min(w for w in (layer_window, method_window, k_len + 1) if w)
    return 0 if window > k_len else window


def span(window: int, inputs: Inputs, chunk: int = 0) -> int:
    """The most keys a chunk's rows see at once (the chunk budgets are in rows x this)."""
    k_len = inputs.k.shape[2]
    if inputs.static:
        return k_len
    if window:
        return min(k_len, 2 * window)
    return min(k_len, 2 * chunk) if chunk else k_len


def chunks(inputs: Inputs, rows_per_chunk: int, window: int, chunk: int = 0) -> Iterator[Chunk]:
    """The chunks of `rows_per_chunk` query rows (fewer where a window or an attention chunk is shorter), each with
    its keys, which of them each row sees (causality, the window, the attention chunk, an attention method's
    visibility) and the method's positions."""
    q, kv_cache, methods = inputs.q, inputs.kv_cache, inputs.methods
    q_len, k_len = q.shape[2], inputs.k.shape[2]
    if window or chunk:
        rows_per_chunk = min(rows_per_chunk, window or chunk)
    # Without a static cache or an attention chunk, which keys a row sees depends only on where its keys start
    # relative to it: a window's chunks after the first share one mask.
    relative = not inputs.static and not chunk
    masks: dict[tuple[int, int, int], torch.Tensor] = {}
    for start in range(0, q_len, rows_per_chunk):
        rows = slice(start, min(q_len, start + rows_per_chunk))
        keys = key_range(q_len, k_len, rows, inputs.causal, window, inputs.static, chunk)
        visible = None
        if inputs.causal:
            shape = (rows.stop - rows.start, keys.stop - keys.start, k_len - q_len + rows.start - keys.start)
            visible = masks.get(shape) if relative else None
            if visible is None:
                visible = visible_keys(q_len, k_len, q.device, kv_cache, rows, keys, window, chunk)
                if relative:
                    masks[shape] = visible
        i = j = None
        if methods is not None:
            i = methods.q_positions[:, rows, None]  # true positions (batch|1, rows, 1) and (batch|1, 1, keys)
            j = methods.k_positions[:, None, keys]
            if methods.visible is not None:  # which keys a query sees: counted in tokens, not position ids
                query_slot, key_slot = token_slots(q_len, k_len, q.device, kv_cache)
                seen = methods.visible(query_slot[None, rows, None], key_slot[None, None, keys])[:, None]
                visible = seen if visible is None else visible & seen
        yield Chunk(rows, keys, visible, i, j)


def expand_kv_heads(inputs: Inputs, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values with one head per query head (grouped-query attention spelled out)."""
    return repeat_heads(inputs.k, heads), repeat_heads(inputs.v, heads)


def repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """x (batch, kv_heads, time, dim) with each head repeated for the query heads that share it."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)
