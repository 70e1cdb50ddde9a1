"""The interface every attention backend has, and what one is chosen from.

A backend computes one layer's attention from its Inputs (model/attention/chunks.py). It declares, as `why_not`,
what it cannot compute (an encoding or a setting it does not serve: a reason, or None); the registry
(model/attention/registry.py) chooses among the backends that can, once per model view and mode, and keeps the
chosen instance, with the reason, for every later forward of that mode."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from model.kv_cache import KVCache

if TYPE_CHECKING:
    from model.attention_methods import MethodContext
    from model.encodings.base import PositionEncoding

TRAIN, EVALUATE, DECODE = "train", "evaluate", "decode"


@dataclass(frozen=True)
class Setting:
    """What a layer's backend is chosen from: fixed for a model view (its encoding, attention methods and layer
    windows) and mode (train: gradients; evaluate: no gradients, no KV cache; decode: a KV cache), on a device
    and in a precision."""

    mode: str
    device: str  # "cpu", "cuda", ...
    dtype: torch.dtype  # of the queries (bf16 under autocast)
    window: int = 0  # the layer's sliding window (0: global)
    chunk: int = 0  # the layer's attention chunk (0: none)
    sinks: bool = False  # the layer has learned sink logits (gpt-oss)
    methods: bool = False  # an inference-time attention method is in effect
    passes: bool = False  # ... one that encodes positions per pass at score time (ReRoPE, SelfExtend, sinks)
    visibility: bool = False  # ... one that limits which keys a query sees (window, sinks)
    observed: bool = False  # a diagnostic reads the attention probabilities
    dropout: float = 0.0
    compiling: bool = False  # inside a compiled graph (training's validation)
    preference: str = "auto"  # model.attention_backend: "auto" or a backend's name

    @property
    def grad(self) -> bool:
        return self.mode == TRAIN


class Layer(Protocol):
    """What a backend reads of the attention layer it computes (model/attention/layer.py Attention)."""

    layer_index: int
    window: int  # the layer's sliding window (0: global)
    chunk: int  # the layer's attention chunk (0: none)
    sink_logits: torch.Tensor | None  # (heads,): learned sink logits, or None
    score_scale: float  # 1 / sqrt(head_dim), the fused kernels' scale
    score_root: float  # sqrt(head_dim), which the explicit steps divide by
    training: bool

    def dropout_now(self) -> float: ...


@dataclass
class Inputs:
    """One layer's attention inputs for one forward: queries (batch, heads, time, dim), keys and values (batch,
    kv_heads, keys, dim), the encoding and its state for this layer, the KV cache, and an attention method's
    context: its passes' states and a query scale (logn) to apply per pass (q and k are then raw)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    encoding: "PositionEncoding"
    state: Any
    kv_cache: KVCache | None = None
    causal: bool = True
    methods: "MethodContext | None" = None
    pass_states: list[Any] | None = None
    pass_scale: torch.Tensor | None = None

    @property
    def static(self) -> bool:
        return self.kv_cache is not None and self.kv_cache.static

    @property
    def passes(self) -> list[Any] | None:
        return self.methods.passes if self.methods is not None and self.methods.passes else None


class Backend:
    """One way to compute attention. Subclasses set `name`, implement `attend`, and say in `why_not` what they
    cannot compute; `reason` is why this instance was chosen (logged, and shown by attention_paths)."""

    name: ClassVar[str]
    # True for a backend that serves some forwards of its setting only (FlexAttention's): it is built with the
    # backend the rules choose without it, `fallback`, which takes the others
    needs_fallback: ClassVar[bool] = False

    def __init__(self, reason: str, **options: Any) -> None:
        self.reason = reason

    @classmethod
    def why_not(cls, encoding: "PositionEncoding", setting: Setting) -> str | None:
        """None when this backend computes `encoding`'s attention exactly in `setting`, else why it cannot."""
        return None

    def attend(self, layer: Layer, inputs: Inputs) -> torch.Tensor:
        """(batch, heads, queries, value dim): the attention output."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the latest forward took, and why."""
        return f"{self.name}: {self.reason}"
