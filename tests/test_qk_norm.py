"""QK-norm (model.qk_norm): RMSNorm of each head's queries and keys before the position encoding, per layer. Checked
against transformers' Qwen 3, which normalises them the same way (a gain over head_dim, then RoPE); the shared
battery runs its hybrids (tests/test_position.py)."""

import pytest
import torch

from errors import ConfigError
from infer.hf_convert import to_hf_state_dict
from model import Transformer
from model.checkpoint import model_state_dict
from tests.conftest import micro_config


def test_a_qk_norm_model_equals_transformers_qwen3():
    """Our RoPE model with QK-norm in every layer, its weights mapped by the Llama export's names, against
    transformers' Qwen3ForCausalLM (q_norm and k_norm: RMSNorm over head_dim of each head, before RoPE), with gains
    moved off their initial ones."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = micro_config(qk_norm=[True], tie_word_embeddings=False, norm_eps=1e-6)
    model = Transformer(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
                parameter.uniform_(0.5, 2.0)
    hf_config = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=config.ffn_dim, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    theirs = Qwen3ForCausalLM(hf_config).eval()
    missing, unexpected = theirs.load_state_dict(to_hf_state_dict(model_state_dict(model), config), strict=False)
    assert not missing and not unexpected
    idx = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        assert (model(idx)[0] - theirs(idx).logits).abs().max() < 1e-4
        model.layers[0].attention.q_norm.weight.mul_(1.5)  # the gain matters: a different model
        assert (model(idx)[0] - theirs(idx).logits).abs().max() > 1e-3


def test_qk_norm_normalises_each_head_before_the_encoding():
    """The first layer's rotated queries are RoPE(g * q_h / rms(q_h)) for each head h: the norm comes first, so the
    rotation (which keeps the norm) sees unit-rms heads."""
    model = Transformer(micro_config(qk_norm=[True])).eval()
    layer = model.layers[0].attention
    with torch.no_grad():
        layer.q_norm.weight.uniform_(0.5, 2.0)
        x = torch.randn(1, 5, 64)
        q = layer.q_proj(x).view(1, 5, 4, 16).transpose(1, 2)
        normed = q / q.pow(2).mean(-1, keepdim=True).add(model.config.norm_eps).sqrt() * layer.q_norm.weight
        positions = torch.arange(5)[None]
        state = model.position.prepare(positions, positions)
        expected = model.position.encode_queries(normed, state)
        assert torch.allclose(expected.pow(2).mean(-1), (normed.pow(2)).mean(-1), atol=1e-5)  # a rotation
        got = model.position.encode_queries(layer.q_norm(q), state)
    assert torch.allclose(got, expected, atol=1e-6)


def test_qk_norm_is_a_per_layer_pattern():
    model = Transformer(micro_config(n_layers=4, qk_norm=[False, True]))
    assert [layer.attention.q_norm is not None for layer in model.layers] == [False, True, False, True]
    assert "layers.1.attention.k_norm.weight" in dict(model.named_parameters())
    assert micro_config(qk_norm=[False, False]).qk_norm == []  # off: one spelling (the Llama export's)


@pytest.mark.parametrize("value, message", [([1], "true or false per layer"), ([True, False, True],
                                                                             "does not divide model.n_layers")])
def test_bad_qk_norm_settings_are_named(value, message):
    with pytest.raises(ConfigError, match=message):
        micro_config(qk_norm=value)


def test_the_training_forward_with_qk_norm_compiles_into_one_graph():
    torch._dynamo.reset()
    model = Transformer(micro_config(qk_norm=[True, False])).train()
    idx = torch.randint(0, 97, (2, 16))
    assert torch._dynamo.explain(model)(idx, idx).graph_break_count == 0
