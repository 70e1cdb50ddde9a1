"""The attention backends, by name, and the choice among them: made once per model view and mode (Setting), from
what the encoding and the attention method declare and from model.attention_backend, and kept for every forward of
that mode (model/transformer.py). The choice and its reason are logged ("pelab.attention") and shown by
Transformer.attention_paths and `python -m experiments.performance.attention_paths`.

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
A new backend is a file with a Backend subclass and a line in BACKENDS.
"""
from __future__ import annotations

import logging
from typing import Any

from errors import ConfigError
from model.attention.backend import Backend, Setting
from model.attention.explicit import Explicit, Observer
from model.attention.flex import Flex
from model.attention.flex_window import FlexWindow
from model.attention.masked import Masked
from model.attention.merged import Merged
from model.attention.sdpa import Sdpa
from model.encodings.base import EXPLICIT as NEEDS_EXPLICIT
from model.encodings.base import FUSED

BACKENDS: dict[str, type[Backend]] = {backend.name: backend for backend in (Sdpa, Masked, Explicit, Merged, Flex,
                                                                           FlexWindow)}
SDPA, SDPA_MASK, EXPLICIT, MERGED, FLEX = (backend.name for backend in (Sdpa, Masked, Explicit, Merged, Flex))
AUTO = "auto"

log = logging.getLogger("pelab.attention")


def check_name(name: str, where: str = "model.attention_backend") -> None:
    if name != AUTO and name not in BACKENDS:
        raise ConfigError(f"{where}: unknown attention backend {name!r}; valid names are {[AUTO, *BACKENDS]}")


def learned_bias(encoding: Any) -> bool:
    return encoding.has_score_bias and any(parameter.requires_grad for parameter in encoding.parameters())


def choose(encoding: Any, setting: Setting, observer: Observer | None = None) -> Backend:
    """The backend of one layer with `encoding` in `setting`, with the reason; `observer` goes to the explicit
    backend a diagnostic's view takes."""
    preference = setting.preference
    if preference != AUTO:
        check_name(preference)
        wanted = BACKENDS[preference]
        blocked = wanted.why_not(encoding, setting)
        if blocked is None:
            reason = f"model.attention_backend = {preference!r}"
            if wanted.needs_fallback:
                return wanted(reason, fallback=by_rules(encoding, setting, observer, flex=False))
            return wanted(reason, observer=observer)
        chosen = by_rules(encoding, setting, observer)
        chosen.reason += f" ({preference} cannot serve it: {blocked})"
        return chosen
    return by_rules(encoding, setting, observer)


def by_rules(encoding: Any, setting: Setting, observer: Observer | None = None, flex: bool = True) -> Backend:
    """model.attention_backend = "auto": the fastest backend that computes this attention, by the measured rules."""
    if setting.passes:
        blocked = Merged.why_not(encoding, setting)
        if blocked is None:
            return Merged("an attention method's passes, each through the fused kernel, merged by log-sum-exp")
        return Explicit(f"an attention method encodes positions per pass at score time; not merged: {blocked}",
                        observer=observer)
    if encoding.attention == FUSED and not (setting.window or setting.chunk or setting.sinks or setting.observed
                                            or setting.visibility):
        return Sdpa("no score bias and no window: the fused kernel")
    blocked = Flex.why_not_by_default(encoding, setting) if flex else None
    if flex and blocked is None:
        return Flex(f"a long no-grad forward of a {encoding.flex_kind} bias",
                    fallback=by_rules(encoding, setting, observer, flex=False))
    not_flex = f"; not flex: {blocked}" if blocked else ""
    if encoding.attention == NEEDS_EXPLICIT:
        return Explicit(f"{encoding.why_explicit}{not_flex}", observer=observer)
    if setting.observed:
        return Explicit("a diagnostic reads the probabilities", observer=observer)
    # SDPA's fused CPU kernel takes no mask gradient, and its math fallback measured slower than the explicit steps
    # (it also guards every row against having no visible key; the encoding cost table in docs/encodings.md). Not
    # measured on CUDA, whose memory-efficient kernel has a mask gradient: a learned bias keeps SDPA there.
    if setting.device == "cpu" and setting.grad and (learned_bias(encoding) or setting.sinks):
        return Explicit(f"{'learned sink logits' if setting.sinks else 'a learned bias'} wanting gradients on the "
                        "CPU, where SDPA's fused kernel takes no mask gradient and its fallback measured slower",
                        observer=observer)
    what = "a score bias" if encoding.attention != FUSED else "a window" if setting.window or setting.visibility \
        else "an attention chunk" if setting.chunk else "learned sink logits"
    return Masked(f"{what} as a float mask, in chunks of query rows{not_flex}")


def plan(encodings: list[Any], settings: list[Setting], observer: Observer | None = None) -> list[Backend]:
    """One backend per layer, logged with its reason."""
    chosen = [choose(encoding, setting, observer) for encoding, setting in zip(encodings, settings)]
    if settings and not settings[0].compiling and log.isEnabledFor(logging.INFO):  # (no logging in a graph)
        first = settings[0]
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
