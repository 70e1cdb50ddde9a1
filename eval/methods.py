"""Inference-time methods: what a trained checkpoint may be given at evaluation to reach past its context.

Each method names the encodings it applies to and how it sets the model up for an evaluation length;
`incremental` methods are scored token by token through the KV cache (as generation uses them), the rest with
one forward per window. "none" is the checkpoint as it is (its own scaling, if it was trained with one).

    linear, ntk, yarn, llama3   RoPE frequency scalings with factor = length / the length the frequencies were
                                set for (config.original_length: the trained length, or for a checkpoint extended
                                with a scaling, the length before extension), static: the whole window uses that
                                factor, which is how such a scaling is configured for a length
    dynamic                     dynamic NTK with its own factor (1): the base grows with the current length,
                                so each token is scored under the base of its own prefix (incremental)
    clamp                       a learned table: positions past it reuse its last row
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from errors import ConfigError
from model.config import ModelConfig
from model.rope import LENGTH_DEPENDENT_SCALINGS, NEEDS_ORIGINAL_LENGTH, ROPE_SCALINGS
from model.transformer import Transformer

NONE = "none"


@dataclass(frozen=True)
class InferenceMethod:
    encodings: tuple[str, ...] | None  # None: every encoding
    setup: Callable[[Transformer, dict, int, int], None]  # (model, its own config, length, trained length)
    incremental: bool = False
    summary: str = ""
    shift_probe: bool = False  # also run the position-shift probe under this method (length-independent methods)


def _as_trained(model: Transformer, own: dict, length: int, trained: int) -> None:
    current = model.config.to_dict()
    changes = {key: value for key, value in own.items() if current[key] != value}
    if changes:
        model.reconfigure_position(**changes)


def _rope_scaling(name: str) -> Callable[[Transformer, dict, int, int], None]:
    def setup(model: Transformer, own: dict, length: int, trained: int) -> None:
        original = ModelConfig.from_dict(own).original_length  # the checkpoint's own, not the current setting
        scaling = {"rope_type": name, "factor": max(1.0, length / original)}
        if name in NEEDS_ORIGINAL_LENGTH:
            scaling["original_max_position_embeddings"] = original
        model.reconfigure_position(rope_scaling=scaling)

    return setup


def _dynamic(name: str) -> Callable[[Transformer, dict, int, int], None]:
    def setup(model: Transformer, own: dict, length: int, trained: int) -> None:
        model.reconfigure_position(rope_scaling={"rope_type": name, "factor": 1.0,
                                                 "original_max_position_embeddings": trained})

    return setup


def _clamp(model: Transformer, own: dict, length: int, trained: int) -> None:
    model.reconfigure_position(learned_clamp=True)


def _summary(name: str) -> str:
    return (ROPE_SCALINGS[name].__doc__ or name).split(":")[0].split("(")[0].strip()


# Every RoPE scaling of model.rope's registry is a method: the static ones with factor = length / L, the
# length-dependent one (dynamic NTK) with its own factor, scored incrementally.
METHODS: dict[str, InferenceMethod] = {
    NONE: InferenceMethod(None, _as_trained, summary="the checkpoint as trained", shift_probe=True),
    **{name: InferenceMethod(("rope",), _rope_scaling(name), summary=f"{_summary(name)}, factor = length / L")
       for name in ROPE_SCALINGS if name != "default" and name not in LENGTH_DEPENDENT_SCALINGS},
    **{name: InferenceMethod(("rope",), _dynamic(name), incremental=True,
                             summary=f"{_summary(name)}, factor 1, each token under the base of its own prefix")
       for name in sorted(LENGTH_DEPENDENT_SCALINGS)},
    "clamp": InferenceMethod(("learned",), _clamp, summary="positions past the learned table reuse its last row",
                             shift_probe=True),
}


def check_methods(names: list[str]) -> list[str]:
    unknown = [name for name in names if name not in METHODS]
    if unknown:
        raise ConfigError(f"unknown inference-time method(s) {unknown}; valid names are {sorted(METHODS)}")
    return names


def applies(name: str, encoding: str) -> bool:
    encodings = METHODS[name].encodings
    return encodings is None or encoding in encodings


def label(name: str, method: str) -> str:
    """How a (checkpoint, method) row is named in tables: "rope", "rope+yarn", "learned+clamp"."""
    return name if method == NONE else f"{name}+{method}"
