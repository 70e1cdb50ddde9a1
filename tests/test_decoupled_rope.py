"""decoupled (DeepSeek's decoupled RoPE, MLA's position part: model/encodings/decoupled.py) against transformers'
DeepseekV3Attention; the rotary part alone carries position; settings, checkpoints, and cached decoding on fuzzed
shapes and positions. The shared battery (training, both KV caches, batching, shift invariance, 16x, one compiled
graph, the attention path): tests/test_position.py and tests/test_attention_backends.py."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from errors import ConfigError
from model import KVCache, StaticKVCache, Transformer
from model.checkpoint import load_model, save_checkpoint
from tests.conftest import micro_config
from tests.test_fuzz import fuzz


def deepseek_attention(config, interleave: bool):
    """transformers' DeepseekV3Attention (transformers 5.x, modeling_deepseek_v3.py) with our layer 0's weights: q
    is one projection (q_lora_rank None) whose rows per head are [our q_proj's head, our W_qr's head]; the latent
    is as wide as the model (kv_lora_rank = dim) and kv_a_proj_with_mqa's latent rows are the identity, so k_nope and
    the values are kv_b_proj (rows per head: our k_proj's and v_proj's rows of the KV head it reads) of
    RMSNorm(x) = x for an x of unit rms with the norm's eps set to 0; its rotary rows are our W_kr. With
    `rope_interleave` DeepSeek rotates pairs (2i, 2i + 1) where we rotate (i, i + d_r / 2): W_qr's and W_kr's rows
    are permuted to match (the same model)."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    model = Transformer(config).eval()
    layer, encoding = model.layers[0].attention, model.position
    heads, head_dim, rope_dim, dim = config.n_heads, config.head_dim, encoding.rope_dim, config.dim
    theirs_config = DeepseekV3Config(vocab_size=config.vocab_size, hidden_size=dim, num_attention_heads=heads,
                                     num_key_value_heads=heads, q_lora_rank=None, kv_lora_rank=dim,
                                     qk_nope_head_dim=head_dim, qk_rope_head_dim=rope_dim, v_head_dim=head_dim,
                                     rope_interleave=interleave, num_hidden_layers=1, attention_bias=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta})
    theirs_config._attn_implementation = "eager"
    theirs = DeepseekV3Attention(theirs_config, layer_idx=0).eval()
    order = torch.arange(rope_dim)
    if interleave:  # their row 2i is our row i, their row 2i + 1 our row i + d_r / 2
        order = torch.stack((order[: rope_dim // 2], order[rope_dim // 2 :]), dim=-1).flatten()
    q_nope = layer.q_proj.weight.view(heads, head_dim, dim)
    q_rope = encoding.q_rope_proj["0"].weight.view(heads, rope_dim, dim)[:, order]
    groups = heads // config.n_kv_heads
    k_nope = layer.k_proj.weight.view(config.n_kv_heads, head_dim, dim).repeat_interleave(groups, 0)
    values = layer.v_proj.weight.view(config.n_kv_heads, head_dim, dim).repeat_interleave(groups, 0)
    with torch.no_grad():
        theirs.q_proj.weight.copy_(torch.cat((q_nope, q_rope), dim=1).reshape(-1, dim))
        theirs.kv_a_proj_with_mqa.weight.copy_(torch.cat((torch.eye(dim), encoding.k_rope_proj["0"].weight[order])))
        theirs.kv_b_proj.weight.copy_(torch.cat((k_nope, values), dim=1).reshape(-1, dim))
        theirs.o_proj.weight.copy_(layer.o_proj.weight)
    theirs.kv_a_layernorm.variance_epsilon = 0.0
    return model, theirs, DeepseekV3RotaryEmbedding(theirs_config)


@pytest.mark.parametrize("interleave", [False, True])
def test_one_layer_equals_transformers_deepseek_v3_attention(interleave, monkeypatch):
    """Golden values: transformers' DeepseekV3Attention (modeling_deepseek_v3.py, the reference implementation
    of MLA with decoupled RoPE; eager attention), run here on the same weights (deepseek_attention above) with 4
    query heads on 2 KV heads (theirs repeats them) and positions 5, 8, 11, ...: the logits before the softmax
    (q_nope . k_nope + q_pe . k_pe) * softmax_scale, softmax_scale = 1 / sqrt(head_dim + d_r), captured from their
    attention function, and the layer's output equal ours to 1e-5 in float32."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3

    config = micro_config(position="decoupled", n_layers=1, rope_theta=500.0)
    model, theirs, rotary = deepseek_attention(config, interleave)
    layer, encoding = model.layers[0].attention, model.position
    assert encoding.rope_dim == 8 and math.isclose(theirs.scaling, 1 / math.sqrt(16 + 8))
    time = 11
    x = torch.randn(2, time, config.dim)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))  # unit rms: the layer's input after the block's norm
    positions = torch.arange(time)[None] * 3 + 5
    captured = {}
    their_eager = modeling_deepseek_v3.eager_attention_forward

    def eager(module, query, key, value, attention_mask, scaling, **kwargs):
        captured["logits"] = query @ key.transpose(2, 3) * scaling
        return their_eager(module, query, key, value, attention_mask, scaling, **kwargs)

    monkeypatch.setattr(modeling_deepseek_v3, "eager_attention_forward", eager)
    hidden = torch.full((time, time), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = theirs(x, rotary(x, positions), hidden)
        state = encoding.for_layer(x, encoding.prepare(positions, positions), 0)
        q = layer.q_proj(x).view(2, time, 4, 16).transpose(1, 2)
        k = layer.k_proj(x).view(2, time, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        logits = encoding.encode_queries(q, state) @ encoding.encode_keys(k, state).transpose(-1, -2) \
            * layer.score_scale
        out = layer(x, encoding, encoding.prepare(positions, positions), None)
    below = torch.ones(time, time, dtype=torch.bool).tril()
    logit_difference = (logits - captured["logits"])[..., below].abs().max()
    output_difference = (out - expected).abs().max()
    print(f"decoupled vs DeepseekV3Attention (interleave={interleave}): logits {logit_difference:.2e}, "
          f"output {output_difference:.2e}")
    assert logit_difference < 1e-5 and output_difference < 1e-5
    assert expected.abs().max() > 0.05  # not a vanishing output


def test_the_rotary_part_alone_carries_position():
    """With W_kr zeroed the rotary key is 0 and the model knows no positions: any positions, the same logits. With
    the position-free q and k zeroed the logits depend on the relative position alone: a shift changes nothing, a
    spread does, and one layer's logits over a constant input are a function of i - j (constant along diagonals)."""
    config = micro_config(position="decoupled", n_layers=2)
    idx = torch.randint(0, config.vocab_size, (2, 16))
    shifted, spread = torch.arange(16)[None] + 1000, torch.arange(16)[None] * 2
    model = Transformer(config).eval()
    with torch.no_grad():
        base = model(idx)[0]
        assert (base - model(idx, positions=spread)[0]).abs().max() > 1e-3  # positions do matter
        for projection in model.position.k_rope_proj.values():
            projection.weight.zero_()
        free = model(idx)[0]
        for positions in (shifted, spread, torch.randperm(64)[:16].sort().values[None]):
            assert (free - model(idx, positions=positions)[0]).abs().max() < 1e-5

    model = Transformer(config).eval()
    with torch.no_grad():
        for block in model.layers:
            block.attention.q_proj.weight.zero_()
            block.attention.k_proj.weight.zero_()
        base = model(idx)[0]
        assert (base - model(idx, positions=shifted)[0]).abs().max() < 1e-4
        assert (base - model(idx, positions=spread)[0]).abs().max() > 1e-3
        encoding = model.position
        x = torch.randn(1, 1, config.dim).expand(1, 12, config.dim) * 3
        positions = torch.arange(12)[None] + 7
        state = encoding.for_layer(x, encoding.prepare(positions, positions), 0)
        zero = torch.zeros(1, 4, 12, 16)
        logits = encoding.encode_queries(zero, state) @ encoding.encode_keys(zero, state).transpose(-1, -2)
    assert logits[..., 1:, 0].abs().max() > 1e-4  # the rotary part gives the logits something to vary with
    for offset in range(-11, 12):
        diagonal = logits.diagonal(offset, dim1=-2, dim2=-1)
        assert (diagonal - diagonal[..., :1]).abs().max() < 1e-5, offset


def test_settings_widths_and_refusals():
    model = Transformer(micro_config(position="decoupled"))
    assert model.config.position_args == {"decoupled": {"rope_dim": 8}}  # 0 = head_dim // 2, saved as the number
    wide = Transformer(micro_config(position="decoupled", position_args={"decoupled": {"rope_dim": 4}})).eval()
    encoding = wide.position
    assert encoding.rope_dim == 4 and math.isclose(encoding.query_scale, math.sqrt(16 / 20))
    assert encoding.q_rope_proj["1"].weight.shape == (4 * 4, 64) and encoding.k_rope_proj["1"].weight.shape == (4, 64)
    positions = torch.arange(5)[None]
    state = encoding.for_layer(torch.randn(3, 5, 64), encoding.prepare(positions, positions), 1)
    assert encoding.encode_queries(torch.randn(3, 4, 5, 16), state).shape == (3, 4, 5, 20)
    assert encoding.encode_keys(torch.randn(3, 2, 5, 16), state).shape == (3, 2, 5, 20)
    hybrid = Transformer(micro_config(position="decoupled", position_layers=["none", "decoupled"], n_layers=4))
    assert sorted(hybrid.position.q_rope_proj) == ["1", "3"]  # projections for the layers that use it only
    for args, message in [({"rope_dim": 3}, "rope_dim = 3 gives 3"), ({"rope_dim": -2}, "rope_dim = -2"),
                          ({"width": 2}, "unknown setting")]:
        with pytest.raises(ConfigError, match=message):
            micro_config(position="decoupled", position_args={"decoupled": args})
    with pytest.raises(ConfigError, match=r"rope_dim = 0 gives 3 rotary dimensions \(0: head_dim // 2 = 3\)"):
        micro_config(position="decoupled", dim=48, n_heads=8, n_kv_heads=8)  # head_dim 6
    with pytest.raises(ConfigError, match="model.rope_scaling applies to"):
        micro_config(position="decoupled", rope_scaling={"rope_type": "linear", "factor": 2.0})
    with pytest.raises(ConfigError, match="rope_theta_layers"):
        micro_config(position="decoupled", rope_theta_layers=[1e4, 1e6])


def test_rope_theta_sets_the_rotary_frequencies():
    encoding = Transformer(micro_config(position="decoupled", rope_theta=500.0)).position
    assert torch.allclose(encoding.inv_freq, 500.0 ** -(torch.arange(0, 8, 2) / 8))


def test_a_checkpoint_round_trip_keeps_the_projections_and_the_logits(tmp_path):
    model = Transformer(micro_config(position="decoupled", position_layers=["decoupled", "none"])).eval()
    save_checkpoint(tmp_path / "decoupled", model)
    loaded = load_model(tmp_path / "decoupled").eval()
    assert loaded.config == model.config and loaded.config.position_args == {"decoupled": {"rope_dim": 8}}
    original, restored = model.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys() and "position.k_rope_proj.0.weight" in original
    assert all(torch.equal(original[name], restored[name]) for name in original)
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], loaded(idx)[0])


@fuzz(40)
@given(batch=st.integers(1, 3), prefix=st.integers(1, 9), chunk=st.integers(1, 5), steps=st.integers(1, 4),
       rope_dim=st.sampled_from([2, 4, 8, 16]), kv_heads=st.sampled_from([1, 2, 4]), static=st.booleans(),
       offset=st.integers(0, 5000), stride=st.integers(1, 7), scale=st.floats(0.1, 10.0))
def test_fuzzed_shapes_and_positions_decode_as_the_full_forward(batch, prefix, chunk, steps, rope_dim, kv_heads,
                                                                 static, offset, stride, scale):
    """Random batch sizes, prefix and chunk lengths, rotary widths, KV heads, cache kinds, position offsets and
    strides, and input scales: the logits are finite, and a prefix, a chunk and single steps through the cache equal
    the full forward at the same positions."""
    config = micro_config(position="decoupled", n_kv_heads=kv_heads,
                          position_args={"decoupled": {"rope_dim": rope_dim}})
    model = Transformer(config).eval()
    with torch.no_grad():
        model.tok_embeddings.weight.mul_(scale)
    length = prefix + chunk + steps
    idx = torch.randint(0, config.vocab_size, (batch, length))
    positions = torch.arange(length)[None] * stride + offset
    cache = (StaticKVCache if static else KVCache).for_model(config, batch_size=batch, max_len=length + 2)
    with torch.no_grad():
        full = model(idx, positions=positions)[0]
        assert torch.isfinite(full).all()
        pieces = [model(idx[:, :prefix], positions=positions[:, :prefix], kv_cache=cache)[0],
                  model(idx[:, prefix : prefix + chunk], positions=positions[:, prefix : prefix + chunk],
                        kv_cache=cache)[0]]
        for t in range(prefix + chunk, length):
            pieces.append(model(idx[:, t : t + 1], positions=positions[:, t : t + 1], kv_cache=cache)[0])
    assert (torch.cat(pieces, dim=1) - full).abs().max() < 1e-4 * max(1.0, full.abs().max().item())
