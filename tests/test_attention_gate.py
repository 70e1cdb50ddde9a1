"""Gated attention (model.attention_gate; Qiu et al. 2025, "Gated Attention for Large Language Models", the G1 form):
each head's attention output times sigmoid(x W_g), element by element, before the output projection. Checked against
transformers' Qwen3-Next attention (which computes the gate beside the queries) with the same weights, and against
the formula; cached decoding equals a full forward; a layer without the gate is unchanged."""
import pytest
import torch

from errors import ConfigError
from model import KVCache, Transformer
from tests.conftest import decode_in_steps, micro_config


def test_the_gate_matches_qwen3_nexts_attention():
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers import Qwen3NextConfig

    heads, kv_heads, head_dim, dim, time = 4, 2, 16, 64, 20
    reference_config = Qwen3NextConfig(hidden_size=dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                       head_dim=head_dim, partial_rotary_factor=1.0, rope_theta=10000.0,
                                       layer_types=["full_attention"], num_hidden_layers=1, vocab_size=97)
    reference_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    reference = modeling.Qwen3NextAttention(reference_config, layer_idx=0).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0.0, 0.3)
    rotary = modeling.Qwen3NextRotaryEmbedding(reference_config)
    model = Transformer(micro_config(vocab_size=97, dim=dim, n_heads=heads, n_kv_heads=kv_heads, n_layers=1,
                                     qk_norm=[True], attention_gate=[True], norm_eps=reference_config.rms_norm_eps))
    ours = model.layers[0].attention.eval()
    with torch.no_grad():
        both = reference.q_proj.weight.view(heads, 2, head_dim, dim)  # per head: the query rows, then the gate's
        ours.q_proj.weight.copy_(both[:, 0].reshape(heads * head_dim, dim))
        ours.gate_proj.weight.copy_(both[:, 1].reshape(heads * head_dim, dim))
        for name in ("k_proj", "v_proj", "o_proj"):
            getattr(ours, name).weight.copy_(getattr(reference, name).weight)
        ours.q_norm.weight.copy_(1 + reference.q_norm.weight)  # Qwen3-Next's RMSNorm scales by (1 + weight)
        ours.k_norm.weight.copy_(1 + reference.k_norm.weight)
        x = torch.randn(2, time, dim)
        positions = torch.arange(time)[None, :]
        expected = reference(x, rotary(x, positions), attention_mask=None)[0]
        got = ours(x, model.position, model.position.prepare(positions, positions), None)
    assert (got - expected).abs().max() < 1e-5
    with torch.no_grad():  # without the gate the outputs differ: the comparison can fail
        ours.gate_proj = None
        assert (ours(x, model.position, model.position.prepare(positions, positions), None) - expected).abs().max() > 1e-2


def test_the_gate_is_sigmoid_of_the_layers_input_on_each_heads_output():
    torch.manual_seed(0)
    model = Transformer(micro_config(attention_gate=[True])).eval()
    layer = model.layers[0].attention
    x = torch.randn(1, 9, 64)
    positions = torch.arange(9)[None, :]
    state = model.position.prepare(positions, positions)
    with torch.no_grad():
        gated = layer(x, model.position, state, None)
        gate, layer.gate_proj = layer.gate_proj, None
        plain = layer(x, model.position, state, None)
        o_proj, layer.o_proj = layer.o_proj, torch.nn.Identity()
        heads_output = layer(x, model.position, state, None)  # (1, 9, heads * head_dim) before the projection
    expected = o_proj(heads_output * torch.sigmoid(x @ gate.weight.T))
    assert (gated - expected).abs().max() < 1e-6 and (gated - plain).abs().max() > 1e-3


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cached_decoding_equals_a_full_forward_with_the_gate(position):
    torch.manual_seed(0)
    model = Transformer(micro_config(position=position, attention_gate=[True, False])).eval()
    idx = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        full = model(idx)[0]
        steps = decode_in_steps(model, idx, (5,), KVCache.for_model(model.config, 2, 32))
    assert (steps - full).abs().max() < 1e-4
    assert "layers.0.attention.gate_proj.weight" in dict(model.named_parameters())
    assert "layers.1.attention.gate_proj.weight" not in dict(model.named_parameters())


def test_a_gate_list_that_is_not_booleans_is_refused():
    with pytest.raises(ConfigError, match="attention_gate must hold true or false per layer"):
        micro_config(attention_gate=[1])
    assert micro_config(attention_gate=[False]).attention_gate == []  # off everywhere: one spelling
