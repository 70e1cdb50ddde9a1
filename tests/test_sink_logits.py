"""Learned attention-sink logits (model.sink_logits; gpt-oss): one logit per head joins every query's softmax as a
key with no value. Checked against transformers' gpt-oss attention with the same weights; every backend that takes
it gives the same logits and gradients; cached decoding equals a full forward; settings it cannot take are refused."""
import pytest
import torch

from errors import ConfigError
from model import KVCache, StaticKVCache, Transformer
from model.attention.registry import choose
from tests.conftest import decode_in_steps, micro_config


def test_the_sinks_match_gpt_oss_attention():
    modeling = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    from transformers import GptOssConfig

    heads, kv_heads, head_dim, dim, time = 4, 2, 16, 64, 20
    reference_config = GptOssConfig(hidden_size=dim, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                    head_dim=head_dim, num_hidden_layers=1, layer_types=["full_attention"],
                                    attention_bias=False, vocab_size=97,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    reference_config._attn_implementation = "eager"
    torch.manual_seed(0)
    reference = modeling.GptOssAttention(reference_config, 0).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0.0, 0.5)
    rotary = modeling.GptOssRotaryEmbedding(reference_config)
    model = Transformer(micro_config(dim=dim, n_heads=heads, n_kv_heads=kv_heads, n_layers=1, sink_logits=[True]))
    ours = model.layers[0].attention.eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(ours, name).weight.copy_(getattr(reference, name).weight)
        ours.sink_logits.copy_(reference.sinks)
        x = torch.randn(2, time, dim)
        positions = torch.arange(time)[None, :]
        causal = torch.full((time, time), float("-inf")).triu(1)[None, None]
        expected = reference(x, rotary(x, positions), attention_mask=causal)[0]
        for preference, taken in (("auto", "sdpa_mask"), ("explicit", "explicit")):
            backend = choose(model.position, ours.workload("evaluate", x.device, x.dtype, preference=preference))
            assert backend.name == taken
            got = ours(x, model.position, model.position.prepare(positions, positions), None, backend=backend)
            assert (got - expected).abs().max() < 1e-5, preference
        ours.sink_logits.zero_()  # sinks at 0 still take mass; removing them differs: the check can fail
        plain = Transformer(micro_config(dim=dim, n_heads=heads, n_kv_heads=kv_heads, n_layers=1)).layers[0].attention
        plain.load_state_dict({k: v for k, v in ours.state_dict().items() if k != "sink_logits"})
        assert (plain(x, model.position, model.position.prepare(positions, positions), None) - expected).abs().max() \
            > 1e-3


@pytest.mark.parametrize("position", ["rope", "alibi", "t5"])
def test_every_backend_gives_the_same_logits_and_gradients(position):
    torch.manual_seed(0)
    model = Transformer(micro_config(position=position, sink_logits=[True, False]))
    with torch.no_grad():
        model.layers[0].attention.sink_logits.normal_(0.0, 2.0)
    idx = torch.randint(0, 97, (2, 24))

    def run(view):
        model.zero_grad()
        logits, loss = view(idx, idx)
        loss.backward()
        return logits.detach(), model.layers[0].attention.sink_logits.grad.clone()

    explicit_logits, explicit_grad = run(model)  # training on the CPU: the explicit steps
    assert list(model.attention_paths().values())[0].startswith("explicit: learned sink logits")
    masked_logits, masked_grad = run(model.with_settings(attention_backend="sdpa_mask"))
    assert (explicit_logits - masked_logits).abs().max() < 1e-5
    assert (explicit_grad - masked_grad).abs().max() < 1e-5 and explicit_grad.abs().max() > 0


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
def test_cached_decoding_equals_a_full_forward(cache_type):
    torch.manual_seed(0)
    model = Transformer(micro_config(sink_logits=[True], attention_window=[8, 0])).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.attention.sink_logits.normal_(0.0, 2.0)
        idx = torch.randint(0, 97, (2, 30))
        full = model(idx)[0]
        steps = decode_in_steps(model, idx, (5,), cache_type.for_model(model.config, 2, 32))
    assert (steps - full).abs().max() < 1e-4


def test_what_it_cannot_take_is_refused_by_name():
    with pytest.raises(ConfigError, match="sink_logits must hold true or false per layer"):
        micro_config(sink_logits=["yes"])
    with pytest.raises(ConfigError, match=r"sink_logits: \['stickbreaking'\] compute weights of their own"):
        micro_config(position="stickbreaking", sink_logits=[True])
    assert micro_config(sink_logits=[False]).sink_logits == []
