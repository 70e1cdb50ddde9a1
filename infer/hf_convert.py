"""Conversion between our checkpoints and transformers' Llama format (names, q/k layout, config keys).

One mapping serves export, import and the parity tests. Our parameter names follow Llama's one to one:
tok_embeddings -> model.embed_tokens, layers.N.attention.{q,k,v,o}_proj -> model.layers.N.self_attn.*,
layers.N.ffn.{gate,up,down}_proj -> model.layers.N.mlp.*, attention_norm -> input_layernorm,
ffn_norm -> post_attention_layernorm, norm -> model.norm, lm_head -> lm_head.
"""
from __future__ import annotations

from typing import Any

import torch
import transformers

from errors import ConversionError
from model.checkpoint import model_state_dict
from model.config import ModelConfig
from model.methods import ROPE_SCALINGS, scaling_type

RENAMES = [
    ("tok_embeddings.", "model.embed_tokens."),
    ("attention_norm.", "input_layernorm."),
    ("ffn_norm.", "post_attention_layernorm."),
    ("attention.", "self_attn."),
    ("ffn.", "mlp."),
]
# Encodings that Llama cannot express, and why.
NOT_EXPORTABLE = {
    "alibi": "Llama has no attention-bias slopes",
    "t5": "Llama has no learned relative-position bias",
    "shaw": "Llama has no relative key/value embeddings",
    "sinusoidal": "Llama adds no absolute position signal to the embeddings",
    "learned": "Llama has no learned absolute position table",
    "none": "Llama always applies rotary embeddings, so a NoPE model would change meaning",
    "fire": "Llama has no learned functional position bias",
    "kerple": "Llama has no attention-bias kernel",
    "xpos": "Llama's rotary embedding has no exponential decay",
    "cope": "Llama has no contextual position embeddings",
}
# Model settings Llama cannot express, with their Llama value: (setting, value, why).
LLAMA_DEFAULTS = [
    ("position_layers", [], "Llama uses one encoding in every layer"),
    ("attention_window", [], "Llama has no sliding-window attention"),
    ("attention_chunk", [], "Llama has no chunked attention"),
    ("attention_methods", [], "Llama's attention has no inference-time methods (logn, ReRoPE, SelfExtend, ...)"),
    ("random_positions", 0, "Llama's positions are 0, 1, 2, ...; the model was trained and is scored on randomized "
     "ones"),
    ("qk_norm", [], "Llama normalises neither queries nor keys (QK-norm is Qwen 3's, Gemma 3's, OLMo 2's)"),
    ("attention_gate", [], "Llama does not gate its attention output (gated attention is Qwen3-Next's)"),
    ("sink_logits", [], "Llama has no learned attention sinks (gpt-oss has)"),
    ("rope_theta_layers", [], "Llama uses one RoPE theta in every layer (Gemma 3 has one per layer type)"),
    ("rope_scaling_layers", [], "Llama applies its RoPE scaling to every layer"),
    ("attention_methods_layers", [], "Llama's attention has no inference-time methods"),
    ("norm_offset", 0.0, "Llama's RMSNorm gain is its weight, not 1 + weight (Gemma's)"),
    ("sandwich_norms", False, "Llama does not normalise its blocks' outputs (Gemma's sandwich norms)"),
    ("ffn_activation", "silu", "Llama's feed-forward part is SwiGLU (GeGLU is Gemma's)"),
    ("embedding_scale", 1.0, "Llama does not scale its embeddings (Gemma scales by sqrt(dim))"),
    ("attention_scale_dim", 0, "Llama scales its logits by 1/sqrt(head_dim) (Gemma's query_pre_attn_scalar)"),
]
# RoPE's own settings (model.position_args.rope) Llama cannot express, with their Llama value.
LLAMA_ROPE_SETTINGS = [
    ("fraction", 1.0, "LlamaAttention rotates every dimension of a head (partial rotary is GPT-NeoX's)"),
    ("p", 1.0, "Llama has no p-RoPE (dropped frequencies)"),
]
TRANSFORMERS_V5 = int(transformers.__version__.split(".")[0]) >= 5


def half_split_permutation(head_dim: int) -> torch.Tensor:
    """Row order that turns interleaved pairs (2i, 2i+1) into half-split pairs (i, i + d/2)."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def permute_heads(weight: torch.Tensor, head_dim: int, order: torch.Tensor) -> torch.Tensor:
    """Reorder the output rows of a q/k projection inside every head."""
    rows, columns = weight.shape
    return weight.view(rows // head_dim, head_dim, columns)[:, order].reshape(rows, columns)


def to_hf_state_dict(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our state dict (tied head stored once) -> Llama names, q/k rows in half-split order."""
    order = half_split_permutation(config.head_dim) if config.rope_layout == "interleaved" else None
    converted = {}
    for name, tensor in state.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        hf_name = name
        for ours, theirs in RENAMES:
            hf_name = hf_name.replace(ours, theirs)
        if hf_name.startswith("layers.") or hf_name == "norm.weight":
            hf_name = "model." + hf_name
        if order is not None and (name.endswith("q_proj.weight") or name.endswith("k_proj.weight")):
            tensor = permute_heads(tensor, config.head_dim, order)
        converted[hf_name] = tensor.contiguous()
    return converted


def from_hf_state_dict(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Llama names -> ours (half-split layout, the only one transformers writes)."""
    converted = {}
    for hf_name, tensor in state.items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = hf_name
        for ours, theirs in RENAMES:
            name = name.replace(theirs, ours)
        converted[name.removeprefix("model.")] = tensor
    return converted


# Our RoPE scalings transformers has no rope_type for, and which no plain RoPE equals: refused by the export.
NOT_IN_TRANSFORMERS = {"resonance": "transformers has no Resonance RoPE (wavelengths rounded to whole tokens)"}


def rope_parameters(config: ModelConfig) -> dict[str, Any]:
    """Our rope_theta + rope_scaling as transformers' rope parameters (static NTK becomes a larger theta)."""
    scaling = dict(config.rope_scaling or {"rope_type": "default"})
    if scaling["rope_type"] in NOT_IN_TRANSFORMERS:
        raise ConversionError(f"cannot export model.rope_scaling = {config.rope_scaling!r} to Llama: "
                              f"{NOT_IN_TRANSFORMERS[scaling['rope_type']]}")
    theta = config.rope_theta
    if scaling["rope_type"] == "ntk":  # base * s^(d/(d-2)) is plain RoPE with that base
        theta = theta * scaling["factor"] ** (config.head_dim / (config.head_dim - 2))
        scaling = {"rope_type": "default"}
    return {"rope_theta": theta, **scaling}


def to_llama_config(config: ModelConfig, generation: dict[str, Any] | None = None) -> dict[str, Any]:
    """A LlamaConfig dict for `config`, with RoPE keys in the installed transformers' names."""
    if config.position != "rope":
        raise ConversionError(
            f"cannot export position = {config.position!r} to Llama: "
            f"{NOT_EXPORTABLE.get(config.position, 'Llama has no such encoding')}; only rope checkpoints can be exported"
        )
    for setting, llama_value, why in LLAMA_DEFAULTS:
        if getattr(config, setting) != llama_value:
            raise ConversionError(f"cannot export model.{setting} = {getattr(config, setting)!r} to Llama: {why}")
    rope = config.position_args.get("rope", {})
    for setting, llama_value, why in LLAMA_ROPE_SETTINGS:
        if rope.get(setting, llama_value) != llama_value:
            raise ConversionError(f"cannot export model.position_args.rope.{setting} = {rope[setting]!r} to Llama: "
                                  f"{why}")
    params = rope_parameters(config)
    # transformers' dynamic NTK measures growth against max_position_embeddings, i.e. the original length.
    max_positions = params.get("original_max_position_embeddings", config.max_seq_len)
    values: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions if params["rope_type"] == "dynamic" else config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "initializer_range": config.init_std,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        **(generation or {}),
    }
    if TRANSFORMERS_V5:
        values["rope_parameters"] = params
    else:
        values["rope_theta"] = params.pop("rope_theta")
        values["rope_scaling"] = None if params["rope_type"] == "default" else params
    return values


# transformers' Llama reads every scaling of ours except static NTK (which export writes as plain RoPE with the
# enlarged base, and import never sees) and those it has no rope_type for.
SUPPORTED_ROPE = set(ROPE_SCALINGS) - {"ntk"} - set(NOT_IN_TRANSFORMERS)


def from_llama_config(values: dict[str, Any]) -> tuple[ModelConfig, int]:
    """(our ModelConfig, the trained context length) from a Llama config.json, or ConversionError saying why not."""
    if values.get("model_type") != "llama":
        raise ConversionError(f"model_type is {values.get('model_type')!r}; only Llama-architecture models are imported")
    problems = []
    if values.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {values['hidden_act']!r} (only silu)")
    if values.get("attention_bias") or values.get("mlp_bias"):
        problems.append("biases in attention or MLP")
    if (values.get("pretraining_tp") or 1) != 1:
        problems.append("pretraining_tp > 1")
    hidden, heads = values["hidden_size"], values["num_attention_heads"]
    head_dim = values.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        problems.append(f"head_dim {head_dim} x {heads} heads != hidden_size {hidden}")
    raw = dict(values.get("rope_parameters") or values.get("rope_scaling") or {})
    rope_type = scaling_type(raw)
    params = {key: value for key, value in raw.items() if key != "type"} | {"rope_type": rope_type}
    theta = float(params.pop("rope_theta", values.get("rope_theta", 10000.0)))
    if rope_type not in SUPPORTED_ROPE:
        problems.append(f"rope_type {rope_type!r} (supported: {sorted(SUPPORTED_ROPE)})")
    params.pop("partial_rotary_factor", None) if params.get("partial_rotary_factor", 1.0) == 1.0 else problems.append(
        "partial_rotary_factor < 1")
    if problems:
        raise ConversionError("unsupported Llama features: " + "; ".join(problems))
    max_positions = int(values["max_position_embeddings"])
    trained = int(params.get("original_max_position_embeddings", max_positions))
    if rope_type == "dynamic":  # transformers' dynamic NTK uses max_position_embeddings as the original length
        params["original_max_position_embeddings"] = max_positions
        trained = max_positions
    config = ModelConfig(
        vocab_size=values["vocab_size"],
        dim=hidden,
        n_layers=values["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=values.get("num_key_value_heads") or heads,
        ffn_dim=values["intermediate_size"],
        max_seq_len=max_positions,
        norm_eps=float(values.get("rms_norm_eps", 1e-6)),
        init_std=float(values.get("initializer_range", 0.02)),
        tie_word_embeddings=bool(values.get("tie_word_embeddings", False)),
        position="rope",
        rope_theta=theta,
        rope_layout="half",
        rope_scaling=None if rope_type == "default" else params,
    )
    return config, trained


def llama_model_from(model) -> "transformers.LlamaForCausalLM":
    """transformers' LlamaForCausalLM holding `model`'s weights (eval mode): the parity tests' reference and
    the benchmark's baseline."""
    hf_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**to_llama_config(model.config))).eval()
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model_state_dict(model), model.config), strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ConversionError(f"weights do not map onto Llama: missing {missing}, unexpected {unexpected}")
    if model.config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model
