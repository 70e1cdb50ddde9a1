"""Which attention path a forward takes, decided in one place: choose(encoding, forward) returns the path and why.

    sdpa       F.scaled_dot_product_attention fused over the whole sequence (is_causal, or a boolean mask for a
               KV cache): an encoding whose attention is FUSED (RoPE, xPos, NoPE, SSMax, the absolute ones), no
               window, nothing that reads the probabilities
    sdpa_mask  SDPA in chunks of query rows, each against the keys it can see, with the encoding's bias (and the
               window) as a float mask: a BIAS encoding (ALiBi, T5, KERPLE, FIRE, FoX) whose bias is fixed, or
               learned on a device with a mask gradient
    explicit   the explicit steps in chunks (scores, softmax, probabilities @ values): an EXPLICIT encoding (a bias
               that reads the scores: CoPE, DAPE; a value term: Shaw; weights of its own: stick-breaking, ASEntmax;
               scores of its own: PaTH), an attention method's passes where the merged path does not serve,
               probabilities a diagnostic reads, or a learned bias wanting gradients on the CPU
    merged     an attention method's passes (ReRoPE, SelfExtend, sinks) each through the fused CPU kernel with a mask of
               the pairs it owns, merged by their log-sum-exps (model/pass_merge.py): encodings that add nothing to
               the scores, no-grad CPU forwards, nothing that reads the probabilities
    flex       compiled FlexAttention with the bias as a score_mod (model/flex.py): the long no-grad float32 CPU
               forwards of an encoding with a `flex_kind`: a distance bias over one sequence, a clipped one (Shaw)
               or a separable one (FoX). On CUDA only with runtime.flex_cuda (off by default: not measured there
               yet), and then also in training, in bf16, for batches and with a layer's window (why_not_flex_on_cuda)

The encoding names what its attention needs (`attention`, `flex_kind`: model/encodings/base.py), never by its own
name; everything else is a field of Forward, which the attention fills for each forward, so choose is a function of
its arguments. `python -m scripts.attention_paths` prints the decision for every encoding in training, 16x
evaluation and cached decoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

import model.flex as flex
import model.pass_merge as pass_merge
from model.encodings.base import EXPLICIT as NEEDS_EXPLICIT
from model.encodings.base import FUSED

SDPA, SDPA_MASK, EXPLICIT, FLEX, MERGED = "sdpa", "sdpa_mask", "explicit", "flex", "merged"


@dataclass(frozen=True)
class Forward:
    """What the choice depends on, for one layer's forward."""

    device: str  # "cpu", "cuda", ...
    grad: bool  # gradients are wanted
    dtype: torch.dtype  # of the queries (bf16 under autocast)
    batch: int
    queries: int
    keys: int
    cache: str = "none"  # "none", "dynamic" (a growing KV cache) or "static" (fixed slots)
    window: int = 0  # the layer's sliding window (0: global)
    methods: bool = False  # an inference-time attention method is in effect
    passes: bool = False  # ... one that encodes positions per pass at score time (ReRoPE, SelfExtend, sinks)
    visibility: bool = False  # ... one that limits which keys a query sees (window, sinks)
    observed: bool = False  # a diagnostic reads the attention probabilities
    dropout: float = 0.0
    compiling: bool = False  # inside a compiled graph (training's validation)
    causal: bool = True
    flex_enabled: bool = True  # runtime.flex_attention, the process's switch (model/runtime.py)
    flex_cuda: bool = False  # runtime.flex_cuda: FlexAttention on CUDA too (to measure it; off by default)


@dataclass(frozen=True)
class Path:
    kind: str  # SDPA, SDPA_MASK, EXPLICIT, FLEX or MERGED
    reason: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


def learned_bias(encoding: Any) -> bool:
    return encoding.has_score_bias and any(parameter.requires_grad for parameter in encoding.parameters())


def why_not_flex(encoding: Any, forward: Forward) -> str | None:
    """None when FlexAttention serves this forward (model/flex.py says why these conditions), else the first
    reason it does not."""
    if encoding.flex_kind is None:
        return "no bias that is a function of the distance alone (or a query's term less a key's)"
    if not forward.flex_enabled:
        return "runtime.flex_attention is off"
    if forward.device == "cuda" and forward.flex_cuda:
        reason = why_not_flex_on_cuda(encoding, forward)
    else:
        checks = [
            (forward.device != "cpu", f"measured on the CPU only, not on {forward.device}"
                                      + (" (runtime.flex_cuda turns it on there, to measure it)"
                                         if forward.device == "cuda" else "")),
            (forward.grad, "gradients are wanted, and it serves no-grad evaluation"),
            (forward.compiling, "inside a compiled graph"),
            (not forward.causal or forward.cache != "none", "a KV cache or a non-causal forward"),
            (forward.methods or forward.window or forward.observed or forward.dropout,
             "an attention method, a window, a diagnostic or dropout"),
            (forward.dtype != torch.float32, f"{str(forward.dtype).removeprefix('torch.')}, and it serves float32"),
            (forward.queries != forward.keys or forward.queries < flex.MIN_LENGTH,
             f"shorter than {flex.MIN_LENGTH} tokens, where compiling for each shape does not pay"),
            (encoding.flex_kind == "distance" and forward.batch != 1,
             "several sequences, between which the chunked path shares each chunk's bias"),
        ]
        reason = next((reason for failed, reason in checks if failed), None)
    if reason is None and flex.failed(encoding):
        reason = "compiling FlexAttention failed in this process"
    return reason


def why_not_merged(encoding: Any, forward: Forward) -> str | None:
    """None when an attention method's passes take the merged path (model/pass_merge.py), else why not."""
    checks = [
        (encoding.attention != FUSED, "the encoding adds to the scores"),
        (forward.device != "cpu", f"its kernel is the CPU's, not {forward.device}'s"),
        (forward.grad, "gradients are wanted"),
        (forward.observed or forward.dropout, "a diagnostic reads the probabilities, or dropout"),
        (not pass_merge.available(), "this torch has no fused CPU kernel that returns the log-sum-exp"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def why_not_flex_on_cuda(encoding: Any, forward: Forward) -> str | None:
    """The rules on CUDA once runtime.flex_cuda is on. FlexAttention has a backward there and Triton kernels for
    bf16, and its block mask skips the keys outside a window, so training, bf16, batches and a layer's window take
    it too; how fast each is against the chunked path is not measured yet (the GPU session's cost step measures
    it: docs/performance.md). Parity with the chunked path: tests/test_cuda.py."""
    checks = [
        (forward.compiling, "inside a compiled graph (FlexAttention within train.compile is not tried yet)"),
        (not forward.causal or forward.cache != "none", "a KV cache or a non-causal forward"),
        (forward.methods or forward.observed or forward.dropout, "an attention method, a diagnostic or dropout"),
        (forward.window and encoding.flex_kind == "clipped",
         "a window with a clipped bias, whose near band model/flex.py computes without one"),
        (forward.dtype not in (torch.float32, torch.bfloat16),
         f"{str(forward.dtype).removeprefix('torch.')}, and it serves float32 and bfloat16"),
        (forward.queries != forward.keys or forward.queries < flex.CUDA_MIN_LENGTH,
         f"shorter than {flex.CUDA_MIN_LENGTH} tokens (one FlexAttention block)"),
    ]
    return next((reason for failed, reason in checks if failed), None)


def choose(encoding: Any, forward: Forward, consecutive: Callable[[], bool] = lambda: True) -> Path:
    """The path of one layer's attention for `forward` with `encoding`, and why. `consecutive()`: whether the
    positions are consecutive and the keys the queries (FlexAttention indexes its bias table by i - j); it is asked
    only when everything else allows FlexAttention."""
    if forward.passes:
        blocked = why_not_merged(encoding, forward)
        if blocked is None:
            return Path(MERGED, "an attention method's passes, each through the fused kernel, merged by log-sum-exp")
        return Path(EXPLICIT, f"an attention method encodes positions per pass at score time; not merged: {blocked}")
    if encoding.attention == FUSED and not (forward.window or forward.observed or forward.visibility):
        return Path(SDPA, "no score bias and no window: the fused kernel")
    blocked = why_not_flex(encoding, forward)
    if blocked is None:
        if consecutive():
            return Path(FLEX, f"a long no-grad forward of a {encoding.flex_kind} bias")
        blocked = "positions that are not consecutive"
    if encoding.attention == NEEDS_EXPLICIT:
        return Path(EXPLICIT, f"{encoding.why_explicit}; not flex: {blocked}")
    if forward.observed:
        return Path(EXPLICIT, "a diagnostic reads the probabilities")
    # SDPA's fused CPU kernel takes no mask gradient, and its math fallback measured slower than the explicit steps
    # (it also guards every row against having no visible key; the encoding cost table in docs/encodings.md). Not
    # measured on CUDA, whose memory-efficient kernel has a mask gradient: a learned bias keeps SDPA there.
    if forward.device == "cpu" and forward.grad and learned_bias(encoding):
        return Path(EXPLICIT, "a learned bias wanting gradients on the CPU, where SDPA's fused kernel takes no mask "
                              "gradient and its fallback measured slower")
    what = "a score bias" if encoding.attention != FUSED else "a window"
    return Path(SDPA_MASK, f"{what} as a float mask, in chunks of query rows; not flex: {blocked}")


def describe(paths: dict[int, Path]) -> dict[str, str]:
    """{layer range: path} for the paths the layers took, e.g. {"layers 0-3": "sdpa: ..."}: equal neighbours
    merged."""
    merged: list[tuple[list[int], Path]] = []
    for layer in sorted(paths):
        if merged and merged[-1][1] == paths[layer] and merged[-1][0][-1] == layer - 1:
            merged[-1][0].append(layer)
        else:
            merged.append(([layer], paths[layer]))
    return {(f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"): str(path)
            for layers, path in merged}
