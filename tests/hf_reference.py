"""transformers' Llama with our weights: the independent reference for logits parity tests."""
from __future__ import annotations

from model import Transformer


def hf_rope_parameters(config) -> dict:
    """Our ModelConfig's RoPE settings as transformers' `rope_parameters` (the same key names)."""
    params = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling:
        params.update(config.rope_scaling)
        params["rope_theta"] = config.rope_theta
    if params["rope_type"] == "llama3":  # transformers requires these two; ours default to Llama 3's 1 and 4
        params.setdefault("low_freq_factor", 1.0)
        params.setdefault("high_freq_factor", 4.0)
    return params


def llama_from(model: Transformer):
    """LlamaForCausalLM with `model`'s weights (parameter names map one to one; half-split layout only)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = model.config
    assert config.position == "rope" and config.rope_layout == "half"
    params = hf_rope_parameters(config)
    # transformers' dynamic NTK measures growth against max_position_embeddings: the original length.
    max_positions = params.get("original_max_position_embeddings", config.max_seq_len)
    hf_config = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.dim,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=config.norm_eps,
        rope_parameters=params,
        tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
    )
    hf_model = LlamaForCausalLM(hf_config).eval()
    renames = {
        "tok_embeddings": "model.embed_tokens",
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attention.": "self_attn.",
        "ffn.": "mlp.",
    }
    state = {}
    for name, tensor in model.state_dict().items():
        hf_name = name
        for ours, theirs in renames.items():
            hf_name = hf_name.replace(ours, theirs)
        if hf_name.startswith("layers.") or hf_name == "norm.weight":
            hf_name = "model." + hf_name
        state[hf_name] = tensor
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf_model
