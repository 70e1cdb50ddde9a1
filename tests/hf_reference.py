"""transformers' Llama with our weights: the independent reference for logits parity tests.

The name mapping and config keys come from scripts/hf_convert.py (the exporter's own code), so these tests
also check the exporter's mapping against transformers' implementation.
"""
from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

from model import Transformer
from model.checkpoint import model_state_dict
from scripts.hf_convert import to_hf_state_dict, to_llama_config


def llama_from(model: Transformer) -> LlamaForCausalLM:
    """LlamaForCausalLM with `model`'s weights."""
    hf_model = LlamaForCausalLM(LlamaConfig(**to_llama_config(model.config))).eval()
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model_state_dict(model), model.config), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if model.config.tie_word_embeddings:
        hf_model.tie_weights()
    return hf_model
