"""The attention backends, by name, and the choice among them: made once per model view and mode (Workload), from
what the encoding and the attention method declare and from model.attention_backend, and kept for every forward of
that mode (model/transformer.py). The choice and its reason are logged ("pelab.attention") and shown by
Transformer.attention_paths and `python -m scripts.performance.attention_paths`.

    sdpa       F.scaled_dot_product_attention fused over the whole sequence: an encoding that adds nothing to the
               scores (RoPE, xPos, NoPE, SSMax, the absolute ones), no window, nothing that reads the probabilities
    sdpa_mask  SDPA in chunks of query rows with the bias (and the window) as a float mask: a BIAS encoding (ALiBi,
               T5, KERPLE, FIRE, FoX) whose bias is fixed, or learned on a device with a mask gradient
    explicit   the explicit steps in chunks: an EXPLICIT encoding (CoPE, DAPE, Shaw, stick-breaking, ASEntmax,
               PaTH), an attention method's passes where merged does not serve, probabilities a diagnostic reads,
               or a learned bias wanting gradients on the CPU; it computes everything (the reference)
    merged     an attention method's passes (ReRoPE, SelfExtend, sinks) each through the fused CPU kernel, merged by
               their log-sum-exps: encodings that add nothing to the scores, no-grad CPU forwards
    flex       compiled FlexAttention with the bias as a score_mod: the long no-grad float32 CPU forwards of an
               encoding with a `flex_kind` (a distance, clipped or separable bias), with the backend chosen beside
               it for the forwards it does not serve; on CUDA only when asked for (model.attention_backend = "flex")
    flex_window  a layer's sliding window through FlexAttention's block mask, for an encoding without a bias: by
               name only (model.attention_backend = "flex_window"), not measured faster than sdpa_mask yet

model.attention_backend = "auto" applies the rules above (each measured: docs/performance.md); a backend's name takes
that backend wherever it can compute the layer's attention (its `why_not`), and the rules elsewhere, saying why.
The interface (Backend, Workload, Inputs) is defined here too. A backend computes one layer's attention from its
Inputs (model/attention/chunks.py). It declares, as `why_not`,
what it cannot compute (an encoding or a workload it does not serve: a reason, or None); the registry
below chooses among the backends that can, once per model view and mode, and keeps the
chosen instance, with the reason, for every later forward of that mode. A FallbackBackend serves only some forwards
of its workload (a compiled kernel's: long enough, consecutive positions) and hands the others to the backend chosen
beside it.

A new backend is a file with a Backend subclass registered with @register_backend, and its line in BACKEND_MODULES.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol

import torch

from errors import ConfigError
from model.encodings import EXPLICIT as NEEDS_EXPLICIT
from model.encodings import FUSED
from model.kv_cache import KVCache

if TYPE_CHECKING:
    from model.encodings import PositionEncoding
    from model.methods import MethodContext

TRAIN, EVALUATE, DECODE = "train", "evaluate", "decode"

# observer(layer, rows, keys, probs): a diagnostic's view of each chunk's probabilities (batch, heads, rows, keys),
# computed explicitly (model/attention/explicit.py)
Observer = Callable[[int, slice, slice, torch.Tensor], Any]


def first_reason(checks: Iterable[tuple[Any, str]]) -> str | None:
    """The reason of the first (failed, reason) check that failed, or None when none did."""
    return next((reason for failed, reason in checks if failed), None)


@dataclass(frozen=True)
class Workload:
    """What a layer's backend computes, and is chosen from: fixed for a model view (its encoding, attention methods
    and layer windows) and mode (train: gradients; evaluate: no gradients, no KV cache; decode: a KV cache), on a
    device and in a precision. (An encoding's own `Settings` and a view's `with_settings` are other things.)"""

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


class AttentionLayer(Protocol):
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
    # True for a backend that serves some forwards of its workload only (FlexAttention's): it is built with the
    # backend the rules choose without it, `fallback`, which takes the others
    needs_fallback: ClassVar[bool] = False

    def __init__(self, reason: str, **options: Any) -> None:
        self.reason = reason

    @classmethod
    def why_not(cls, encoding: "PositionEncoding", workload: Workload) -> str | None:
        """None when this backend computes `encoding`'s attention exactly in `workload`, else why it cannot."""
        return None

    def attend(self, layer: AttentionLayer, inputs: Inputs) -> torch.Tensor:
        """(batch, heads, queries, value dim): the attention output."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the latest forward took, and why."""
        return f"{self.name}: {self.reason}"


class FallbackBackend(Backend):
    """A backend that serves some forwards of its workload only (a compiled FlexAttention kernel: model/attention/flex.py,
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

    def compute(self, layer: AttentionLayer, inputs: Inputs) -> torch.Tensor | None:
        """The attention output, or None when compiling failed (the kernel's warning says why)."""
        raise NotImplementedError

    def kernel(self, inputs: Inputs) -> Any:
        """The Compiled kernel (model/compiled.py) that `compute` ran for `inputs`: its last_failure is kept."""
        raise NotImplementedError

    def attend(self, layer: AttentionLayer, inputs: Inputs) -> torch.Tensor:
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


# The backends, one file each, listed here in the order of the registry; each registers its class with
# @register_backend when the loop at the end of this file imports it.
BACKEND_MODULES = ("sdpa", "sdpa_mask", "explicit", "merged", "flex", "flex_window")
BACKENDS: dict[str, type[Backend]] = {}
SDPA, SDPA_MASK, EXPLICIT, MERGED, FLEX = "sdpa", "sdpa_mask", "explicit", "merged", "flex"


def register_backend(cls: type[Backend]) -> type[Backend]:
    if cls.name in BACKENDS and BACKENDS[cls.name] is not cls:
        raise ValueError(f"attention backend {cls.name!r} is registered twice")
    BACKENDS[cls.name] = cls
    return cls


AUTO = "auto"

log = logging.getLogger("pelab.attention")


def check_name(name: str, where: str = "model.attention_backend") -> None:
    if name != AUTO and name not in BACKENDS:
        raise ConfigError(f"{where}: unknown attention backend {name!r}; valid names are {[AUTO, *BACKENDS]}")


def learned_bias(encoding: Any) -> bool:
    return encoding.has_score_bias and any(parameter.requires_grad for parameter in encoding.parameters())


def choose(encoding: Any, workload: Workload, observer: Observer | None = None) -> Backend:
    """The backend of one layer with `encoding` in `workload`, with the reason; `observer` goes to the explicit
    backend a diagnostic's view takes."""
    preference = workload.preference
    if preference != AUTO:
        check_name(preference)
        wanted = BACKENDS[preference]
        blocked = wanted.why_not(encoding, workload)
        if blocked is None:
            reason = f"model.attention_backend = {preference!r}"
            if wanted.needs_fallback:
                return wanted(reason, fallback=by_rules(encoding, workload, observer, flex=False))
            return wanted(reason, observer=observer)
        chosen = by_rules(encoding, workload, observer)
        chosen.reason += f" ({preference} cannot serve it: {blocked})"
        return chosen
    return by_rules(encoding, workload, observer)


def by_rules(encoding: Any, workload: Workload, observer: Observer | None = None, flex: bool = True) -> Backend:
    """model.attention_backend = "auto": the fastest backend that computes this attention, by the measured rules."""
    if workload.passes:
        blocked = BACKENDS[MERGED].why_not(encoding, workload)
        if blocked is None:
            return BACKENDS[MERGED]("an attention method's passes, each through the fused kernel, merged by log-sum-exp")
        return BACKENDS[EXPLICIT](f"an attention method encodes positions per pass at score time; not merged: {blocked}",
                        observer=observer)
    if encoding.attention == FUSED and not (workload.window or workload.chunk or workload.sinks or workload.observed
                                            or workload.visibility):
        return BACKENDS[SDPA]("no score bias and no window: the fused kernel")
    blocked = BACKENDS[FLEX].why_not_by_default(encoding, workload) if flex else None
    if flex and blocked is None:
        return BACKENDS[FLEX](f"a long no-grad forward of a {encoding.flex_kind} bias",
                    fallback=by_rules(encoding, workload, observer, flex=False))
    not_flex = f"; not flex: {blocked}" if blocked else ""
    if encoding.attention == NEEDS_EXPLICIT:
        return BACKENDS[EXPLICIT](f"{encoding.why_explicit}{not_flex}", observer=observer)
    if workload.observed:
        return BACKENDS[EXPLICIT]("a diagnostic reads the probabilities", observer=observer)
    # SDPA's fused CPU kernel takes no mask gradient, and its math fallback measured slower than the explicit steps
    # (it also guards every row against having no visible key; the encoding cost table in docs/encodings.md). Not
    # measured on CUDA, whose memory-efficient kernel has a mask gradient: a learned bias keeps SDPA there.
    if workload.device == "cpu" and workload.grad and (learned_bias(encoding) or workload.sinks):
        return BACKENDS[EXPLICIT](f"{'learned sink logits' if workload.sinks else 'a learned bias'} wanting gradients on the "
                        "CPU, where SDPA's fused kernel takes no mask gradient and its fallback measured slower",
                        observer=observer)
    what = "a score bias" if encoding.attention != FUSED else "a window" if workload.window or workload.visibility \
        else "an attention chunk" if workload.chunk else "learned sink logits"
    return BACKENDS[SDPA_MASK](f"{what} as a float mask, in chunks of query rows{not_flex}")


def plan(encodings: list[Any], workloads: list[Workload], observer: Observer | None = None) -> list[Backend]:
    """One backend per layer, logged with its reason."""
    chosen = [choose(encoding, workload, observer) for encoding, workload in zip(encodings, workloads)]
    if workloads and not workloads[0].compiling and log.isEnabledFor(logging.INFO):  # (no logging in a graph)
        first = workloads[0]
        for layers, text in describe(dict(enumerate(backend.describe() for backend in chosen))).items():
            log.info("attention (%s, %s, %s): %s: %s", first.mode, first.device,
                     str(first.dtype).removeprefix("torch."), layers, text)
    return chosen


def describe(paths: dict[int, Any]) -> dict[str, str]:
    """{layer range: path} for the backends the layers took (their descriptions), e.g. {"layers 0-3": "sdpa: ..."}:
    equal neighbours merged."""
    merged: list[tuple[list[int], str]] = []
    for layer in sorted(paths):
        text = str(paths[layer])
        if merged and merged[-1][1] == text and merged[-1][0][-1] == layer - 1:
            merged[-1][0].append(layer)
        else:
            merged.append(([layer], text))
    return {(f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}-{layers[-1]}"): text
            for layers, text in merged}


for _module in BACKEND_MODULES:
    importlib.import_module(f"model.attention.{_module}")
