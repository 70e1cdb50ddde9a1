"""The position designs of 2025's open models as model settings, scaled to a comparison's shape.

A recipe is written at its model's scale (the context L_model it was pretrained at, its head width, its layer
pattern) and scaled to the lab's shape by one rule (docs/encodings.md#recipes):
  - a window or chunk keeps its fraction of the context: span * L / L_model, at least MIN_SPAN tokens;
  - each RoPE base keeps the ratio of its longest wavelength to the context: 2 pi theta^((d - 2) / d) / L is the
    same for the lab's head width d and L as for the model's;
  - a layer pattern is applied by its rule ("every 4th layer is NoPE", "5 local layers per global one"), layer by
    layer over the lab's depth, so a depth that the pattern does not divide keeps the rule, not the ratio.
What a model applies at inference (YaRN, DCA, a scaling on some layers, Llama 4's temperature) is not part of its
weights: it is an inference-time method the comparison lists (compare.methods), and `INFERENCE` names it.

A variant in compare.variants names a recipe with `recipe = "gemma3"`; it expands here, for the [model] shape of
the comparison, into the settings that define it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from errors import ConfigError
from model.config import ModelConfig

MIN_SPAN = 8  # the narrowest window or chunk a scaled recipe keeps: a local layer sees a phrase


@dataclass(frozen=True)
class Shape:
    """What a recipe is scaled to: the trained context, the depth and the head width."""

    context: int
    n_layers: int
    head_dim: int

    @classmethod
    def of(cls, model: dict | None) -> "Shape":
        defaults = ModelConfig()
        model = model or {}
        dim = model.get("dim", defaults.dim)
        heads = model.get("n_heads", defaults.n_heads)
        return cls(model.get("max_seq_len", defaults.max_seq_len), model.get("n_layers", defaults.n_layers),
                   model.get("head_dim", 0) or dim // heads)


def longest_wavelength(theta: float, head_dim: int) -> float:
    """The longest RoPE wavelength in tokens: pair d/2 - 1 turns by theta^(-(d - 2)/d) per token."""
    return 2 * math.pi * theta ** ((head_dim - 2) / head_dim)


def scaled_theta(theta: float, head_dim: int, context: int, shape: Shape, rotated: int = 0) -> float:
    """The base whose longest wavelength stands to the lab's context as `theta`'s does to the model's `context` at
    the model's `head_dim`; `rotated`: the lab's rotated width when it is not the head width (MLA's rotary part)."""
    width = rotated or shape.head_dim
    ratio = longest_wavelength(theta, head_dim) / context
    return round((ratio * shape.context / (2 * math.pi)) ** (width / (width - 2)), 1)


def scaled_span(tokens: int, context: int, shape: Shape) -> int:
    """A window or chunk of `tokens` in a model pretrained at `context`, at the lab's context (MIN_SPAN at least,
    the lab's context at most)."""
    return min(shape.context, max(MIN_SPAN, round(tokens * shape.context / context)))


def every(n: int, shape: Shape) -> list[bool]:
    """True for every n-th layer (layers n-1, 2n-1, ...), as transformers' no_rope_layer_interval and Gemma 3's
    sliding_window_pattern count them."""
    return [(layer + 1) % n == 0 for layer in range(shape.n_layers)]


def llama4(shape: Shape) -> dict:
    """Llama 4 (Scout/Maverick configs; transformers' Llama4TextConfig): iRoPE, every 4th layer NoPE and global,
    with its query temperature at inference; the RoPE layers chunked (8,192 tokens), with QK-norm, theta 500k,
    head width 128, RoPE context 8,192 (the original_max_position_embeddings of Scout's scaling)."""
    nope = every(4, shape)
    chunk = scaled_span(8192, 8192, shape)
    return {"position": "rope", "position_layers": ["none" if n else "rope" for n in nope],
            "attention_chunk": [0 if n else chunk for n in nope], "qk_norm": [not n for n in nope],
            "rope_theta": scaled_theta(500000.0, 128, 8192, shape)}


def gemma3(shape: Shape) -> dict:
    """Gemma 3 (arXiv 2503.19786; the 27B config): 5 local layers (sliding window 1,024, theta 10k) per global one
    (theta 1M), QK-norm everywhere, head width 128, pretrained at 32,768; its long-context scaling (linear, factor 8)
    acts on the global layers only, so the variant marks them (model.rope_scaling_layers) for the scaling methods."""
    if shape.n_layers < 6:
        raise ConfigError(f"recipe gemma3 needs 6 layers or more for its 5 local : 1 global pattern; the model has "
                          f"{shape.n_layers} (set model.n_layers)")
    glob = every(6, shape)
    window = scaled_span(1024, 32768, shape)
    local, far = scaled_theta(10000.0, 128, 32768, shape), scaled_theta(1e6, 128, 32768, shape)
    return {"position": "rope", "attention_window": [0 if g else window for g in glob],
            "rope_theta_layers": [far if g else local for g in glob], "rope_scaling_layers": glob, "qk_norm": [True]}


def qwen3(shape: Shape) -> dict:
    """Qwen3 (arXiv 2505.09388): RoPE theta 1M at 32,768 (after ABF), head width 128, QK-norm everywhere; YaRN at
    inference (factor 4 from 32,768), DCA for longer inputs."""
    return {"position": "rope", "rope_theta": scaled_theta(1e6, 128, 32768, shape), "qk_norm": [True]}


def smollm3(shape: Shape) -> dict:
    """SmolLM3 (HuggingFaceTB/SmolLM3-3B's config and blog): NoPE in every 4th layer, RoPE theta 5M at 65,536
    (its last long-context stage), head width 128; YaRN (factor 2) at inference."""
    nope = every(4, shape)
    return {"position": "rope", "position_layers": ["none" if n else "rope" for n in nope],
            "rope_theta": scaled_theta(5e6, 128, 65536, shape)}


def gptoss(shape: Shape) -> dict:
    """gpt-oss (openai/gpt-oss-20b's config; transformers' GptOssConfig): layers alternate a 128-token banded
    window and full attention, the window first; learned sink logits in every layer; RoPE theta 150k, head width 64,
    context 4,096 before its YaRN (factor 32)."""
    full = every(2, shape)
    window = scaled_span(128, 4096, shape)
    return {"position": "rope", "attention_window": [0 if f else window for f in full], "sink_logits": [True],
            "rope_theta": scaled_theta(150000.0, 64, 4096, shape)}


def mla(shape: Shape) -> dict:
    """DeepSeek-V3 (arXiv 2412.19437; MLA from DeepSeek-V2, arXiv 2405.04434): decoupled RoPE, a rotary part of 64
    dimensions per query and one rotary key shared by the heads, beside 128 dimensions without position (the lab
    keeps that ratio: the rotary part is half the head width); theta 10k on the rotary part, pretrained at 4,096."""
    rotated = shape.head_dim // 2
    return {"position": "decoupled", "position_args": {"decoupled": {"rope_dim": rotated}},
            "rope_theta": scaled_theta(10000.0, 64, 4096, shape, rotated=rotated)}


def gated(shape: Shape) -> dict:
    """Gated attention (Qiu et al., NeurIPS 2025, arXiv 2505.06708; Qwen3-Next): RoPE, and a sigmoid gate from the
    layer input on every head's attention output, element by element, in every layer; the paper trains it with
    plain RoPE, so the lab's RoPE settings stay."""
    return {"position": "rope", "attention_gate": [True]}


RECIPES: dict[str, Callable[[Shape], dict]] = {
    "llama4": llama4, "gemma3": gemma3, "qwen3": qwen3, "smollm3": smollm3, "gptoss": gptoss, "mla": mla,
    "gated": gated,
}

# What each model applies at inference, as the lab's inference-time methods (model/methods/); the
# comparison scores every model under each of compare.methods that applies, and these are the recipes' own.
INFERENCE: dict[str, tuple[str, ...]] = {
    "llama4": ("temperature",), "gemma3": ("linear",), "qwen3": ("yarn", "dca"), "smollm3": ("yarn",),
    "gptoss": ("yarn",), "mla": (), "gated": (),
}


def expand(variant: dict, model: dict | None) -> dict:
    """A variant's model settings: `variant` itself, or, for {recipe = NAME, ...}, the recipe scaled to the [model]
    shape `model`, with the variant's other keys over it."""
    if "recipe" not in variant:
        return variant
    rest = {key: value for key, value in variant.items() if key != "recipe"}
    name = variant["recipe"]
    if name not in RECIPES:
        raise ConfigError(f"recipe {name!r} is not one of {sorted(RECIPES)}")
    return {**RECIPES[name](Shape.of(model)), **rest}
