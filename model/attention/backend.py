"""The interface every attention backend has, and what one is chosen from.

A backend computes one layer's attention from its Inputs (model/attention/chunks.py). It declares, as `why_not`,
what it cannot compute (an encoding or a setting it does not serve: a reason, or None); the registry
(model/attention/registry.py) chooses among the backends that can, once per model view and mode, and keeps the
chosen instance, with the reason, for every later forward of that mode. A FallbackBackend serves only some forwards
of its setting (a compiled kernel's: long enough, consecutive positions) and hands the others to the backend chosen
beside it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Protocol

import torch

from model.kv_cache import KVCache

if TYPE_CHECKING:
    from model.attention_methods import MethodContext
    from model.encodings.base import PositionEncoding

TRAIN, EVALUATE, DECODE = "train", "evaluate", "decode"


def first_reason(checks: Iterable[tuple[Any, str]]) -> str | None:
    """The reason of the first (failed, reason) check that failed, or None when none did."""
    return next((reason for failed, reason in checks if failed), None)


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


class FallbackBackend(Backend):
    """A backend that serves some forwards of its setting only (a compiled FlexAttention kernel: model/attention/flex.py,
    flex_window.py). It is built with the backend the rules choose without it, `fallback`, which takes the forwards
    it does not serve (`why_not_now`), and every forward after compiling failed for this backend (its model view and
    mode): the failure is kept here, and nothing else in the process changes. Subclasses implement `why_not_served`
    (their own per-forward conditions), `compute` and `kernel`."""

    needs_fallback = True
    compiles: ClassVar[str] = "FlexAttention"  # what fails to compile, in the reason a forward takes the fallback

    def __init__(self, reason: str, fallback: Backend | None = None, **options: Any) -> None:
        super().__init__(reason)
        if fallback is None:
            raise ValueError(f"the {self.name} backend needs a fallback for the forwards it does not serve")
        self.fallback = fallback
        self.failure: str | None = None  # compiling failed for this backend: every later forward takes the fallback
        self.latest: str | None = None  # why the latest forward took the fallback (None: it took this backend)

    def why_not_now(self, inputs: Inputs) -> str | None:
        """None when this forward is computed here, else why it takes the fallback."""
        return first_reason([
            (self.failure is not None, f"compiling {self.compiles} failed for this model view ({self.failure})"),
            (not inputs.causal or inputs.kv_cache is not None, "a KV cache or a non-causal forward"),
        ]) or self.why_not_served(inputs)

    def why_not_served(self, inputs: Inputs) -> str | None:
        """This backend's own per-forward conditions: None when it serves `inputs`, else why not."""
        return None

    def compute(self, layer: Layer, inputs: Inputs) -> torch.Tensor | None:
        """The attention output, or None when compiling failed (the kernel's warning says why)."""
        raise NotImplementedError

    def kernel(self, inputs: Inputs) -> Any:
        """The Compiled kernel (model/compiled.py) that `compute` ran for `inputs`: its last_failure is kept."""
        raise NotImplementedError

    def attend(self, layer: Layer, inputs: Inputs) -> torch.Tensor:
        self.latest = self.why_not_now(inputs)
        if self.latest is None:
            out = self.compute(layer, inputs)
            if out is not None:
                return out
            self.failure = self.kernel(inputs).last_failure or "see the warning"
            self.latest = f"compiling {self.compiles} failed for this model view ({self.failure})"
        return self.fallback.attend(layer, inputs)

    def describe(self) -> str:
        if self.latest is None:
            return super().describe()
        return f"{self.fallback.describe()}; not {self.name}: {self.latest}"
