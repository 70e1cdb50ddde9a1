"""Inference-time methods: what a trained checkpoint may be given at evaluation to reach past its context.

Each method names the encodings it applies to and how it sets the model up for an evaluation length;
`incremental` methods are scored token by token through the KV cache (as generation uses them), the rest with
one forward per window. "none" is the checkpoint as it is (its own scaling, if it was trained with one).

    linear, ntk, yarn, llama3,  RoPE frequency scalings with factor = length / the length the frequencies were
    resonance                   set for (config.original_length: the trained length, or for a checkpoint extended
                                with a scaling, the length before extension), static: the whole window uses that
                                factor, which is how such a scaling is configured for a length (resonance: YaRN's
                                frequencies with whole-token wavelengths, not plain RoPE even at factor 1)
    dynamic                     dynamic NTK with its own factor (1): the base grows with the current length,
                                so each token is scored under the base of its own prefix (incremental)
    clamp                       a learned table: positions past it reuse its last row
    logn, temperature           attention methods (model/attention_methods.py) with their parameters set for the
    rerope, leaky_rerope        evaluation length: logn and temperature (NoPE layers) scale queries past L; rerope
    selfextend, sinks, window   keeps distances below L / 2 exact and clamps the rest (leaky: k chosen so that the
                                longest distance maps below L); selfextend groups distances past L / 2 by the
                                smallest G that keeps every distance below L; sinks keeps 4 sink tokens and the
                                last L - 4; window the last L tokens
    a+b                         a composition (e.g. yarn+logn): each part's settings together, where the rules of
                                model/attention_methods.py allow them
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from errors import ConfigError
from model.attention_methods import ATTENTION_METHODS, applicable_encodings, refusal
from model.config import ModelConfig
from model.rope import ROPE_SCALINGS
from model.transformer import Transformer

NONE = "none"

# (the checkpoint's own config, length, trained length) -> the inference-time settings a method changes.
Changes = Callable[[dict, int, int], dict]


@dataclass(frozen=True)
class InferenceMethod:
    encodings: tuple[str, ...] | None  # None: every encoding
    changes: Changes
    incremental: bool = False
    summary: str = ""
    shift_probe: bool = False  # also run the position-shift probe under this method (length-independent methods)
    # (the checkpoint's own config, length, trained length) -> True where the method scores windows of that length
    # exactly as the checkpoint as trained does (a RoPE scaling with factor 1, a learned table never past its end):
    # the evaluation then reuses that cell instead of scoring it again (tests/test_eval_reuse.py checks each claim).
    as_trained_at: Callable[[dict, int, int], bool] = lambda own, length, trained: False

    def view(self, model: Transformer, length: int, trained: int) -> Transformer:
        """`model` under this method's settings for `length` (a view sharing its weights: model.with_settings);
        `model` itself is unchanged, and is returned when the method changes nothing."""
        return model.with_settings(**self.changes(model.config.to_dict(), length, trained))


def _as_trained(own: dict, length: int, trained: int) -> dict:
    return {}


def _original(own: dict) -> int:
    return ModelConfig.from_dict(own).original_length  # the checkpoint's own, not the current setting


def _plain_rope_within(bound: Callable[[dict, int], int]) -> Callable[[dict, int, int], bool]:
    """A RoPE scaling on a checkpoint without a scaling of its own, at lengths up to bound(own, trained): its
    factor is then 1, and linear, NTK, YaRN and Llama 3 with factor 1 are plain RoPE (the same frequencies, attention
    factor 1), as is dynamic NTK within the trained length."""
    def as_trained(own: dict, length: int, trained: int) -> bool:
        scaling = own.get("rope_scaling") or {}
        return scaling.get("rope_type", "default") == "default" and length <= bound(own, trained)

    return as_trained


def _never(own: dict, length: int, trained: int) -> bool:
    return False


def _rope_scaling(name: str) -> Changes:
    def changes(own: dict, length: int, trained: int) -> dict:
        original = _original(own)
        scaling = {"rope_type": name, "factor": max(1.0, length / original)}
        if ROPE_SCALINGS[name].needs_original_length:
            scaling["original_max_position_embeddings"] = original
        return {"rope_scaling": scaling}

    return changes


def _dynamic(name: str) -> Changes:
    def changes(own: dict, length: int, trained: int) -> dict:
        return {"rope_scaling": {"rope_type": name, "factor": 1.0, "original_max_position_embeddings": trained}}

    return changes


def _clamp(own: dict, length: int, trained: int) -> dict:
    args = own.get("position_args", {})
    return {"position_args": {**args, "learned": {**args.get("learned", {}), "clamp": True}}}


def _table_size(own: dict) -> int:
    return own.get("position_args", {}).get("learned", {}).get("max_positions") or own["max_seq_len"]


def _attention(name: str) -> Changes:
    """An attention method with its parameters set for the evaluation length (module docstring)."""

    def changes(own: dict, length: int, trained: int) -> dict:
        params = ATTENTION_METHODS[name].for_length(length, _original(own))
        return {"attention_methods": [*own.get("attention_methods", []), {"method": name, **params}]}

    return changes


# Every RoPE scaling of model.rope's registry is a method: the static ones with factor = length / L, the
# length-dependent one (dynamic NTK) with its own factor, scored incrementally.
METHODS: dict[str, InferenceMethod] = {
    NONE: InferenceMethod(None, _as_trained, summary="the checkpoint as trained", shift_probe=True),
    **{name: InferenceMethod(("rope",), _rope_scaling(name), summary=f"{record.summary}, factor = length / L",
                             as_trained_at=_plain_rope_within(lambda own, trained: _original(own))
                             if record.plain_at_factor_one else _never)
       for name, record in ROPE_SCALINGS.items() if name != "default" and not record.length_dependent},
    **{name: InferenceMethod(("rope",), _dynamic(name), incremental=True,
                             summary=f"{record.summary}, factor 1, each token under the base of its own prefix",
                             as_trained_at=_plain_rope_within(lambda own, trained: trained))
       for name, record in sorted(ROPE_SCALINGS.items()) if record.length_dependent},
    "clamp": InferenceMethod(("learned",), _clamp, summary="positions past the learned table reuse its last row",
                             shift_probe=True,
                             as_trained_at=lambda own, length, trained:
                             length <= _table_size(own)),
    **{name: InferenceMethod(applicable_encodings(cls), _attention(name),
                             summary=(cls.__doc__ or name).strip().split("\n")[0].rstrip("."))
       for name, cls in ATTENTION_METHODS.items()},
}


def method_spec(name: str) -> InferenceMethod:
    """The method `name`, or the composition "a+b" of registered methods (their changes together; attention methods
    appended in order; the model's config then checks that they combine)."""
    if name in METHODS:
        return METHODS[name]
    parts = [METHODS[part] for part in name.split("+")]
    allowed = [set(part.encodings) for part in parts if part.encodings is not None]

    def changes(own: dict, length: int, trained: int) -> dict:
        own_methods = list(own.get("attention_methods", []))
        merged: dict = {}
        added: list = []
        for part in parts:
            for key, value in part.changes(own, length, trained).items():
                if key == "attention_methods":
                    added += value[len(own_methods):]
                else:
                    merged[key] = value
        if added:
            merged["attention_methods"] = own_methods + added
        return merged

    return InferenceMethod(tuple(sorted(set.intersection(*allowed))) if allowed else None, changes,
                           incremental=any(part.incremental for part in parts),
                           summary=" + ".join(part.summary for part in parts),
                           as_trained_at=lambda own, length, trained: all(part.as_trained_at(own, length, trained)
                                                                          for part in parts))


def check_methods(names: list[str]) -> list[str]:
    unknown = [name for name in names
               if name != NONE and any(part not in METHODS or part == NONE for part in name.split("+"))]
    if unknown:
        raise ConfigError(f"unknown inference-time method(s) {unknown}; valid names are {sorted(METHODS)}, "
                          "or compositions such as yarn+logn")
    for name in names:
        if "+" in name:
            check_composition(name)
    return names


def check_composition(name: str) -> None:
    """Refuse a composition no model could take: two scalings, a part twice, parts with no common encoding, or
    attention methods that do not combine (with each other or with the scaling)."""
    parts = name.split("+")
    scalings = [part for part in parts if part in ROPE_SCALINGS]
    if len(scalings) > 1 or len(set(parts)) != len(parts):
        raise ConfigError(f"method {name!r}: give each part once, with at most one RoPE scaling")
    if method_spec(name).encodings == ():
        raise ConfigError(f"method {name!r}: its parts apply to no common encoding")
    attention = [part for part in parts if part in ATTENTION_METHODS]
    scaling = {"rope_type": scalings[0], "factor": 2.0} if scalings else None
    try:
        ModelConfig(rope_scaling=scaling, attention_methods=[{"method": part} for part in attention])
    except ConfigError as error:
        raise ConfigError(f"method {name!r}: {error}") from error


def applies(name: str, encoding: str, layers: list[str] | None = None) -> bool:
    """Whether method `name` applies to a model whose model.position is `encoding` (and whose layers use the
    encodings `layers`, for a hybrid: an attention method is checked against them all)."""
    if layers is not None:
        parts = name.split("+")
        scalings = [part for part in parts if part not in ATTENTION_METHODS]
        if any(refusal(ATTENTION_METHODS[part], sorted(set(layers))) for part in parts if part in ATTENTION_METHODS):
            return False
        return all(applies(part, encoding) for part in scalings)
    encodings = method_spec(name).encodings
    return encodings is None or encoding in encodings


def label(name: str, method: str) -> str:
    """How a (checkpoint, method) row is named in tables: "rope", "rope+yarn", "learned+clamp"."""
    return name if method == NONE else f"{name}+{method}"
