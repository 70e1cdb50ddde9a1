"""Gemma 3's text decoder in pelab's model: its config and weight names mapped onto ours, and the reference model.

Gemma 3 is the Llama decoder with six differences, each a setting of ModelConfig (model/config.py): RMSNorm gains
stored as offsets from 1 (norm_offset = 1), sandwich norms around attention and the feed-forward part
(sandwich_norms), GeGLU with the tanh GELU (ffn_activation = "gelu_tanh"), embeddings scaled by sqrt(dim)
(embedding_scale), a head width of its own (head_width: 256 with dim 640 and 4 heads in the 270M model) with the
query scale query_pre_attn_scalar (attention_scale_dim), QK-norm in every layer; and a layer pattern: five local
layers (sliding window, RoPE theta 10k) for each global one (theta 1M).

A GGUF file holds only part of that (llama.cpp's gemma3 metadata: sizes, the window, the global theta); the rest
is the architecture's (the pattern, the local theta, the query scale), which transformers' Gemma3TextConfig fills
in. The config is read through it, so that pelab and transformers build the same model from the same file.

Where transformers sets a RoPE scaling (rope_parameters.full_attention), it applies it to the global layers only;
the import keeps that convention (model.rope_scaling_layers: the global ones).
"""
from __future__ import annotations

from typing import Any

import torch

from errors import ConversionError
from model.checkpoint import model_state_dict
from model.config import ModelConfig
from model.methods import ROPE_SCALINGS

MODEL_TYPES = ("gemma3_text", "gemma3")
# Our names for Gemma 3's, as transformers names them (model.layers.N.*): applied in order.
RENAMES = [
    ("model.embed_tokens.", "tok_embeddings."),
    ("self_attn.", "attention."),
    ("mlp.", "ffn."),
    ("input_layernorm.", "attention_norm."),
    ("post_attention_layernorm.", "attention_out_norm."),
    ("pre_feedforward_layernorm.", "ffn_norm."),
    ("post_feedforward_layernorm.", "ffn_out_norm."),
]
ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "silu": "silu"}
LAYER_TYPES = ("sliding_attention", "full_attention")


def completed_config(values: dict[str, Any]):
    """transformers' Gemma3TextConfig of `values` (a config.json's or a GGUF file's keys), the architecture's
    defaults filled in: layer_types, each layer type's rope_parameters, query_pre_attn_scalar."""
    from transformers import Gemma3TextConfig

    keys = {key: value for key, value in values.items() if key not in ("model_type", "_model_name_or_path")}
    return Gemma3TextConfig(**keys)


def shortest_period(values: list) -> list:
    """The shortest prefix of `values` that repeats to give all of them (a per-layer list's pattern)."""
    for size in range(1, len(values) + 1):
        if len(values) % size == 0 and values[:size] * (len(values) // size) == values:
            return values[:size]
    return values


def rope_of(parameters: dict[str, Any], what: str) -> tuple[float, dict | None]:
    """(theta, our rope_scaling or None) of one layer type's rope_parameters, or ConversionError."""
    params = dict(parameters)
    theta = float(params.pop("rope_theta"))
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return theta, None
    if rope_type not in ROPE_SCALINGS or rope_type == "ntk":
        raise ConversionError(f"{what} layers use rope_type {rope_type!r}, which pelab does not read from transformers")
    return theta, params


def from_gemma3_config(values: dict[str, Any]) -> tuple[ModelConfig, int]:
    """(our ModelConfig, the trained context length) of a Gemma 3 text config, or ConversionError naming each
    feature pelab cannot express."""
    if values.get("model_type") not in MODEL_TYPES:
        raise ConversionError(f"model_type is {values.get('model_type')!r}, not Gemma 3's text decoder")
    config = completed_config(values)
    problems = []
    if config.final_logit_softcapping is not None or config.attn_logit_softcapping is not None:
        problems.append("logit soft-capping (Gemma 2's; pelab's head and attention do not cap)")
    if config.attention_bias:
        problems.append("biases in attention")
    if getattr(config, "use_bidirectional_attention", False):
        problems.append("bidirectional attention (EmbeddingGemma's)")
    if config.hidden_activation not in ACTIVATIONS:
        problems.append(f"hidden_activation {config.hidden_activation!r} (pelab has {sorted(ACTIVATIONS)})")
    unknown = sorted(set(config.layer_types) - set(LAYER_TYPES))
    if unknown:
        problems.append(f"layer types {unknown} (pelab has {list(LAYER_TYPES)})")
    if problems:
        raise ConversionError("unsupported Gemma 3 features: " + "; ".join(problems))
    local_theta, local_scaling = rope_of(config.rope_parameters["sliding_attention"], "the sliding-window")
    global_theta, scaling = rope_of(config.rope_parameters["full_attention"], "the global")
    if local_scaling is not None and local_scaling != scaling:
        raise ConversionError(f"the sliding-window layers are scaled ({local_scaling}) other than the global ones "
                              f"({scaling}); pelab applies one RoPE scaling, to every layer or to some")
    is_global = [kind == "full_attention" for kind in config.layer_types]
    thetas = [global_theta if full else local_theta for full in is_global]
    model = ModelConfig(
        vocab_size=config.vocab_size, dim=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, ffn_dim=config.intermediate_size,
        max_seq_len=config.max_position_embeddings, norm_eps=float(config.rms_norm_eps),
        init_std=float(config.initializer_range), tie_word_embeddings=bool(config.tie_word_embeddings),
        position="rope", rope_theta=global_theta, rope_layout="half", rope_scaling=scaling,
        rope_theta_layers=shortest_period(thetas),
        # where a scaling applies, now or in a view (with_rope_scaling): the global layers, as transformers has it
        rope_scaling_layers=[] if local_scaling is not None else shortest_period(is_global),
        attention_methods_layers=shortest_period(is_global),  # likewise: an attention method on the global layers
        attention_window=shortest_period([0 if full else int(config.sliding_window) for full in is_global]),
        qk_norm=[True], norm_offset=1.0, sandwich_norms=True, ffn_activation=ACTIVATIONS[config.hidden_activation],
        embedding_scale=float(config.hidden_size) ** 0.5, head_width=int(config.head_dim),
        attention_scale_dim=int(config.query_pre_attn_scalar),
    )
    trained = int((scaling or {}).get("original_max_position_embeddings", config.max_position_embeddings))
    return model, trained


def renamed(state: dict[str, torch.Tensor], config: ModelConfig, pairs: list[tuple[str, str]],
            prefix: str) -> dict[str, torch.Tensor]:
    """`state` with each name's parts replaced by `pairs` in order, then given `prefix` (ours -> theirs: "model.")
    or stripped of it (theirs -> ours: ""); the tied head stored once, as the embedding."""
    converted = {}
    for name, tensor in state.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        for old, new in pairs:
            name = name.replace(old, new)
        if prefix and not name.startswith(prefix) and name != "lm_head.weight":
            name = prefix + name
        converted[name if prefix else name.removeprefix("model.")] = tensor.contiguous() if prefix else tensor
    return converted


def from_gemma3_state_dict(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers' Gemma 3 names -> ours."""
    return renamed(state, config, RENAMES, "")


def to_gemma3_state_dict(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Ours -> transformers' Gemma 3 names: what the parity tests load into Gemma3ForCausalLM."""
    return renamed(state, config, [(ours, theirs) for theirs, ours in reversed(RENAMES)], "model.")


def gemma3_config_of(config: ModelConfig) -> dict[str, Any]:
    """A Gemma3TextConfig dict for a Gemma-shaped ModelConfig (as from_gemma3_config builds one), the layer types
    read from its windows; for the tests, which build transformers' model of one of ours."""
    windows = config.layer_windows
    local = [theta for theta, window in zip(config.layer_rope_thetas, windows) if window]
    return {"vocab_size": config.vocab_size, "hidden_size": config.dim, "intermediate_size": config.ffn_dim,
            "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
            "num_key_value_heads": config.n_kv_heads, "head_dim": config.head_dim,
            "hidden_activation": {"gelu_tanh": "gelu_pytorch_tanh", "silu": "silu"}[config.ffn_activation],
            "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
            "tie_word_embeddings": config.tie_word_embeddings,
            "query_pre_attn_scalar": config.attention_scale_dim or config.head_dim,
            "sliding_window": max(windows) or None,
            "layer_types": ["sliding_attention" if window else "full_attention" for window in windows],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": config.rope_theta,
                                                   **(config.rope_scaling or {})},
                                "sliding_attention": {"rope_type": "default",
                                                      "rope_theta": local[0] if local else config.rope_theta}},
            "attention_dropout": 0.0, "final_logit_softcapping": None, "attn_logit_softcapping": None}


def gemma3_model_from(model) -> Any:
    """transformers' Gemma3ForCausalLM holding `model`'s weights (eval mode, float32): the reference of the tests."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    reference = Gemma3ForCausalLM(Gemma3TextConfig(**gemma3_config_of(model.config))).eval()
    missing, unexpected = reference.load_state_dict(to_gemma3_state_dict(model_state_dict(model), model.config),
                                                    strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ConversionError(f"weights do not map onto Gemma 3: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        reference.tie_weights()
    return reference
