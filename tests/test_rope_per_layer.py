"""Per-layer RoPE (model.rope_theta_layers, model.rope_scaling_layers; Gemma 3: local layers at theta 10k, global
ones at 1M with the scaling on them only): each layer rotates with exactly the tables of a model whose every layer
has its settings; cached decoding equals a full forward; the settings are refused where nothing reads them."""
import pytest
import torch

from errors import ConfigError
from model import KVCache, StaticKVCache, Transformer
from model.config import ModelConfig
from tests.conftest import micro_config

YARN = {"rope_type": "yarn", "factor": 4.0}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}


def layer_tables(model, layer, positions):
    state = model.position.for_layer(None, model.position.prepare(positions, positions), layer)
    return state.q_cos, state.q_sin


@pytest.mark.parametrize("scaling", [None, YARN])
def test_each_layer_has_the_tables_of_a_model_with_its_settings(scaling):
    settings = dict(n_layers=4, rope_theta_layers=[10000.0, 10000.0, 10000.0, 1e6])
    if scaling:
        settings.update(rope_scaling=scaling, rope_scaling_layers=[False, False, False, True])
    model = Transformer(micro_config(**settings))
    positions = torch.arange(40)[None, :]
    local = Transformer(micro_config(n_layers=4, rope_theta=10000.0))
    global_ = Transformer(micro_config(n_layers=4, rope_theta=1e6, rope_scaling=scaling))
    for layer, reference in ((0, local), (2, local), (3, global_)):
        for ours, theirs in zip(layer_tables(model, layer, positions), layer_tables(reference, layer, positions)):
            assert torch.equal(ours, theirs), layer
    assert not torch.equal(layer_tables(model, 0, positions)[0], layer_tables(model, 3, positions)[0])


@pytest.mark.parametrize("cache_type", [KVCache, StaticKVCache])
@pytest.mark.parametrize("scaling", [YARN, DYNAMIC])
def test_each_cached_step_equals_a_full_forward_of_its_prefix(scaling, cache_type):
    """Dynamic NTK's base follows the length, so a step is compared with the forward of its own prefix."""
    if scaling is DYNAMIC and cache_type is StaticKVCache:
        pytest.skip("dynamic NTK re-encodes every cached key: a static cache does not serve it")
    torch.manual_seed(0)
    model = Transformer(micro_config(rope_theta_layers=[10000.0, 1e6], rope_scaling=scaling, max_seq_len=8,
                                     rope_scaling_layers=[False, True])).eval()
    idx = torch.randint(0, 97, (2, 30))
    with torch.no_grad():
        cache = cache_type.for_model(model.config, 2, 32)
        prefill = model(idx[:, :7], kv_cache=cache)[0]
        assert (prefill - model(idx[:, :7])[0]).abs().max() < 1e-4
        for t in range(7, 30):
            step = model(idx[:, t:t + 1], kv_cache=cache)[0][:, -1]
            assert (step - model(idx[:, :t + 1])[0][:, -1]).abs().max() < 1e-4, t


def test_an_attention_methods_passes_take_each_layers_tables():
    torch.manual_seed(0)
    settings = dict(rope_theta_layers=[10000.0, 1e6], attention_methods=[{"method": "rerope"}])
    model = Transformer(micro_config(**settings)).eval()
    idx = torch.randint(0, 97, (1, 80))
    with torch.no_grad():
        merged = model(idx)[0]
        explicit = model.with_settings(attention_backend="explicit")(idx)[0]
        single = Transformer(micro_config(attention_methods=[{"method": "rerope"}]))
        single.load_state_dict(model.state_dict())
        uniform = single.eval()(idx)[0]
    assert (merged - explicit).abs().max() < 1e-4
    assert (merged - uniform).abs().max() > 1e-3  # layer 1's theta matters: the comparison can fail


def test_the_settings_are_refused_where_nothing_reads_them():
    with pytest.raises(ConfigError, match="set RoPE per layer for rope and xpos; this model's RoPE-like encodings are none"):
        micro_config(position="alibi", rope_theta_layers=[1e4, 1e6])
    with pytest.raises(ConfigError, match=r"encodings are \['pope'\]"):
        micro_config(position="pope", rope_theta_layers=[1e4, 1e6])
    with pytest.raises(ConfigError, match="rope_theta_layers must hold positive numbers"):
        micro_config(rope_theta_layers=[0, 1e6])
    with pytest.raises(ConfigError, match="rope_scaling_layers must hold true or false"):
        micro_config(rope_scaling=YARN, rope_scaling_layers=[1, 0])


def test_the_layers_of_a_scaling_may_wait_for_an_inference_time_one():
    """Gemma 3 trains without a scaling and applies one to its global layers only for long inputs: the layers are
    saved with the model (a `default` scaling normalises to none, and the saved config loads again), and a scaling
    an evaluation sets later (model.with_settings, as the inference-time methods do) reaches those layers only."""
    model = Transformer(micro_config(rope_scaling={"rope_type": "default"}, rope_scaling_layers=[False, True])).eval()
    saved = model.config.to_dict()
    assert saved["rope_scaling"] is None and saved["rope_scaling_layers"] == [False, True]
    again = Transformer(ModelConfig.from_dict(saved))
    again.load_state_dict(model.state_dict())
    idx = torch.randint(0, 64, (1, 24))
    scaled = model.with_settings(rope_scaling=YARN)
    everywhere = model.with_settings(rope_scaling=YARN, rope_scaling_layers=[])
    with torch.no_grad():
        assert torch.equal(again(idx)[0], model(idx)[0])
        assert scaled.config.layer_rope_scaled == [False, True]
        assert (scaled(idx)[0] - everywhere(idx)[0]).abs().max() > 1e-4  # layer 0 keeps plain RoPE
