"""flex: FlexAttention (torch.nn.attention.flex_attention, compiled) for the long evaluation forwards of the encodings that
name a `flex_kind` (model/encodings/__init__.py): "distance", a bias of the distance i - j alone (ALiBi, T5, KERPLE);
"clipped", a bias and value term of the query and min(i - j, clip) (Shaw); "separable", a bias that is a term of
the query less a term of the key (FoX's c_i - c_j).

Where it is used follows the measurements of scripts.performance.flex_costs (docs/performance.md): for a
distance bias and one sequence FlexAttention is faster than the chunked path at long lengths, with a lower peak
memory; a sliding window is slower with it, and torch has no FlexAttention backward on CPU. With two or more
sequences the chunked path builds each chunk's distance bias once for all of them and is as fast or faster, so a
distance bias takes FlexAttention for one sequence only. Shaw's bias depends on each query, so the chunked path
shares nothing between sequences, and the clipped path is faster for batches too. So FlexAttention serves forwards without gradients, on the CPU (where it was measured), in float32, with no KV cache,
no attention method and no window: the scoring of long windows. Everything else, and any forward shorter than
MIN_LENGTH (one or two chunks, where a compilation per shape would not pay), keeps the chunked path, which stays
the reference (parity: tests/test_flex.py). Whether a layer takes it is decided with every other backend in
model/attention/registry.py; the per-forward conditions (length, batch, consecutive positions) are checked here,
and a forward that does not meet them takes the backend chosen beside it (its fallback).

The bias enters as a (heads, time) table of its values at each distance, read by the score_mod: the encoding's own
score_bias fills it from the last query row, so the two paths add the same numbers. The block mask (causal) is
built once per length.

A clipped encoding (Shaw) gives each query's bias at distance min(i - j, clip) and one value vector per clipped
distance; its value term sum_d w_id a_d needs the attention probabilities w_id of the clip nearest keys (d < clip)
and the far keys' sum (d >= clip). So the two parts are computed apart and merged, as split-key attention merges
partial softmaxes: the near band (clip keys per query) explicitly, the far keys through FlexAttention with no bias
(theirs, table[i, clip], is one constant per query, which the softmax ignores once the near logits are taken
relative to it). FlexAttention on the CPU returns no log-sum-exp, so the far keys' mass comes from an extra key: a
sink before the first key, seen by every query, scored m_i (the largest near logit), with a value that is 1 in an
extra channel and 0 elsewhere. That channel is s_i = e^m_i / (F_i + e^m_i), so the far mass is
F_i / e^m_i = (1 - s_i) / s_i, the near masses are exp(logit - m_i) <= 1, and every probability is a mass over
their sum; the far keys' output is the other channels / (s_i * total), with no division by 1 - s_i.

On CUDA nothing is measured yet, so FlexAttention is used there only with model.attention_backend = "flex" (the GPU
session asks for it in its measurements), and then under other rules (Flex.why_not): FlexAttention has a backward and bf16 kernels on CUDA, so training, bf16 autocast, batches
and a layer's sliding window (a block mask that skips the keys outside it) take it too. Gradients reach a learned
bias through the tensors its score_mod reads (T5's and KERPLE's distance table, FoX's terms). FIRE's bias depends
on the query's position as well as on i - j (its distance is normalised by the query's position), so it has no
table and stays on the chunked path everywhere.

If compiling fails (no C++ compiler, say), a warning names the error, and this backend (its model view and mode)
takes its fallback from then on; nothing else in the process changes. model.attention_backend = "explicit" (or "sdpa_mask",
where it serves) keeps a model off it.
"""
from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from model.attention.registry import DECODE, TRAIN, FallbackBackend, Workload, first_reason, register_backend
from model.compiled import Compiled

MIN_LENGTH = 512  # shorter forwards keep the chunked path
CUDA_MIN_LENGTH = 128  # on CUDA (model.attention_backend = "flex"): one FlexAttention block; not measured yet
_block_masks: dict[tuple[int, str, int, int], Any] = {}
# The latest encoding state consecutive() answered for, with its positions (weak references: they die with their
# forward), and the answer
_latest: tuple[weakref.ref, weakref.ref, weakref.ref, bool] | None = None


def consecutive(state: Any) -> bool:
    """Whether the positions of `state` let the bias be a table indexed by i - j: the keys are the queries, and
    they are consecutive. An encoding prepares its state once per forward (model/transformer.py), and the layers
    that share it (each layer of ALiBi, T5, KERPLE, Shaw) ask about it in turn: the answer for the latest state is
    kept, so that it is computed once per forward."""
    global _latest
    if not hasattr(state, "queries"):
        return False
    queries, keys = state.queries, state.keys
    latest = _latest
    if latest is not None and latest[0]() is state and latest[1]() is queries and latest[2]() is keys:
        return latest[3]
    answer = queries.shape == keys.shape and bool(torch.equal(queries, keys)) and \
        bool((queries[:, 1:] - queries[:, :-1] == 1).all())
    _latest = (weakref.ref(state), weakref.ref(queries), weakref.ref(keys), answer)
    return answer


def distance_table(q: torch.Tensor, encoding: Any, state: Any, layer: int) -> torch.Tensor:
    """(heads, time) float32: the bias at distance d = i - j, read from the last query row (which sees every
    distance from 0 to time - 1)."""
    time = q.shape[2]
    last = slice(time - 1, time)
    bias = encoding.score_bias(q[:, :, last], state, layer, last, slice(0, time))  # (batch|1, heads, 1, time)
    return bias[0, :, 0].flip(-1).to(torch.float32).contiguous()


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, block_mask: Any,
          enable_gqa: bool) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, i, j):  # noqa: ANN001, ANN202 (flex's signature)
        return score + table[h, i - j]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)


def _flex_separable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_terms: torch.Tensor,
                    key_terms: torch.Tensor, block_mask: Any, enable_gqa: bool) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, i, j):  # noqa: ANN001, ANN202 (flex's signature)
        return score + query_terms[b, h, i] - key_terms[b, h, j]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)


def _flex_far(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: torch.Tensor, block_mask: Any,
              enable_gqa: bool) -> torch.Tensor:
    """Plain scaled logits over the keys the block mask shows; key 0 is the sink, scored sink[b, h, i]."""
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, h, i, j):  # noqa: ANN001, ANN202 (flex's signature)
        return torch.where(j == 0, sink[b, h, i], score)

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)


def block_mask(time: int, device: torch.device, clip: int = 0, window: int = 0) -> Any:
    """Built once per (time, device, clip, window). clip = 0: the causal block mask for `time` queries and keys,
    limited to the `window` latest keys of each query when window > 0 (as the chunked path's visible_keys). clip > 0:
    for `time` queries and a sink followed by the `time` keys (key j + 1 is token j): the sink, and the tokens at
    distance clip or more (j <= i - clip)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = (time, str(device), clip, window)
    if key not in _block_masks:
        if len(_block_masks) >= 16:
            _block_masks.clear()
        if clip:
            mask, keys = (lambda b, h, i, j: (j == 0) | (j <= i + 1 - clip)), time + 1
        elif window:
            mask, keys = (lambda b, h, i, j: (i >= j) & (i - j < window)), time
        else:
            mask, keys = (lambda b, h, i, j: i >= j), time
        _block_masks[key] = create_block_mask(mask, None, None, time, keys, device=str(device))
    return _block_masks[key]


_INSTEAD = "this model view continues on the chunked backend chosen beside FlexAttention (model/attention/flex.py)"
# Compiled once per process (the compiled code is shared); a failure is returned to the backend that called, which
# falls back on its own (remember=False: the next view tries again).
_kernel = Compiled(_flex, "FlexAttention", _INSTEAD, remember=False)
_far_kernel = Compiled(_flex_far, "FlexAttention (a clipped encoding's far keys)", _INSTEAD, remember=False)
# A separable bias compiles with static shapes (one compilation per shape). With symbolic shapes its kernel failed
# at the second length an evaluation scored on the CPU (inductor's bounds check on the captured terms, "index out of
# bounds: 0 <= tmp41 < ks4", torch 2.13), and its backward failed to lower on CUDA once evaluation at other lengths had
# made the shapes symbolic (torch 2.11, H200: sym_size of a captured tensor, inside loss.backward(), where no fallback
# can catch it). The distance kinds keep the dynamic kernel: compiled with static shapes, T5's table got wrong
# gradients at distances 0 and 1 (the same H200, tests/test_cuda.py), while the dynamic kernel matched the chunked
# path's gradients for ALiBi, T5, KERPLE and Shaw on CUDA.
_separable_kernel = Compiled(_flex_separable, "FlexAttention (a separable bias)", _INSTEAD, remember=False,
                             dynamic=False)


def clipped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, encoding: Any, state: Any,
                      layer: int) -> torch.Tensor | None:
    """Causal attention of a clipped encoding (bias and value term): the far keys through FlexAttention with a sink
    that yields their softmax mass, the near band explicitly, the two merged (module docstring). None when
    compiling failed."""
    table, values = encoding.clipped_tables(q, state, layer)  # (batch, heads, time, clip + 1), (clip + 1, dim)
    batch, heads, time, dim = q.shape
    clip = table.shape[-1] - 1
    k_all = k.repeat_interleave(heads // k.shape[1], dim=1)
    v_all = v.repeat_interleave(heads // v.shape[1], dim=1)
    # The near logits less the far keys' bias table[..., clip] (a constant per query: the softmax is unchanged).
    near = torch.full((batch, heads, time, clip), float("-inf"), dtype=torch.float32, device=q.device)
    for d in range(min(clip, time)):  # the key at distance d of every query i >= d
        near[:, :, d:, d] = (q[:, :, d:] * k_all[:, :, : time - d]).sum(-1).float()
    near = near / math.sqrt(dim) + (table[..., :clip] - table[..., clip:])
    # Every query has its own key (d = 0). The result does not depend on top (it only keeps the exponentials in
    # range), so no gradient goes through it (FlexAttention's backward on CUDA then needs none for the sink).
    top = near.amax(-1).detach()
    zero = k.new_zeros(batch, k.shape[1], 1, dim)
    k_sink = torch.cat((zero, k), dim=2)
    v_sink = torch.cat((torch.cat((zero, zero.new_ones(batch, k.shape[1], 1, 1)), dim=-1),
                        torch.cat((v, v.new_zeros(*v.shape[:3], 1)), dim=-1)), dim=2)
    out = _far_kernel(q, k_sink, v_sink, top, block_mask(time, q.device, clip), k.shape[1] != heads)
    if out is None:
        return None
    share = out[..., dim].float().clamp_min(torch.finfo(torch.float32).tiny)  # e^top / (far mass + e^top)
    far = (1 - share) / share  # the far keys' mass, in units of e^top (0 for queries i < clip)
    near = torch.exp(near - top[..., None])  # each near key's mass, in the same units
    total = far + near.sum(-1)
    weights = torch.cat((near, far[..., None]), dim=-1) / total[..., None]  # probabilities at d < clip, and d >= clip
    output = out[..., :dim] / (share * total)[..., None] + weights @ values.to(weights.dtype)
    for d in range(min(clip, time)):
        output[:, :, d:] += weights[:, :, d:, d, None] * v_all[:, :, : time - d]
    return output


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, encoding: Any, state: Any,
              layer: int, window: int = 0) -> torch.Tensor | None:
    """Causal attention with the encoding's bias (and value term) through compiled FlexAttention, or None when
    compiling failed (then the backend takes its fallback). `window` > 0: each query sees its `window` latest keys
    (a distance or separable bias; Flex.why_not never takes a clipped one with a window)."""
    if encoding.flex_kind == "clipped":
        if window:
            raise ValueError("a clipped bias takes FlexAttention without a window (Flex.why_not)")
        return clipped_attention(q, k, v, encoding, state, layer)
    mask = block_mask(q.shape[2], q.device, window=window)
    if encoding.flex_kind == "separable":
        query_terms, key_terms = encoding.separable_terms(state)
        return _separable_kernel(q, k, v, query_terms.contiguous(), key_terms.contiguous(), mask, k.shape[1] != q.shape[1])
    table = distance_table(q, encoding, state, layer)
    return _kernel(q, k, v, table, mask, k.shape[1] != q.shape[1])


@register_backend
class Flex(FallbackBackend):
    """FlexAttention for the forwards it serves, the backend chosen beside it (`fallback`) for the others: shorter
    than MIN_LENGTH, several sequences with a distance bias on the CPU, positions that are not consecutive, or after
    compiling failed for this view."""

    name = "flex"

    @classmethod
    def why_not(cls, encoding, workload: Workload) -> str | None:
        """What FlexAttention cannot compute here: on the CPU (which has no FlexAttention backward) no-grad float32
        forwards; on CUDA, training and bf16 too (why_not_on_cuda)."""
        if encoding.flex_kind is None:
            return "no bias that is a function of the distance alone (or a query's term less a key's)"
        checks = [
            (workload.mode == DECODE, "a KV cache"),
            (workload.methods or workload.observed or workload.dropout, "an attention method, a diagnostic or dropout"),
            (workload.compiling, "inside a compiled graph"),
            (workload.chunk, "an attention chunk, which its block masks do not draw"),
            (workload.sinks, "learned sink logits"),
            (workload.window and encoding.flex_kind == "clipped",
             "a window with a clipped bias, whose near band is computed without one"),
        ]
        if workload.device == "cuda":
            checks.append((workload.dtype not in (torch.float32, torch.bfloat16),
                           f"{str(workload.dtype).removeprefix('torch.')}, and it serves float32 and bfloat16"))
        else:
            checks += [(workload.device != "cpu", f"not tried on {workload.device}"),
                       (workload.mode == TRAIN, "gradients are wanted, and torch has no FlexAttention backward on the CPU"),
                       (workload.dtype != torch.float32,
                        f"{str(workload.dtype).removeprefix('torch.')}, and it serves float32 on the CPU")]
        # first_reason's rule, read here: the registry asks this while it chooses, and the choice calls no helper of
        # the registry's file back (one pass from the registry to a backend's file: scripts.kernel_route)
        return next((reason for failed, reason in checks if failed), None)

    @classmethod
    def why_not_by_default(cls, encoding, workload: Workload) -> str | None:
        """What keeps "auto" from choosing it where it could serve: it was measured faster on the CPU only, and
        there not with a window (python -m scripts.performance.flex_costs, docs/performance.md)."""
        blocked = cls.why_not(encoding, workload)
        if blocked is not None:
            return blocked
        if workload.device != "cpu":
            return (f"measured on the CPU only, not on {workload.device} (model.attention_backend = \"flex\" takes "
                    "it there, to measure it)")
        if workload.window:
            return "a window, which it serves slower than the chunked path on the CPU"
        return None

    def why_not_served(self, inputs) -> str | None:
        q, k = inputs.q, inputs.k
        cuda = q.device.type == "cuda"
        shortest = CUDA_MIN_LENGTH if cuda else MIN_LENGTH
        blocked = first_reason([
            (q.shape[2] != k.shape[2] or q.shape[2] < shortest,
             f"shorter than {shortest} tokens" + ("" if cuda else ", where compiling for each shape does not pay")),
            (not cuda and inputs.encoding.flex_kind == "distance" and q.shape[0] != 1,
             "several sequences, between which the chunked path shares each chunk's bias"),
        ])
        if blocked is None and not consecutive(inputs.state):  # last: it reads the positions
            blocked = "positions that are not consecutive"
        return blocked

    def compute(self, layer, inputs) -> torch.Tensor | None:
        return attention(inputs.q, inputs.k, inputs.v, inputs.encoding, inputs.state, layer.layer_index, layer.window)

    def kernel(self, inputs) -> Compiled:
        return {"clipped": _far_kernel, "separable": _separable_kernel}.get(inputs.encoding.flex_kind, _kernel)
